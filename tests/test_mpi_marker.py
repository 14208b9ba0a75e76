"""Every test that starts an MPI job is marked `mpi`, so that the quick
command (`pytest -m "not mpi"`, CONTRIBUTING.md) starts none: tests/conftest.py
fails an unmarked test at the moment it would start a launcher. These tests
check that rule without starting a job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import starts_mpi_job
from mpi_launch import mpirun_path

KMP_LAUNCH = str(Path(sys.executable).parent / "kmp-launch")


def test_what_counts_as_starting_a_job(tmp_path):
    mpirun = mpirun_path()
    assert starts_mpi_job([mpirun, "-np", "2", "python", "x.py"]) == "mpirun"
    assert starts_mpi_job(["mpirun", "-np", "2", "python", "x.py"]) == "mpirun"
    assert starts_mpi_job(f"{mpirun} -np 2 python x.py") == "mpirun"
    # Through the launch wrapper, as a user runs it.
    assert starts_mpi_job([sys.executable, KMP_LAUNCH, "mpirun", "-np", "2"]) == (
        "mpirun"
    )
    # Asking the launcher its version starts nothing.
    assert starts_mpi_job([mpirun, "--version"]) is None
    # A stand-in script named like a launcher (tests of the wrapper) is not one.
    stand_in = tmp_path / "mpirun"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    assert starts_mpi_job([str(stand_in), "-np", "2", "python", "x.py"]) is None
    assert starts_mpi_job([sys.executable, "-c", "print('mpirun')"]) is None


def test_an_unmarked_test_that_starts_mpirun_fails_before_it_starts(tmp_path):
    """This test is not marked `mpi`: its launch is refused (no process is
    started) with a message naming the test and the fix."""
    started = tmp_path / "started"
    with pytest.raises(pytest.fail.Exception) as failed:
        subprocess.run(
            [mpirun_path(), "-np", "1", "touch", str(started)],
            capture_output=True,
            timeout=60,
        )
    message = str(failed.value)
    assert "test_an_unmarked_test_that_starts_mpirun_fails_before_it_starts" in message
    assert "not marked @pytest.mark.mpi" in message
    assert not started.exists()
    # The wrapper's form too.
    with pytest.raises(pytest.fail.Exception):
        subprocess.run(
            [sys.executable, KMP_LAUNCH, "mpirun", "-np", "1", "true"], timeout=60
        )


def test_quick_run_names_existing_np2_jobs():
    """`pytest -m quick` (CONTRIBUTING.md): every job it names exists, is
    marked `mpi` and runs at two ranks, and no other job is in it."""
    from conftest import QUICK_JOBS, QUICK_LEAVES_OUT

    root = Path(__file__).resolve().parent.parent
    for name in QUICK_LEAVES_OUT:
        assert (root / name).is_file(), name
    files = sorted({job.split("::", 1)[0] for job in QUICK_JOBS})
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p"]
        + ["no:cacheprovider", "-m", "quick and mpi", *files],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line for line in out.stdout.splitlines() if "::" in line}
    assert collected == set(QUICK_JOBS), collected ^ set(QUICK_JOBS)
    assert all("[3]" not in job for job in QUICK_JOBS)
