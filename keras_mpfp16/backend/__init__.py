"""Backend bridges: how collectives are called from inside a compiled train step.

Each supported Keras backend has one module here (`backend/tensorflow.py`,
the TensorFlow bridge); the rest of the library asks for the active one with
`bridge()` and never touches backend tensors itself. As Keras picks its
backend trainer, `bridge()` names each bridge module explicitly; it imports
it on first use, so importing this package does not import TensorFlow.
"""

from __future__ import annotations

from types import ModuleType

SUPPORTED = ("tensorflow",)


def bridge() -> ModuleType:
    """The bridge module for the active Keras backend.

    Returns:
        `keras_mpfp16.backend.tensorflow` on the TensorFlow backend.

    Raises:
        NotImplementedError: on a backend without a bridge yet.
    """
    import keras

    name = keras.backend.backend()
    if name == "tensorflow":
        from keras_mpfp16.backend import tensorflow as tensorflow_bridge

        return tensorflow_bridge
    raise NotImplementedError(
        f"keras_mpfp16's DistributedOptimizer supports the Keras backends "
        f"{', '.join(SUPPORTED)}; the active backend is {name!r}. Set "
        "KERAS_BACKEND=tensorflow. (keras_mpfp16.layers work on every backend.)"
    )
