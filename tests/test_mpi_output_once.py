"""Keras's output once under mpirun, whatever the script does (issue 28, item 2).

`keras.backend.clear_session()` resets Keras's global state, the
interactive-logging flag included, and used to turn Keras's output (model
summaries, progress and epoch lines) back on for every rank until the next
distributed `fit`; KerasTuner calls it before every trial, so summaries
printed on every rank. A script's own `enable_interactive_logging()` did
the same. Real `mpirun -np 2` / `-np 3`; the job is
tests/mpi_scripts/output_once.py.
"""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi

STEPS = ("first", "after_clear_session", "after_enable", "last")


@pytest.mark.parametrize("np_,all_ranks", [(2, False), (3, False), (2, True)])
def test_keras_output_once_after_clear_session_and_user_calls(np_, all_ranks):
    env = {"KERAS_MPFP16_ALL_RANKS_OUTPUT": "1"} if all_ranks else {}
    result = run_mpi(np_, "output_once.py", env=env, timeout=300)
    assert result.returncode == 0, result.describe()
    out = result.stdout
    # The markers are the user's own print: on every rank.
    for step in ("start", *STEPS):
        assert out.count(f"MARK {step} rank") == np_, (step, result.describe())
    # Keras's output: each step's summary and epoch lines once, from rank 0
    # (from every rank with KERAS_MPFP16_ALL_RANKS_OUTPUT=1, which shows the
    # test sees the difference).
    times = np_ if all_ranks else 1
    for text in ("Total params", "Epoch 1/2", "Epoch 2/2"):
        assert out.count(text) == len(STEPS) * times, (text, result.describe())
    # Where each step's output went (rank 0's, before the step's markers).
    if not all_ranks:
        rest = out
        for step in STEPS:
            head, _, rest = rest.partition(f"MARK {step} rank")
            assert head.count("Total params") == 1, (step, head)
