"""Preemption: a signal on any rank stops every rank at the same step.

Slurm sends SIGTERM before it kills a preempted or timed-out job (early, with
`#SBATCH --signal=TERM@120`), `scancel --signal=USR1` sends SIGUSR1, and
`mpirun` forwards SIGUSR1 to its ranks. While a multi-process `fit` runs,
`handling()` installs a handler for SIGTERM and SIGUSR1 that only records
the signal. Which step to stop at must be the same on every rank although
the signal may reach the ranks at different steps, or only one of them: the
record travels as one extra float64 in the per-step metric reduction that
every train and test step already makes (`allreduce_carrying`), so no MPI
call is added. The first reduction whose sum is non-zero is the same call
on every rank, and from it on `agreed()` is true everywhere. The training
layer then writes a backup at that step boundary and every rank leaves with
`PREEMPTED_EXIT_CODE`.

`PREEMPTED_EXIT_CODE` is 75, `EX_TEMPFAIL` of BSD's `sysexits.h` ("a
temporary failure; the user is invited to retry"): not 1 (any error), not
128+n (the shell's status for a process killed by signal n, e.g. 143 for
SIGTERM, which Slurm and Open MPI report for killed ranks), not one of
Open MPI's launcher statuses, and usable as Slurm's `RequeueExit=75`.

Set `KERAS_MPFP16_PREEMPTION=0` to leave SIGTERM and SIGUSR1 alone.

Nothing here imports Keras.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

import numpy as np

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.mpi import collectives
from keras_mpfp16.runtime.supervision import failure

PREEMPTED_EXIT_CODE = 75
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Registered in _settings.py.
ENABLE_ENV = env.setting("PREEMPTION").name
DIR_ENV = env.setting("PREEMPTION_DIR").name
DEFAULT_DIR = "keras_mpfp16_preemption"

# Process-wide state: one fit at a time handles signals.
_state: dict[str, Any] = {
    "active": False,  # inside handling()
    "requested": None,  # the first signal number received, or None
    "agreed": False,  # a reduction saw a request from some rank
}


class Preempted(SystemExit):
    """Raised on every rank by a `fit` stopped by a preemption signal, after
    the backup is written; leaves the script with `PREEMPTED_EXIT_CODE`.

    A `SystemExit`: `except Exception` does not catch it, `finally` blocks
    and `atexit` handlers run. Catch it to do something else than exit.

    Attributes:
        signal: The signal number that started it (on a rank that received
            one; None on a rank told by the others).
        epoch: The epoch the backup resumes in.
        steps_done: Steps of that epoch already trained.
        backup_dir: Where the backup is.
    """

    def __init__(self, signum, epoch: int, steps_done: int, backup_dir: str):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.signal = signum
        self.epoch = epoch
        self.steps_done = steps_done
        self.backup_dir = backup_dir

    def __str__(self) -> str:
        return (
            f"preempted: backup of epoch {self.epoch}, step {self.steps_done} in "
            f"{self.backup_dir}; exit status {PREEMPTED_EXIT_CODE}"
        )


def script_name(argv: list[str] | None = None) -> str:
    """The running script's file name without `.py` (`"interactive"` for a
    session or `python -c` without one), for the default backup directory."""
    argv = sys.argv if argv is None else argv
    first = argv[0] if argv else ""
    name = os.path.basename(first)
    if name.endswith(".py"):
        name = name[:-3]
    if name in ("", "-c", "-"):
        return "interactive"
    if name == "__main__":  # python -m package: the package's name
        name = os.path.basename(os.path.dirname(first)) or "interactive"
    return name


def settings() -> tuple[bool, str]:
    """`(enabled, directory)` from the environment.

    `KERAS_MPFP16_PREEMPTION` (default on; `0`/`false`/`no`/`off` turn it
    off) and `KERAS_MPFP16_PREEMPTION_DIR` (the library's own backup
    directory, used when `fit` has no `BackupAndRestore`; default
    `./keras_mpfp16_preemption/<script>`, `<script>` the script's file name
    without `.py`).
    """
    directory = (env.get("PREEMPTION_DIR") or "").strip() or os.path.join(
        DEFAULT_DIR, script_name()
    )
    return env.get("PREEMPTION"), directory


def resume_policy() -> str:
    """`KERAS_MPFP16_PREEMPTION_RESUME`: `"same-job"` (default), `"always"`
    or `"fresh"`: which of the library's own backups a `fit` resumes."""
    return env.get("PREEMPTION_RESUME")


