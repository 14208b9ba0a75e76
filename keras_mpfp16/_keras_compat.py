"""The one place that reaches into Keras internals, each use guarded.

XLA: a model trained by a DistributedOptimizer on more than one process calls
MPI from the host in the middle of its train step, which XLA cannot compile.
Keras decides whether to compile with `keras.src.trainers.trainer.
model_supports_jit`, both for `jit_compile="auto"` (True on GPU machines) and
for an explicit `jit_compile=True`. We wrap that function so such models
answer False: Keras then trains without XLA instead of crashing, and we warn
once saying why. If a future Keras moves the function, nothing is patched and
the optimizer's own check raises a clear error instead.
"""

from __future__ import annotations

import warnings

_XLA_WARNING = (
    "keras_mpfp16: XLA compilation (jit_compile) is turned off for this model: "
    "with more than one process the DistributedOptimizer reduces gradients "
    "with an MPI call from the host inside the train step, which XLA cannot "
    "compile. The model trains without XLA."
)


def install_jit_guard() -> bool:
    """Installs the XLA guard; returns False if this Keras has no hook for it."""
    try:
        from keras.src.trainers import trainer as trainer_module
    except ImportError:
        return False
    original = getattr(trainer_module, "model_supports_jit", None)
    if original is None:
        return False
    if getattr(original, "_keras_mpfp16_guard", False):
        return True

    warned = []

    def model_supports_jit(model):
        from keras_mpfp16 import runtime
        from keras_mpfp16.optimizer import DistributedOptimizer

        optimizer = getattr(model, "optimizer", None)
        if isinstance(optimizer, DistributedOptimizer) and runtime.size() > 1:
            if not warned:
                warned.append(True)
                warnings.warn(_XLA_WARNING, stacklevel=3)
            return False
        return original(model)

    model_supports_jit._keras_mpfp16_guard = True
    trainer_module.model_supports_jit = model_supports_jit
    return True
