"""Running a callback on rank 0 only (checkpoints, TensorBoard, CSV logs)."""

from __future__ import annotations

import keras

from keras_mpfp16.callbacks.wrapper import CallbackWrapper
from keras_mpfp16.runtime.mpi import world


class RootOnly(CallbackWrapper):
    """Stands in for a callback on ranks other than 0: does nothing.

    It still forwards `set_model` and `set_params`, so the wrapped callback
    has its model and parameters on every rank (code that inspects it, or a
    `get_config`, works the same everywhere). Its batch hooks are Keras's
    defaults, so it does not switch off Keras's asynchronous batch-callback
    dispatch. Made by `root_only`.

    Args:
        callback: The callback that runs on rank 0.
    """

    async_safe = True

    def __init__(self, callback: keras.callbacks.Callback):
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(
                "root_only expects a keras.callbacks.Callback; received an "
                f"object of type {type(callback).__name__}."
            )
        super().__init__(callback)


def root_only(callback: keras.callbacks.Callback) -> keras.callbacks.Callback:
    """Runs `callback` on rank 0 only.

    For your own callbacks that write files or print. (`fit` of a model
    compiled with a `DistributedOptimizer` already runs Keras's
    `ModelCheckpoint`, `CSVLogger`, `TensorBoard` and `RemoteMonitor` on rank
    0 only, and `BackupAndRestore` safely.) Never for callbacks that change
    training (`EarlyStopping`, `ReduceLROnPlateau`, `TerminateOnNaN`): every
    rank must take those decisions together, so run them on all ranks; they
    see the same, global logs (`fit` of a `DistributedOptimizer` model
    refuses them on rank 0 only, on every rank, with one error).

    Args:
        callback: A Keras callback.

    Returns:
        `callback` itself on rank 0; on other ranks a `RootOnly` that does
        nothing but forward `set_model`/`set_params` to it.

    Example:

    ```python
    import keras_mpfp16 as kmp

    callbacks = [kmp.callbacks.root_only(MyPlotWriter("plots/"))]
    ```
    """
    if not isinstance(callback, keras.callbacks.Callback):
        raise TypeError(
            "root_only expects a keras.callbacks.Callback; received an object "
            f"of type {type(callback).__name__}."
        )
    return callback if world.is_root() else RootOnly(callback)
