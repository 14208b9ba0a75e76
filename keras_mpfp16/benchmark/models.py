"""The benchmark model and its synthetic data."""

from __future__ import annotations

import numpy as np

from keras_mpfp16 import _validate


def stacked_lstm(
    timesteps: int = 128,
    features: int = 16,
    units: int = 128,
    layers: int = 2,
    layer_impl: str = "keras",
):
    """FACTS.md's benchmark: `[Input(T, F), LSTM(u, return_sequences)..., LSTM(u), Dense(1)]`.

    Args:
        layer_impl: `"keras"` for `keras.layers.LSTM` or `"mpfp16"` for
            `keras_mpfp16.layers.LSTM`.
    """
    import keras

    if layer_impl == "keras":
        lstm = keras.layers.LSTM
    elif layer_impl == "mpfp16":
        from keras_mpfp16.layers import LSTM as lstm
    else:
        _validate.one_of("layer_impl", layer_impl, ("keras", "mpfp16"))  # raises
    stack = [keras.Input((timesteps, features))]
    for i in range(layers):
        stack.append(lstm(units, return_sequences=i < layers - 1))
    stack.append(keras.layers.Dense(1, activation="sigmoid", dtype="float32"))
    return keras.Sequential(stack)


def random_data(samples: int, timesteps: int, features: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, timesteps, features)).astype("float32")
    y = (rng.random((samples, 1)) > 0.5).astype("float32")
    return x, y


def count_params(model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))
