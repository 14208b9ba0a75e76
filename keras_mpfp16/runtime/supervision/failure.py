"""One rank's failure ends the whole job, with that rank's traceback.

In synchronous data parallelism an exception on one rank leaves the others
waiting in their next collective forever. With more than one process, `init`
installs an exception hook that prints the traceback (prefixed with the rank)
and calls `MPI_Abort`, which makes the launcher terminate every rank at once.

* Ctrl-C (SIGINT, `KeyboardInterrupt`) on one rank ends the job the same way
  but quietly: one line instead of a traceback, exit status 130.
* A rank that leaves its script through `SystemExit` with a non-zero status
  (`sys.exit(3)`, `raise SystemExit(3)`, `exit(3)`) ends the job too: Python
  never passes `SystemExit` to the exception hook, and MPI_Finalize at exit
  would wait for the other ranks forever. The status is read at exit: on
  Python >= 3.12 from the exception that left the main module
  (`sys.monitoring`), on older versions from `sys.exit`'s argument when that
  call is what ended the script. A `raise SystemExit(n)` on Python < 3.12 is
  recognised as an early exit with an unknown status; the stall inspector
  then ends the job if the other ranks still need this one.
* `abort_job` never hangs: `MPI_Abort` is called without holding Python's
  GIL and a timer ends the process with `os._exit` if the launcher cannot be
  reached (for example when this node's network link is down).

Set `KERAS_MPFP16_ABORT_ON_EXCEPTION=0` to keep Python's default behaviour
(for example under a debugger).
"""

from __future__ import annotations

import atexit
import dis
import os
import signal
import sys
import threading
import traceback

from keras_mpfp16 import _settings as env

ENV_VAR = env.setting("ABORT_ON_EXCEPTION").name
# Seconds MPI_Abort may take before the process ends itself.
ABORT_GRACE = 5.0
INTERRUPT_STATUS = 130  # the shell's status for a process ended by SIGINT

_installed = False
# The __main__ module's frame and what is known about how it ended.
_main = {"frame": None, "exc": None, "lasti": None}


def abort_on_exception_installed() -> bool:
    """Whether this process's `sys.excepthook`, `sys.exit` and exit check are
    the job-ending ones (`install_abort_on_exception`)."""
    return _installed


def enabled_by_env() -> bool:
    return env.get("ABORT_ON_EXCEPTION")


def format_failure(rank: int, size: int, exc_type, exc, tb) -> str:
    """The text printed for an unhandled exception on `rank`."""
    body = "".join(traceback.format_exception(exc_type, exc, tb))
    header = (
        f"keras_mpfp16: unhandled {exc_type.__name__} on rank {rank} of {size}; "
        "aborting the whole job so the other ranks do not wait forever."
    )
    prefix = f"[rank {rank}] "
    return (
        "\n".join(prefix + line for line in [header, *body.rstrip().splitlines()])
        + "\n"
    )


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream must not stop the abort
            pass


def _hard_exit(code: int) -> None:
    _flush()
    os._exit(code)


def _abort_function():
    """`MPI_Abort` callable through ctypes (which releases the GIL), or None."""
    import ctypes

    from mpi4py import MPI

    size = MPI._sizeof(MPI.Comm)
    handle_type = {8: ctypes.c_void_p, 4: ctypes.c_int}.get(size)
    if handle_type is None:
        return None
    fn = ctypes.CDLL(MPI.__file__).MPI_Abort
    fn.argtypes = [handle_type, ctypes.c_int]
    fn.restype = ctypes.c_int
    handle = MPI._handleof(MPI.COMM_WORLD)
    return lambda code: fn(handle_type(handle), code)


def abort_job(code: int = 1, grace: float = ABORT_GRACE) -> None:
    """Ends every rank of the job now; this process ends within `grace` seconds.

    `MPI_Abort` asks the launcher to terminate every rank. When the launcher
    is unreachable (a cut network link) it may never return, so a timer ends
    this process with `os._exit(code)` after `grace` seconds. The call is
    made without Python's GIL so that timer can run.
    """
    _flush()
    timer = threading.Timer(grace, _hard_exit, (code,))
    timer.daemon = True
    timer.start()
    try:
        abort = _abort_function()
    except Exception:  # symbol or handle not reachable: use mpi4py's call
        abort = None
    if abort is None:
        # mpi4py holds the GIL during MPI_Abort, so the timer above could not
        # run: let the kernel end the process instead, if nobody handles
        # SIGALRM.
        if signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
            signal.alarm(int(grace) + 1)
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    else:
        abort(code)
    _hard_exit(code)  # MPI_Abort returned, which it should not


# -- how the script ended -----------------------------------------------------


