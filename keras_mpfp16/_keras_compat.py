"""The XLA guard: multi-process DistributedOptimizer models compile without XLA.

A model trained by a DistributedOptimizer on more than one process calls MPI
from the host in the middle of its train step, which XLA cannot compile.
Keras decides whether to compile with XLA by asking `model_supports_jit`,
both for `jit_compile="auto"` (True on GPU machines) and for an explicit
`jit_compile=True`. The guard wraps that function (through the seam,
`keras_mpfp16.internals.keras.wrap_model_supports_jit`) so such models answer
False: Keras then trains without XLA instead of failing at the first step,
and we warn once saying why.

If a Keras release no longer has the hook, installing the guard raises
`KerasInternalsError` naming the Keras version and this feature (at
`import keras_mpfp16`); it never silently does nothing.
"""

from __future__ import annotations

import warnings

from keras_mpfp16.internals import keras as keras_internals

_XLA_WARNING = (
    "keras_mpfp16: XLA compilation (jit_compile) is turned off for this model: "
    "with more than one process the DistributedOptimizer reduces gradients "
    "with an MPI call from the host inside the train step, which XLA cannot "
    "compile. The model trains without XLA."
)


def _needs_host_collectives(model) -> bool:
    """Whether `model` is trained by a DistributedOptimizer over several processes."""
    from keras_mpfp16.optimizer import DistributedOptimizer
    from keras_mpfp16.runtime import world

    optimizer = getattr(model, "optimizer", None)
    # No collective here: `compile` runs on whatever ranks call it, e.g. a
    # `load_model` on rank 0 alone.
    return isinstance(optimizer, DistributedOptimizer) and world.launched_size() > 1


def install_jit_guard() -> bool:
    """Installs the XLA guard (once; later calls do nothing).

    Returns:
        True. (Kept for callers written when a missing hook returned False.)

    Raises:
        KerasInternalsError: if this Keras has no `model_supports_jit` hook.
    """
    warned = []

    def make_wrapper(original):
        def supports_jit(model):
            if _needs_host_collectives(model):
                if not warned:
                    warned.append(True)
                    warnings.warn(_XLA_WARNING, stacklevel=3)
                return False
            return original(model)

        return supports_jit

    keras_internals.wrap_model_supports_jit(make_wrapper)
    return True
