"""What ranks other than 0 print, and the knobs (issue 19, item 8).

Keras's own output is silenced there by default; the user's `print` is
not. `kmp.print_once` prints on rank 0 only; `KERAS_MPFP16_ROOT_STDOUT_ONLY=1`
(from import) or `kmp.root_stdout_only()` (from the call on) silences all
stdout of ranks other than 0, Python's and C's, and leaves stderr alone.
Real `mpirun -np 2` / `-np 3`; the job is tests/mpi_scripts/rank_output.py.
"""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi


def lines(text, prefix):
    return sorted(line for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize(
    "np_,mode", [(2, "default"), (2, "env"), (3, "env"), (3, "call")]
)
def test_stdout_of_other_ranks(np_, mode):
    env = {"KERAS_MPFP16_ROOT_STDOUT_ONLY": "1"} if mode == "env" else {}
    result = run_mpi(np_, "rank_output.py", mode, env=env, timeout=180)
    assert result.returncode == 0, result.describe()
    out, err = result.stdout, result.stderr
    ranks = range(np_)
    # print_once: one line, from rank 0, whatever the mode.
    assert lines(out, "ONCE") == ["ONCE from rank 0"], result.describe()
    # stderr is never silenced.
    assert lines(err, "AFTER stderr") == [f"AFTER stderr rank {r}" for r in ranks]
    before = [f"BEFORE print rank {r}" for r in (ranks if mode != "env" else [0])]
    assert lines(out, "BEFORE") == before, result.describe()
    everyone = ranks if mode == "default" else [0]
    for kind in ("print", "fd1", "subprocess"):
        want = [f"AFTER {kind} rank {r}" for r in everyone]
        assert lines(out, f"AFTER {kind}") == want, (kind, result.describe())
