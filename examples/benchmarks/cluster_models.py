"""The cluster benchmark's models and data, for any Keras (3 for ours, 2 for Horovod).

`build(keras, model)` takes the Keras module to build with, so the Horovod
worker (TF 2.15's Keras 2, no keras_mpfp16) builds exactly the models
cluster_worker.py measures.

Models (per-rank batch):
  facts  Input(128, 16) -> LSTM(128, seq) -> LSTM(128) -> Dense(1), Adam, 64
  dense  Input(2048) -> Dense(4096) -> Dense(4096) -> Dense(1), SGD, 32
         (25,178,113 parameters: communication-heavy)
  imdb   Embedding(20000, 128) -> LSTM(32) -> Dense(1), Adam, 32 x 200 tokens
"""

import numpy as np

MODELS = ("facts", "dense", "imdb")
DEFAULT_STEPS = {"facts": 16, "dense": 6, "imdb": 12}


def build(keras, model: str):
    keras.utils.set_random_seed(0)
    if model == "facts":
        m = keras.Sequential(
            [
                keras.Input((128, 16)),
                keras.layers.LSTM(128, return_sequences=True),
                keras.layers.LSTM(128),
                keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
            ]
        )
        return m, keras.optimizers.Adam(1e-3), 64
    if model == "dense":
        m = keras.Sequential(
            [
                keras.Input((2048,)),
                keras.layers.Dense(4096, activation="relu"),
                keras.layers.Dense(4096, activation="relu"),
                keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
            ]
        )
        return m, keras.optimizers.SGD(0.01), 32
    if model == "imdb":
        m = keras.Sequential(
            [
                keras.Input((200,), dtype="int32"),
                keras.layers.Embedding(20000, 128),
                keras.layers.LSTM(32),
                keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
            ]
        )
        return m, keras.optimizers.Adam(1e-3), 32
    raise ValueError(f"unknown model {model!r}; allowed: facts, dense, imdb")


def data(model: str, samples: int, seed: int):
    rng = np.random.default_rng(seed)
    y = (rng.random((samples, 1)) > 0.5).astype("float32")
    if model == "facts":
        return rng.normal(size=(samples, 128, 16)).astype("float32"), y
    if model == "dense":
        return rng.normal(size=(samples, 2048)).astype("float32"), y
    return rng.integers(0, 20000, size=(samples, 200)).astype("int32"), y
