"""A lost node ends a plain `mpirun` too: a rank ends its local launcher.

When a node is lost, the heartbeats end every rank within
`KERAS_MPFP16_HEARTBEAT_TIMEOUT` seconds and rank 0 calls `MPI_Abort`, but
Open MPI's `mpirun` (`prterun`) then waits for the lost node's daemon
forever - measured on the emulated cluster: the other nodes' daemons
(`prted`) end with their ranks, `prterun` prints that rank 0 called abort
and stays, and a SIGTERM does not move it either. A batch job would sit
until its time limit.

So a rank that declares another one lost (rank 0 for any rank, any rank
for rank 0) also starts a small detached watchdog process: if the rank's
nearest ancestor named `prterun`/`mpirun`/`mpiexec`/`orterun` (the
launcher, when this rank runs on the launcher's node: the usual layout,
e.g. a Slurm batch script runs `mpirun` on the allocation's first node) or
`prted`/`orted` (Open MPI's daemon on another node) is still running
`KERAS_MPFP16_END_LAUNCHER_AFTER` seconds later, the watchdog says so on
stderr and ends it: SIGTERM, then SIGKILL `KILL_GRACE` seconds later. The
launcher then exits non-zero (137 after the SIGKILL); the rank's message
naming the lost host was printed before.

Only those Open MPI process names are ended; under `srun`, MPICH's Hydra
or any other launcher nothing is (no such ancestor). A `mpirun` on a node
without ranks (a login node) is out of reach: use the launch wrapper
(`python -m keras_mpfp16.runtime.launch`). `KERAS_MPFP16_END_LAUNCHER_AFTER=0`
turns it off.

Nothing here imports Keras or mpi4py.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Open MPI's per-node daemons and the launcher process itself (which is the
# daemon of its own node).
DAEMON_NAMES = ("prted", "orted", "prterun", "mpirun", "mpiexec", "orterun")
KILL_GRACE = 3.0  # seconds between the watchdog's SIGTERM and its SIGKILL


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of `pid` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[19]


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def local_launcher(pid: int | None = None) -> tuple[int, str, str] | None:
    """The nearest ancestor of `pid` (default: this process) that is an Open
    MPI launcher daemon: `(pid, name, start time)`, or None."""
    pid = os.getpid() if pid is None else pid
    for _ in range(16):
        stat = _stat(pid)
        if stat is None or stat[0] <= 1:
            return None
        pid = stat[0]
        name = _name(pid)
        if name in DAEMON_NAMES:
            parent = _stat(pid)
            return (pid, name, parent[1]) if parent else None
    return None


_WATCHDOG = r"""
import os, signal, sys, time
pid, start, delay, grace, message = (
    int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
)
def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19] == start
    except (OSError, IndexError):
        return False
time.sleep(delay)
if alive():
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except Exception:
        pass
    try:
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while alive() and time.monotonic() < end:
            time.sleep(0.1)
        if alive():
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def end_later(delay: float, where: str) -> tuple[int, str] | None:
    """Starts the watchdog that ends this rank's local launcher daemon if it
    still runs `delay` seconds from now. `where` names this rank in its
    message. Returns `(pid, name)` of the daemon, or None when there is none
    (another launcher) or `delay` is 0."""
    if delay <= 0:
        return None
    found = local_launcher()
    if found is None:
        return None
    pid, name, start = found
    message = (
        f"keras_mpfp16 ({where}): the job lost a rank and its launcher had not "
        f"ended it {delay:g}s later; ending this node's launcher daemon "
        f"({name}, pid {pid}) so that mpirun exits (KERAS_MPFP16_END_LAUNCHER_AFTER)."
    )
    try:
        subprocess.Popen(
            [
                sys.executable,
                "-S",
                "-c",
                _WATCHDOG,
                str(pid),
                start,
                str(delay),
                str(KILL_GRACE),
                message,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return None
    return pid, name
