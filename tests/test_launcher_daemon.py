"""The watchdog that ends a rank's local launcher after a lost node
(`runtime.supervision.launcher_daemon`), on a stand-in launcher: a shell
script named `prterun` whose child asks for it to be ended. The real case
(plain `mpirun` on the emulated cluster) is in tests/test_cluster_launch.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from keras_mpfp16.runtime.supervision import launcher_daemon

# The module by its path: it imports nothing of the package (no TensorFlow
# to wait for in the stand-in ranks).
LOAD = (
    "import importlib.util, sys; "
    f"spec = importlib.util.spec_from_file_location('d', {launcher_daemon.__file__!r}); "
    "d = importlib.util.module_from_spec(spec); spec.loader.exec_module(d); "
)
CHILD = (
    LOAD + "print(d.end_later(float(sys.argv[1]), 'rank 0 (host test)'), flush=True)"
)


def _stand_in(tmp_path, name: str):
    script = tmp_path / name
    # Runs its command (the "rank"), then waits as a launcher would.
    script.write_text('#!/bin/sh\n"$@"\nexec sleep 120\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("name", ["prterun", "prted"])
def test_watchdog_ends_the_launcher_that_outlives_the_delay(tmp_path, name):
    script = _stand_in(tmp_path, name)
    start = time.monotonic()
    proc = subprocess.run(
        [str(script), sys.executable, "-c", CHILD, "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - start
    # The rank saw its launcher; the launcher was ended (SIGTERM) after the
    # delay, not left to sleep its 120 s.
    assert name in proc.stdout, proc.stdout
    assert proc.returncode in (-15, 143), (proc.returncode, proc.stderr)
    assert 0.5 <= took < 30, took
    assert f"ending this node's launcher daemon ({name}, pid" in proc.stderr
    assert "rank 0 (host test)" in proc.stderr


def test_nothing_is_ended_without_an_open_mpi_launcher(tmp_path):
    """Another parent (here a script named `srun-step`), or a delay of 0: no
    watchdog, the parent runs on."""
    script = tmp_path / "srun-step"
    off = _stand_in(tmp_path, "prterun")
    for parent, delay in ((script, "0.5"), (off, "0")):
        parent.write_text('#!/bin/sh\n"$@"\nexec sleep 3\n')
        parent.chmod(0o755)
        proc = subprocess.run(
            [str(parent), sys.executable, "-c", CHILD, delay],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.stdout.strip() == "None" and proc.returncode == 0, proc


def test_local_launcher_walks_up_to_the_nearest_launcher(tmp_path):
    assert launcher_daemon.local_launcher(1) is None
    script = _stand_in(tmp_path, "mpirun")
    # A grandchild of the launcher: it is two levels up.
    grandchild = LOAD + "print(d.local_launcher()[1])"
    probe = (
        "import subprocess, sys; "
        f"print(subprocess.run([sys.executable, '-c', {grandchild!r}], "
        "capture_output=True, text=True).stdout.strip(), flush=True)"
    )
    script.write_text('#!/bin/sh\n"$@"\n')
    proc = subprocess.run(
        [str(script), sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "mpirun", proc
