"""Step-level `BackupAndRestore(save_freq=K)` under mpirun: backups written
in the background on rank 0, whole at every moment, and a resume from one
that ends bitwise identical to an uninterrupted run
(tests/mpi_scripts/step_backup.py)."""

from __future__ import annotations

import json

import pytest
from mpi_launch import ok, run_job, run_mpi, wrapped_job_command

pytestmark = pytest.mark.mpi


def test_step_backups_are_whole_and_a_kill_mid_write_resumes_exactly(tmp_path):
    """np=2, save_freq=5, 3 epochs of 20 steps, shuffle=False.

    Uninterrupted: the last backup (epoch 3, step 20) holds exactly the final
    model and optimizer state, every dataset of Keras's own file, no
    staging directory left. Killed: rank 0's write of the step-10 backup of
    epoch 2 blocks; training goes on (steps 11-13 run while it is in
    flight); rank 0 is SIGKILLed mid-write, once the writer is known to be
    blocked there. The backup left is the previous one (epoch 2, step 5),
    complete; the relaunch resumes there and ends with the uninterrupted
    run's weights, optimizer state and history, bit for bit.

    The script synchronises on the library's own events, not on time: up to
    the blocked backup, each step a backup falls due at starts only once the
    previous backup's write thread has ended (so none is deferred), and the
    kill waits until the blocked writer has reached its block."""
    (tmp_path / "full").mkdir()
    full = ok(run_mpi(2, "step_backup.py", str(tmp_path / "full"), "full", timeout=300))
    want = full[0]
    assert len({r["digest"] for r in full}) == 1
    backup = want["backup"]
    assert backup["same_names"] and backup["equal"] and backup["datasets"] > 10, backup
    meta = backup["metadata"]
    # The last backup of epoch 3 (step 20, or a few steps earlier when a
    # due backup was taken late because a write was still running).
    assert meta["epoch"] == 2 and 15 <= meta["keras_mpfp16"]["steps_done"] <= 20
    assert backup["files"] == ["backup", "ref"], backup["files"]  # no staging

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    killed = run_mpi(2, "step_backup.py", str(run_dir), "killed", timeout=300)
    assert killed.returncode != 0, killed.describe()
    notes = [r for r in killed.records() if r.get("killing")]
    assert len(notes) == 1, killed.describe()
    # The blocked backup is the one due at step 10 (none deferred), and
    # steps 11-13 ran while it was being written.
    blocked = notes[0]["blocked_at"]
    assert blocked == [1, 9] and notes[0]["steps"] == [10, 11, 12], notes
    # The kill came mid-write: the staging directory is there, unfinished;
    # the backup is the previous one, whole.
    staged = run_dir / "backup.kmp-new"
    assert (staged / "latest.weights.h5").exists(), sorted(run_dir.iterdir())
    assert not (staged / "training_metadata.json").exists()
    left = json.loads((run_dir / "backup" / "training_metadata.json").read_text())
    at = left["keras_mpfp16"]
    assert at["epoch"] == 1 and at["steps_done"] == 5, left

    resumed = ok(run_mpi(2, "step_backup.py", str(run_dir), "resume", timeout=300))
    assert len(resumed) == 2
    for r in resumed:
        assert r["epochs_run"] == [1, 2], r
        assert r["first_step"] == at["steps_done"], r  # the step, not 0
        assert r["digest"] == want["digest"], (r["digest"], want["digest"])
        assert r["iterations"] == want["iterations"]
        for key, values in r["history"].items():
            assert values == want["history"][key][1:], key
    assert not (run_dir / "backup").exists()  # a finished fit deletes it
    assert not staged.exists()  # the interrupted write was cleaned up


def test_sigkilled_rank_restarts_at_the_same_size_and_ends_identically(tmp_path):
    """np=3 under `python -m keras_mpfp16.runtime.launch --max-restarts 1`:
    the last rank SIGKILLed at epoch 2 step 13 (after the step-10 backup);
    the wrapper logs one restart and runs the job again at the same size;
    it resumes at epoch 2 step 10 and ends with the uninterrupted np=3
    run's weights, optimizer state and history, bit for bit; exit 0."""
    (tmp_path / "full").mkdir()
    full = ok(run_mpi(3, "step_backup.py", str(tmp_path / "full"), "full", timeout=400))
    want = full[0]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cmd = wrapped_job_command(
        3,
        "step_backup.py",
        str(run_dir),
        "sigkill",
        wrapper_args=("--max-restarts", "1"),
    )
    result = run_job(cmd, timeout=700)
    assert result.returncode == 0, result.describe()
    assert (run_dir / "killed").exists()
    restarts = [
        line
        for line in result.stderr.splitlines()
        if "keras_mpfp16.runtime.launch: restart" in line
    ]
    assert len(restarts) == 1, result.describe()
    assert "restart 1 of 1" in restarts[0] and "size: 3" in restarts[0], restarts
    assert "killed by a signal" in restarts[0], restarts
    # The user's own BackupAndRestore is named as such, not as a preemption's.
    resumed = [ln for ln in result.stderr.splitlines() if "RESUMING" in ln]
    assert len(resumed) == 1, result.describe()
    assert "RESUMING from the backup in" in resumed[0], resumed
    recs = result.records()
    assert len(recs) == 3, result.describe()
    for r in recs:
        assert r["epochs_run"] == [1, 2], r
        assert r["first_step"] == recs[0]["first_step"], r
        # The step-10 backup or a later one of epoch 2 (a due backup is taken
        # late while a write runs; the kill comes when one is on disk).
        assert 10 <= r["first_step"] < 20, r
        assert r["digest"] == want["digest"], (r["digest"], want["digest"])
        assert r["iterations"] == want["iterations"]
        for key, values in r["history"].items():
            assert values == want["history"][key][1:], key
