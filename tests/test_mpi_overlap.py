"""The communication thread (KERAS_MPFP16_OVERLAP) on real `mpirun -np 2`
and `-np 3` jobs (tests/mpi_scripts/overlap_fit.py)."""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "np_, wire", [(2, "float32"), (2, "float16"), (3, "bfloat16"), (3, "float32")]
)
def test_overlapped_buckets_give_the_synchronous_bits_on_every_rank(
    np_, wire, tmp_path
):
    result = run_mpi(np_, "overlap_fit.py", "same", wire, str(tmp_path), timeout=500)
    assert result.returncode == 0, result.describe()
    recs = sorted(result.records(), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == list(range(np_))
    for r in recs:
        # Bitwise the synchronous path's weights, and the same loss scale
        # (the finite flags agreed with the synchronous ones at every step).
        assert r["overlap"] == r["sync"], r
        assert r["loss_scale"] == r["sync_loss_scale"] > 2.0**8, r
        # The thread ran every bucket of every step, in bucket order.
        executed = [tuple(k) for k in r["executed"]]
        total = executed[0][1]
        assert total >= 3
        assert executed == [(b, total) for _ in range(12) for b in range(1, total + 1)]
        # The timeline's report measured the hidden share per epoch.
        for e in r["report"]["epochs"]:
            assert e["hidden"] is not None and 0.0 <= e["hidden"] <= 1.0, e
    # Every rank has the same weights.
    assert len({r["overlap"] for r in recs}) == 1
    # The trace has the backward-pass span the hidden share is measured against.
    trace = (tmp_path / "trace.json").read_text()
    assert "until the last bucket is handed over" in trace


@pytest.mark.parametrize("np_, wire", [(2, "float32"), (3, "float16")])
def test_a_failure_on_the_communication_thread_ends_the_job(np_, wire):
    result = run_mpi(np_, "overlap_fit.py", "fail", wire, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0, result.describe()
    assert "injected failure on the communication thread" in out, result.describe()
    assert "failed on the communication thread" in out
    assert '"finished": true' not in out
