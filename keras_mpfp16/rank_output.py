"""Rank-0-only console output.

On ranks other than 0, Keras's interactive logging (progress bars, `fit` and
`evaluate` lines, `summary()`, callbacks' `verbose` messages: everything
Keras prints through `keras.utils.io_utils.print_msg`) is switched to absl
logging, which is silent by default, so `mpirun -np N` prints one progress
bar instead of N. Untouched: the user's own `print` calls, anything else
written to stdout, and everything on stderr (warnings, errors, tracebacks,
TensorFlow's C++ log).

For the rest, two opt-ins: `print_once(...)` prints on rank 0 only, and
`root_stdout_only()` (or `KERAS_MPFP16_ROOT_STDOUT_ONLY=1`, applied at
`import keras_mpfp16`) sends *all* standard output of ranks other than 0
to `os.devnull` - Python's and C's, like an MPI launcher's option to show
one rank's output - while their stderr stays visible.

It happens twice: at `import keras_mpfp16`, from the rank the MPI launcher
announces in the environment (no MPI call, so a `model.summary()` before the
optimizer exists prints once), and again at each distributed `fit` and
`evaluate`, from the library's communicator (authoritative, e.g. for a
sub-communicator passed to `keras_mpfp16.init`).

The switch is a gate in front of Keras's interactive-logging flag (seam:
`gate_interactive_logging`), not only the flag: `keras.backend.
clear_session()` (which KerasTuner calls before every trial) resets Keras's
global state and so the flag to on, and a script may call
`keras.utils.enable_interactive_logging()` itself; neither turns Keras's
output back on on ranks other than 0.

Set `KERAS_MPFP16_ALL_RANKS_OUTPUT=1` to keep output on every rank.
"""

from __future__ import annotations

import builtins
import os
import sys

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.process.launcher_env import launcher_rank

ENV_VAR = env.setting("ALL_RANKS_OUTPUT").name
STDOUT_ENV_VAR = env.setting("ROOT_STDOUT_ONLY").name

# Whether this module switched Keras's output off (so it may switch it back on
# when the communicator says this process is the root after all).
_silenced_by_us = False
# Whether Keras's output is gated off on this rank (survives clear_session
# and the user's enable_interactive_logging(); see _keras_output_allowed).
_quiet = False
_gate_installed = False
# Whether root_stdout_only() sent this process's stdout to os.devnull.
_stdout_redirected = False


def _keras_output_allowed() -> bool:
    """The gate Keras's output paths read (False on a quieted rank)."""
    return not _quiet


def _all_ranks_requested() -> bool:
    return env.get("ALL_RANKS_OUTPUT")


def root_stdout_only_requested() -> bool:
    return env.get("ROOT_STDOUT_ONLY")


def _this_rank() -> int | None:
    """The library's rank once MPI is initialised, else the launcher's (no
    MPI call); None outside an MPI launch."""
    from keras_mpfp16.runtime.mpi import world

    if world.is_initialized():
        return world.rank()
    return launcher_rank()


def print_once(*args, **kwargs) -> None:
    """`print`, on rank 0 only (once per job instead of once per rank).

    Same arguments as the built-in `print`. Makes no MPI call: before the
    library is initialised, the rank comes from the MPI launcher's
    environment; outside an MPI launch it always prints.

    Example:

    ```python
    import keras_mpfp16 as kmp

    kmp.print_once(f"training on {kmp.size()} ranks")
    ```
    """
    rank = _this_rank()
    if rank is None or rank == 0:
        builtins.print(*args, **kwargs)


def root_stdout_only() -> bool:
    """Sends all standard output of this process to `os.devnull` unless it is rank 0.

    From the call on, on ranks other than 0, `print` and anything else
    written to file descriptor 1 (C extensions, subprocesses started
    afterwards) is discarded; stderr (warnings, errors, tracebacks) is
    untouched, so a failing rank is still heard. For good: there is no
    switch back. `KERAS_MPFP16_ROOT_STDOUT_ONLY=1` does the same at
    `import keras_mpfp16`. No MPI call (the rank as in `print_once`).

    Returns:
        True if this rank's output was silenced.
    """
    rank = _this_rank()
    if rank is None or rank == 0:
        return False
    try:
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass
    global _stdout_redirected
    _stdout_redirected = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)
    try:
        writes_fd_1 = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):
        writes_fd_1 = False
    if not writes_fd_1:  # e.g. a replaced sys.stdout: silence it too
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    return True


def _silence() -> None:
    global _silenced_by_us, _quiet, _gate_installed
    import keras

    _quiet = True
    if not _gate_installed:
        # Imported here: this module loads no Keras until it gates it
        # (root_stdout_only runs at `import keras_mpfp16` itself).
        from keras_mpfp16.internals import keras as keras_internals

        keras_internals.gate_interactive_logging(_keras_output_allowed)
        _gate_installed = True
    if keras.config.is_interactive_logging_enabled():
        keras.config.disable_interactive_logging()
        _silenced_by_us = True


def _unsilence() -> None:
    global _silenced_by_us, _quiet
    import keras

    _quiet = False
    if _silenced_by_us:
        keras.config.enable_interactive_logging()
        _silenced_by_us = False


def stdout_redirected() -> bool:
    """Whether `root_stdout_only()` sent this process's stdout to `os.devnull`."""
    return _stdout_redirected


def install_output_gate() -> bool:
    """Silences Keras's console output if the launcher says this is not rank 0
    (the gate; no MPI call), unless `KERAS_MPFP16_ALL_RANKS_OUTPUT=1`.

    Returns:
        True if Keras's output was silenced on this rank.
    """
    if _all_ranks_requested():
        return False
    r = launcher_rank()
    if r is None or r == 0:
        return False
    _silence()
    return True


def remove_output_gate() -> bool:
    """Keras's output paths read Keras's own flag again (no gate), and the flag
    is back on if this module turned it off.

    Returns:
        Whether a gate was removed.
    """
    global _gate_installed
    if not _gate_installed:
        return False
    from keras_mpfp16.internals import keras as keras_internals

    _unsilence()
    keras_internals.gate_interactive_logging(None)
    _gate_installed = False
    return True


def output_gate_installed() -> bool:
    """Whether Keras's interactive-logging check is gated by this module."""
    return _gate_installed


def quiet_non_root_ranks_early() -> bool:
    """Silences Keras's console output if the launcher says this is not rank 0.

    Makes no MPI call. Called at `import keras_mpfp16`. With
    `KERAS_MPFP16_ROOT_STDOUT_ONLY=1`, also runs `root_stdout_only()`.

    Returns:
        True if Keras's output was silenced on this rank.
    """
    if root_stdout_only_requested():
        root_stdout_only()
    return install_output_gate()


def quiet_non_root_ranks() -> bool:
    """Silences Keras's console output on ranks other than 0.

    Returns:
        True if output was silenced on this rank.
    """
    from keras_mpfp16.runtime.mpi import world

    if _all_ranks_requested():
        _unsilence()  # set from Python after import (kmp.config)
        return False
    if world.rank() == 0:
        _unsilence()  # the launcher's rank was not this communicator's
        return False
    _silence()
    return True
