"""`CallbackWrapper`: a callback that stands in front of another one."""

from __future__ import annotations

import keras


class CallbackWrapper(keras.callbacks.Callback):
    """Holds `callback` and forwards `set_model` / `set_params` to it.

    The wrapped callback then has its model and parameters on every rank,
    whatever the wrapper does with the other hooks (code that inspects it,
    or a `get_config`, works the same everywhere). Subclasses decide which
    hooks run the wrapped callback.

    Args:
        callback: The wrapped callback.
    """

    def __init__(self, callback: keras.callbacks.Callback):
        super().__init__()
        self.callback = callback

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)
