"""One rank's failure ends the whole job, with that rank's traceback.

In synchronous data parallelism an exception on one rank leaves the others
waiting in their next collective forever. With more than one process, `init`
installs an exception hook that prints the traceback (prefixed with the rank)
and calls `MPI_Abort`, which makes the launcher terminate every rank at once.

Set `KERAS_MPFP16_ABORT_ON_EXCEPTION=0` to keep Python's default behaviour
(for example under a debugger).
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback

ENV_VAR = "KERAS_MPFP16_ABORT_ON_EXCEPTION"

_installed = False


def enabled_by_env() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


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


def abort_job(code: int = 1) -> None:
    """Ends every rank of the job now."""
    from mpi4py import MPI

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream must not stop the abort
            pass
    MPI.COMM_WORLD.Abort(code)


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
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt) and size <= 1:
            return previous(exc_type, exc, tb)
        try:
            sys.stderr.write(format_failure(rank, size, exc_type, exc, tb))
        finally:
            abort_job(1)

    sys.excepthook = excepthook
    _watch_exit_status(rank, size)
    _installed = True
    return True


def _watch_exit_status(rank: int, size: int) -> None:
    """`sys.exit(n)` with n != 0 on one rank must end the job too.

    Python does not pass SystemExit to the exception hook, and mpi4py's
    MPI_Finalize at exit would wait for the other ranks forever. We record the
    status given to `sys.exit` and abort at exit when it is non-zero. (atexit
    runs handlers last-registered-first, so this one runs before mpi4py's.)
    """
    status = {"code": 0}
    real_exit = sys.exit

    def exit(code=0):  # noqa: A001 - replaces sys.exit
        status["code"] = code
        real_exit(code)

    def check():
        code = status["code"]
        if code not in (0, None):
            sys.stderr.write(
                f"[rank {rank}] keras_mpfp16: rank {rank} of {size} is exiting with "
                f"status {code!r}; aborting the whole job so the other ranks do not "
                "wait forever.\n"
            )
            abort_job(code if isinstance(code, int) else 1)

    sys.exit = exit
    atexit.register(check)
