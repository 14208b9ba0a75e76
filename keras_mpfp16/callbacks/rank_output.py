"""Rank-0-only console output.

On ranks other than 0, Keras's interactive logging (progress bars, `fit` and
`evaluate` lines, `summary()`) is switched to absl logging, which is silent by
default, so `mpirun -np N` prints one progress bar instead of N. Errors,
warnings and the user's own `print` calls are untouched.

It happens twice: at `import keras_mpfp16`, from the rank the MPI launcher
announces in the environment (no MPI call, so a `model.summary()` before the
optimizer exists prints once), and again at each distributed `fit` and
`evaluate`, from the library's communicator (authoritative, e.g. for a
sub-communicator passed to `keras_mpfp16.init`).

Set `KERAS_MPFP16_ALL_RANKS_OUTPUT=1` to keep output on every rank.
"""

from __future__ import annotations

import os

from keras_mpfp16.runtime import env

ENV_VAR = "KERAS_MPFP16_ALL_RANKS_OUTPUT"  # registered in runtime.env

# Rank variables set by common MPI launchers, read before MPI is initialised.
_LAUNCHER_RANK_VARS = (
    "OMPI_COMM_WORLD_RANK",  # Open MPI
    "PMIX_RANK",  # PMIx (Open MPI 5, Slurm)
    "PMI_RANK",  # MPICH / Hydra, Intel MPI
    "MV2_COMM_WORLD_RANK",  # MVAPICH
    "SLURM_PROCID",  # srun
)

# Whether this module switched Keras's output off (so it may switch it back on
# when the communicator says this process is the root after all).
_silenced_by_us = False


def _all_ranks_requested() -> bool:
    return env.get("ALL_RANKS_OUTPUT")


def launcher_rank() -> int | None:
    """This process's rank as announced by the MPI launcher, if any."""
    for var in _LAUNCHER_RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _silence() -> None:
    global _silenced_by_us
    import keras

    if keras.config.is_interactive_logging_enabled():
        keras.config.disable_interactive_logging()
        _silenced_by_us = True


def quiet_non_root_ranks_early() -> bool:
    """Silences Keras's console output if the launcher says this is not rank 0.

    Makes no MPI call. Called at `import keras_mpfp16`.

    Returns:
        True if output was silenced on this rank.
    """
    if _all_ranks_requested():
        return False
    r = launcher_rank()
    if r is None or r == 0:
        return False
    _silence()
    return True


def quiet_non_root_ranks() -> bool:
    """Silences Keras's console output on ranks other than 0.

    Returns:
        True if output was silenced on this rank.
    """
    global _silenced_by_us
    import keras

    from keras_mpfp16 import runtime

    if _all_ranks_requested():
        if _silenced_by_us:  # set from Python after import (kmp.config)
            keras.config.enable_interactive_logging()
            _silenced_by_us = False
        return False
    if runtime.rank() == 0:
        if _silenced_by_us:  # the launcher's rank was not this communicator's
            keras.config.enable_interactive_logging()
            _silenced_by_us = False
        return False
    _silence()
    return True