def _find_main_frame():
    """The running `__main__` module's frame (on the main thread), or None."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    found = None
    while frame is not None:
        if (
            frame.f_code.co_name == "<module>"
            and frame.f_globals.get("__name__") == "__main__"
        ):
            found = frame
        frame = frame.f_back
    return found


def _watch_main_unwind(frame) -> None:
    """Python >= 3.12: record the SystemExit that leaves the main module.

    `PY_UNWIND` is a global event (it cannot be set on one code object), but
    it only fires while an exception unwinds a frame, so code that raises
    nothing pays nothing; the callback itself is two comparisons.
    """
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return
    for tool in (4, 3):  # ids not reserved for debuggers/coverage/profilers
        if mon.get_tool(tool) is None:
            break
    else:
        return
    main_code = frame.f_code

    def on_unwind(code, offset, exc):
        if code is main_code and isinstance(exc, SystemExit):
            _main["exc"] = exc

    mon.use_tool_id(tool, "keras_mpfp16")
    mon.register_callback(tool, mon.events.PY_UNWIND, on_unwind)
    mon.set_events(tool, mon.get_events(tool) | mon.events.PY_UNWIND)


def _main_ended_early() -> bool | None:
    """Whether `__main__` stopped before its end (None: cannot tell)."""
    frame = _main["frame"]
    if frame is None:
        return None
    ops = {i.offset: i.opname for i in dis.get_instructions(frame.f_code)}
    return ops.get(frame.f_lasti) not in ("RETURN_VALUE", "RETURN_CONST")


def _status_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # Python prints a non-integer argument and exits with 1


def _exit_exception():
    """The SystemExit that ended the script, if it is known."""
    exc = _main["exc"]
    frame = _main["frame"]
    if exc is None or frame is None or sys.version_info >= (3, 12):
        # >= 3.12: recorded by PY_UNWIND on the main module, which it ended.
        return exc
    # Recorded by the sys.exit wrapper, with the main module's position at
    # the time: that call ended the script only if the main module stopped
    # right there (a SystemExit caught and followed by more code does not).
    return exc if _main["lasti"] == frame.f_lasti else None


def exit_status() -> tuple[int | None, str]:
    """The status this process is exiting with, as far as Python tells.

    Returns:
        `(status, how)`: status 0 and `"its script ended"` for a normal end;
        the SystemExit's status and e.g. `"sys.exit(3)"`; or `None` and a
        description when the script was left through a SystemExit whose
        status cannot be read (Python < 3.12, `raise SystemExit(n)`).
    """
    early = _main_ended_early()
    if early is False:
        return 0, "its script ended"
    exc = _exit_exception()
    if exc is not None:
        return _status_of(exc), f"SystemExit({exc.code!r})"
    if early is None:
        return 0, "its script ended"
    return None, "an uncaught SystemExit with a status Python < 3.12 does not reveal"


# Set when every rank leaves together after an agreed preemption: the exit
# check then lets the status (PREEMPTED_EXIT_CODE) through without aborting.
_leaving = {"preempted": False}


def mark_preempted_exit() -> None:
    """Records that this process leaves because of an agreed preemption."""
    _leaving["preempted"] = True


def preempted_exit() -> bool:
    """Whether this process leaves because of an agreed preemption."""
    return _leaving["preempted"]


def exit_description() -> str:
    """How this process is leaving, for the stall inspector's reports."""
    return exit_status()[1]


def install_abort_on_exception(rank: int, size: int) -> bool:
    """Installs the abort-on-exception hook for the main thread.

    Exceptions in other threads do not block the collectives, so they keep
    Python's behaviour.

    Returns:
        True if installed (more than one process and not disabled by the env).
    """
    global _installed
    if _installed or size <= 1 or not enabled_by_env():
        return _installed

    def excepthook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            # Ctrl-C on one rank ends the job like an exception, quietly.
            try:
                sys.stderr.write(
                    f"[rank {rank}] keras_mpfp16: rank {rank} of {size} was "
                    "interrupted (KeyboardInterrupt); ending the whole job.\n"
                )
            finally:
                abort_job(INTERRUPT_STATUS)
            return
        try:
            sys.stderr.write(format_failure(rank, size, exc_type, exc, tb))
        finally:
            abort_job(1)

    sys.excepthook = excepthook
    _watch_exit_status(rank, size)
    _installed = True
    return True


def _watch_exit_status(rank: int, size: int) -> None:
    """A non-zero SystemExit on one rank must end the job too.

    Python does not pass SystemExit to the exception hook, and mpi4py's
    MPI_Finalize at exit would wait for the other ranks forever. At exit
    (atexit runs handlers last-registered-first, so this one runs before
    mpi4py's) we find out how the script ended (`exit_status`) and abort the
    job when its status is non-zero.
    """
    _main["frame"] = _find_main_frame()
    if _main["frame"] is not None and sys.version_info >= (3, 12):
        _watch_main_unwind(_main["frame"])
    real_exit = sys.exit

    def exit(code=None):  # noqa: A001 - replaces sys.exit
        try:
            real_exit(code)
        except SystemExit as exc:
            frame = _main["frame"]
            if (
                sys.version_info < (3, 12)
                and frame is not None
                and threading.current_thread() is threading.main_thread()
            ):
                _main["exc"], _main["lasti"] = exc, frame.f_lasti
            raise

    def check():
        if _leaving["preempted"]:
            return  # every rank leaves together, with the preemption status
        code, how = exit_status()
        if code not in (0, None):
            sys.stderr.write(
                f"[rank {rank}] keras_mpfp16: rank {rank} of {size} is exiting with "
                f"status {code!r} ({how}); aborting the whole job so the other "
                "ranks do not wait forever.\n"
            )
            abort_job(code if isinstance(code, int) else 1)
        elif code is None:
            sys.stderr.write(
                f"[rank {rank}] keras_mpfp16: rank {rank} of {size} left its script "
                f"through {how}; if other ranks still need it, the stall "
                "inspector ends the job. Use sys.exit(n) to have the status "
                "seen.\n"
            )

    sys.exit = exit
    atexit.register(check)
