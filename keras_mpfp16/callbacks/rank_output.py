"""Rank-0-only console output.

On ranks other than 0, Keras's interactive logging (progress bars, `fit` and
`evaluate` lines, `summary()`) is switched to absl logging, which is silent by
default, so `mpirun -np N` prints one progress bar instead of N. Errors,
warnings and the user's own `print` calls are untouched.

Set `KERAS_MPFP16_ALL_RANKS_OUTPUT=1` to keep output on every rank.
"""

from __future__ import annotations

import os

ENV_VAR = "KERAS_MPFP16_ALL_RANKS_OUTPUT"


def quiet_non_root_ranks() -> bool:
    """Silences Keras's console output on ranks other than 0.

    Returns:
        True if output was silenced on this rank.
    """
    import keras

    from keras_mpfp16 import runtime

    if os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if runtime.rank() == 0:
        return False
    keras.config.disable_interactive_logging()
    return True
