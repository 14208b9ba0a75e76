"""The test launcher itself: each mpirun gets a TMPDIR no earlier job touched.

Open MPI 5 refuses to start ("The PMIx server's listener thread failed to
start", exit 213) when `$TMPDIR/ompi.<its pid>` holds a rendezvous file left
by a killed `mpirun` that had the same pid. The suite kills `mpirun` with
SIGKILL on purpose (timeouts, fault and partition tests), so without a fresh
TMPDIR per launch a later test fails at random when pids wrap.
"""

import os
import subprocess

import pytest
from mpi_launch import mpi_env, mpirun_path

pytestmark = pytest.mark.mpi


def test_each_launch_gets_an_empty_tmpdir_of_its_own():
    first, second = mpi_env()["TMPDIR"], mpi_env()["TMPDIR"]
    assert first != second
    for path in (first, second):
        assert os.path.isdir(path) and os.listdir(path) == []
    assert mpi_env({"TMPDIR": "/given"})["TMPDIR"] == "/given"


def _launch_with_stale_files(tmpdir: str) -> subprocess.CompletedProcess:
    # `exec` keeps the shell's pid, so the planted directory is the one this
    # mpirun will look for: what a killed mpirun with a reused pid leaves.
    plant = (
        'd="$TMPDIR/ompi.$$"; mkdir -p "$d"; '
        "for f in pmix.$(hostname).tool pmix.$(hostname).tool.$$; do "
        'echo stale >"$d/$f"; chmod 600 "$d/$f"; done; '
        f'exec "{mpirun_path()}" -np 1 true'
    )
    env = mpi_env({"TMPDIR": tmpdir})
    return subprocess.run(
        ["bash", "-c", plant], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_stale_session_directory_is_what_breaks_mpirun(tmp_path):
    """The hazard the fresh TMPDIR avoids is real with this Open MPI."""
    stale = _launch_with_stale_files(str(tmp_path))
    if stale.returncode == 0:
        pytest.skip("this Open MPI ignores stale session files")
    assert "listener thread failed to start" in stale.stderr, stale.stderr
    # The same launch in a directory of its own starts.
    fresh = subprocess.run(
        [mpirun_path(), "-np", "1", "true"],
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fresh.returncode == 0, fresh.stderr
