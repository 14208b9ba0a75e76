"""Backend bridges: how collectives are called from inside a compiled train step.

Each supported Keras backend has one module here; the rest of the library asks
for the active one with `bridge()` and never touches backend tensors itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUPPORTED = ("tensorflow",)


def bridge() -> ModuleType:
    """The bridge module for the active Keras backend.

    Raises:
        NotImplementedError: on a backend without a bridge yet.
    """
    import keras

    name = keras.backend.backend()
    if name not in SUPPORTED:
        raise NotImplementedError(
            f"keras_mpfp16's DistributedOptimizer supports the Keras backends "
            f"{', '.join(SUPPORTED)}; the active backend is {name!r}. Set "
            "KERAS_BACKEND=tensorflow. (keras_mpfp16.layers work on every backend.)"
        )
    return importlib.import_module(f"keras_mpfp16.backend.{name}")