def requested() -> int | None:
    """The signal this rank received during the current `fit`, or None."""
    return _state["requested"]


def agreed() -> bool:
    """Whether every rank has seen, in the same reduction, that some rank
    received a preemption signal (the same value on every rank)."""
    return _state["agreed"]


def mark_exiting() -> None:
    """Records that this process leaves because of an agreed preemption (the
    abort-on-exit check then lets the status through without aborting)."""
    failure.mark_preempted_exit()


def exiting() -> bool:
    return failure.preempted_exit()


def allreduce_carrying(
    buf: np.ndarray, name: str = "allreduce", channel: str = "train"
) -> np.ndarray:
    """The sum over ranks of a float64 buffer, carrying this rank's request flag.

    Every rank must use it for the same collectives (it adds one element to
    each rank's buffer). Returns the summed buffer without the flag.
    `channel`: the kind of step making it (`"train"` or `"test"`), whose
    communicator it runs on (`runtime.mpi.world.channel`).
    """
    flag = 1.0 if (_state["active"] and _state["requested"] is not None) else 0.0
    send = np.concatenate([np.asarray(buf, np.float64).reshape(-1), [flag]])
    out = collectives.allreduce_step_sum(send, channel, name)
    if _state["active"] and out[-1] > 0:
        _state["agreed"] = True
    return out[:-1]


def _previous_is_callable(previous) -> bool:
    return callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN)


def handling_active() -> bool:
    """Whether `handling()` is active (its signal handlers installed)."""
    return bool(_state["active"])


@contextlib.contextmanager
def handling():
    """While active (one multi-process `fit`): SIGTERM and SIGUSR1 are recorded.

    The user's own Python handler for a signal is called too, right after the
    record (chained); a signal the user set to `SIG_IGN` stays ignored. On
    exit the previous handlers come back. A signal that arrived too late to
    be agreed on (after the last reduction of the `fit`) is then delivered
    again, so it has the effect it would have had without this handler
    (the default action of SIGTERM/SIGUSR1 ends the process).
    """
    enabled, _ = settings()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    failed = True

    def handler(signum, frame):
        if _state["requested"] is None:
            _state["requested"] = signum
        chained = previous.get(signum)
        if _previous_is_callable(chained):
            chained(signum, frame)

    _state.update(active=True, requested=None, agreed=False)
    try:
        for sig in SIGNALS:
            old = signal.getsignal(sig)
            if old is signal.SIG_IGN:
                continue
            previous[sig] = old
            signal.signal(sig, handler)
        yield
    except BaseException:
        failed = True
        raise
    else:
        failed = False
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        late = _state["requested"]
        was_agreed = _state["agreed"]
        _state.update(active=False, requested=None, agreed=False)
        if late is not None and not was_agreed and not failed and late in previous:
            old = previous[late]
            if old in (signal.SIG_DFL, None):
                os.kill(os.getpid(), late)  # the default action, as if never caught
            # A user's Python handler already ran when the signal came.


__all__ = [
    "DEFAULT_DIR",
    "DIR_ENV",
    "ENABLE_ENV",
    "PREEMPTED_EXIT_CODE",
    "Preempted",
    "SIGNALS",
    "agreed",
    "allreduce_carrying",
    "exiting",
    "handling",
    "mark_exiting",
    "requested",
    "resume_policy",
    "script_name",
    "settings",
]
