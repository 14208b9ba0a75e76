"""A node lost mid-job ends the whole job, launcher included, non-zero, within
60 s, naming the lost host: `python -m keras_mpfp16.runtime.launch mpirun ...`
on the emulated cluster (3 nodes, 1 Gbit/s). Skipped where network
namespaces cannot be made (not root, no `ip netns`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mpi_launch import SCRIPTS, mpi_env

# The emulated-cluster harness is a benchmark tool, not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "benchmarks"))
from cluster import Cluster, available  # noqa: E402

OK, WHY = available()
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not OK, reason=f"no emulated cluster here: {WHY}"),
]
NODE_LOST = 69  # keras_mpfp16.runtime.launch.NODE_LOST_EXIT_CODE


@pytest.fixture
def cluster3():
    c = Cluster(3, "1gbit", prefix="kmpl", subnet="10.78.8", bridge="kmplbr0")
    c.up()
    try:
        yield c
    finally:
        c.down()


def test_cut_node_ends_the_launcher_non_zero_within_60s(cluster3, tmp_path):
    """Node 3's link cut mid-epoch, default heartbeat (30 s): mpirun alone
    would wait for node 3's daemon forever; under the wrapper the job ends
    with status 69 within 60 s of the cut and the lost rank's host is named."""
    run_dir = tmp_path / "cut"
    run_dir.mkdir()
    mpirun = cluster3.mpirun_command(
        [sys.executable, str(SCRIPTS / "cluster_train.py"), "cut", str(run_dir)]
    )
    cmd = [sys.executable, "-m", "keras_mpfp16.runtime.launch", *mpirun]
    # Output to files: the cut node's daemon keeps inherited pipes open.
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=mpi_env({}),
            start_new_session=True,
        )
    ended = None
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "reached").exists():
            assert proc.poll() is None, f"job ended early ({proc.returncode})"
            assert time.monotonic() < deadline, "training never reached epoch 2"
            time.sleep(0.1)
        cluster3.link(3, up=False)
        cut = time.monotonic()
        try:
            proc.wait(timeout=90)
            ended = time.monotonic() - cut
        except subprocess.TimeoutExpired:
            pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        cluster3.link(3, up=True)
        cluster3.kill_all()
    err = err_path.read_text()
    assert ended is not None, f"still running 90 s after the cut\n{err[-3000:]}"
    print(f"the launcher ended {ended:.1f}s after the cut, status {proc.returncode}")
    assert proc.returncode == NODE_LOST, err[-3000:]
    assert ended < 60, err[-3000:]
    assert "rank 2 (host kmpl3) is unreachable" in err, err[-3000:]
    assert "keras_mpfp16.runtime.launch: the job lost a rank" in err


def test_cut_node_ends_plain_mpirun_non_zero_within_60s(cluster3, tmp_path):
    """No wrapper: a plain `mpirun` started on node 1 (as a batch script runs
    it on the allocation's first node, beside rank 0), node 3's link cut
    mid-epoch, default heartbeat (30 s). Rank 0 declares rank 2 lost and
    calls MPI_Abort; `mpirun` would wait for node 3's daemon forever, so
    `KERAS_MPFP16_END_LAUNCHER_AFTER` (10 s) later rank 0's watchdog ends
    it. Every process on nodes 1 and 2 and `mpirun` end, non-zero, within
    60 s of the cut; the lost host is named."""
    run_dir = tmp_path / "cut"
    run_dir.mkdir()
    mpirun = cluster3.mpirun_command(
        [sys.executable, str(SCRIPTS / "cluster_train.py"), "cut", str(run_dir)]
    )
    # mpirun inside node 1's namespace, with node 1's hostname (the agent).
    cmd = [str(cluster3.agent), cluster3.node(1), *mpirun]
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=mpi_env({}),
            start_new_session=True,
        )
    ended = None
    survivors = []
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "reached").exists():
            assert proc.poll() is None, f"job ended early ({proc.returncode})"
            assert time.monotonic() < deadline, "training never reached epoch 2"
            time.sleep(0.1)
        cluster3.link(3, up=False)
        cut = time.monotonic()
        try:
            proc.wait(timeout=90)
            ended = time.monotonic() - cut
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
        survivors = cluster3.pids(1) + cluster3.pids(2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        cluster3.link(3, up=True)
        cluster3.kill_all()
    err = err_path.read_text(errors="replace")
    assert ended is not None, f"mpirun still running 90 s after the cut\n{err[-3000:]}"
    print(f"mpirun ended {ended:.1f}s after the cut, status {proc.returncode}")
    assert proc.returncode != 0, err[-3000:]
    assert ended < 60, err[-3000:]
    assert "rank 2 (host kmpl3) is unreachable" in err, err[-3000:]
    assert "ending this node's launcher daemon (prterun" in err, err[-3000:]
    assert survivors == [], survivors  # nothing left on nodes 1 and 2
