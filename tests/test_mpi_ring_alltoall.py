"""`runtime/mpi/ring.py: alltoall` — the 16-bit wire's first phase without
exchanges — on real `mpirun` jobs at 3, 4 and 6 ranks (the three forms of
the schedule: odd, 0 mod 4 with half blocks, 2 mod 4), and its schedule
checked for every size from 3 to 64 without MPI."""

from collections import Counter

import pytest
from mpi_launch import run_mpi

from keras_mpfp16.runtime.mpi import ring


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3, 4, 6])
def test_alltoall_moves_mpis_bytes(np_):
    result = run_mpi(np_, "ring_alltoall.py", timeout=120)
    assert result.returncode == 0, result.describe()
    recs = result.records()
    assert sorted(r["rank"] for r in recs) == list(range(np_))
    for r in recs:
        for block in (1, 1001, 4096):
            assert r[f"equal_{block}"], (block, r)
            assert r[f"default_alltoall_{block}"] == 1, r
            if np_ >= 3:  # its own block, then one Sendrecv per step
                assert r[f"sendrecv_{block}"] == 1 + r["steps"], r
                assert r[f"alltoall_{block}"] == 0, r
            else:  # 2 ranks: one exchange, MPI's
                assert r[f"sendrecv_{block}"] == 0 and r[f"alltoall_{block}"] == 1


def test_alltoall_without_mpi_needs_three_ranks():
    with pytest.raises(ValueError, match="3 or more ranks; received 2"):
        ring.alltoall_schedule(2)


@pytest.mark.parametrize("n", range(3, 65))
def test_schedule_serves_every_pair_once_and_never_exchanges(n):
    steps = ring.alltoall_schedule(n)
    served = Counter()
    for step in steps:
        dest = [d for d, _ in step]
        assert sorted(dest) == list(range(n)), "each step is a permutation"
        for r, (d, part) in enumerate(step):
            assert d != r and dest[d] != r, (n, r, d)  # no exchange
            served[r, d, part] += 1
    for a in range(n):
        for b in set(range(n)) - {a}:
            whole = served[a, b, ring.WHOLE]
            halves = (served[a, b, ring.FIRST_HALF], served[a, b, ring.SECOND_HALF])
            assert (whole, halves) in ((1, (0, 0)), (0, (1, 1))), (n, a, b)
    # n - 1 steps' worth of bytes: each half step moves half a block.
    halves = sum(any(p != ring.WHOLE for _, p in s) for s in steps)
    assert len(steps) - halves / 2 == n - 1
