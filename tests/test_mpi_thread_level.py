"""Below MPI_THREAD_MULTIPLE (mpi4py's rc.thread_level lowered to
"serialized"), at np=2: the job says once, loudly, that the stall
inspector, the heartbeats and the evaluate rendezvous are off and how to
get the level back; a silent (lost) rank is then never detected, and
`evaluate` on every rank is not split (tests/mpi_scripts/thread_level.py)."""

from __future__ import annotations

import time

import pytest
from mpi_launch import kill_job, mpi_job_command, run_mpi, start_job

pytestmark = pytest.mark.mpi

WARNING = "keras_mpfp16 WARNING: the stall inspector and network heartbeats are OFF"


def _says_so_once(stderr: str) -> None:
    assert stderr.count(WARNING) == 1, stderr[-3000:]
    assert "MPI_THREAD_SERIALIZED on ranks [0, 1]" in stderr
    assert "a lost node or rank is never detected" in stderr
    assert "`evaluate` called on every rank is not split" in stderr
    assert "MPICH_MAX_THREAD_SAFETY=multiple" in stderr
    assert "MPI4PY_RC_THREAD_LEVEL" in stderr


def test_a_silent_rank_is_not_detected_below_multiple(tmp_path):
    """Rank 1 freezes (SIGSTOP) with a 2-s heartbeat timeout and a 3-s stall
    abort: at MULTIPLE either ends the job within seconds
    (tests/test_mpi_faults.py); here the job is still running 20 s later."""
    cmd = mpi_job_command(2, "thread_level.py", "stop")
    env = {"KERAS_MPFP16_HEARTBEAT_TIMEOUT": "2", "KERAS_MPFP16_STALL_ABORT": "3"}
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = start_job(cmd, env, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while out_path.read_text().count("STEPS DONE") < 2:
            assert proc.poll() is None, err_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the steps never ran"
            time.sleep(0.2)
        time.sleep(20)
        still_running = proc.poll() is None
    finally:
        if proc.poll() is None:
            kill_job(proc)
    assert still_running, err_path.read_text()[-3000:]
    assert "FINISHED rank" not in out_path.read_text()
    _says_so_once(err_path.read_text())


def test_evaluate_on_every_rank_is_not_split_below_multiple():
    result = run_mpi(2, "thread_level.py", "evaluate", timeout=300)
    assert result.returncode == 0, result.describe()
    _says_so_once(result.stderr)
    recs = result.records()
    assert len(recs) == 2, result.describe()
    for r in recs:
        # Each rank's result is its own half's, not the whole data's.
        assert abs(r["got"] - r["own"]) <= 1e-6 * abs(r["own"]), r
        assert abs(r["got"] - r["whole"]) > 1e-4 * abs(r["whole"]), r
    assert recs[0]["got"] != recs[1]["got"]


def test_the_communication_thread_falls_back_to_the_synchronous_path():
    """KERAS_MPFP16_OVERLAP=1 below MULTIPLE: no communication thread (it
    would call MPI while the step's thread may), the buckets reduced on the
    step's thread, and rank 0 says why once."""
    result = run_mpi(
        2, "thread_level.py", "overlap", timeout=300, env={"KERAS_MPFP16_OVERLAP": "1"}
    )
    assert result.returncode == 0, result.describe()
    recs = result.records()
    assert len(recs) == 2, result.describe()
    assert not any(r["thread"] for r in recs), recs
    assert recs[0]["digest"] == recs[1]["digest"]
    assert result.stderr.count("KERAS_MPFP16_OVERLAP=1 needs MPI_THREAD_MULTIPLE") == 1
