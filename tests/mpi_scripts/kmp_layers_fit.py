"""keras_mpfp16's own recurrent layers trained on N ranks, under each policy.

For float32, mixed_float16 and mixed_bfloat16:
(a) keras.io's bidirectional-LSTM shape with the project's layers:
    Embedding(mask_zero) -> Bidirectional(kmp LSTM, sequences) ->
    Bidirectional(kmp GRU) -> Dense, variable-length padded inputs with an
    unknown time dimension, rows per rank not a multiple of the batch (a
    partial last batch), unsharded validation data;
(b) stateful lanes (LaneBatcher + reset_lanes) trained with train_on_batch
    in a custom loop.
Prints per policy: whether every loss was finite, a digest of every model
and optimizer variable (must be equal on all ranks; for (b) the trainable
ones: the lane states are per rank by design).
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import digest, state_digest  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.layers import GRU, LSTM, LaneBatcher, reset_lanes  # noqa: E402

rank, n = kmp.rank(), kmp.size()


def reviews(seed, count, vocab=60, maxlen=12):
    rng = np.random.default_rng(seed)
    rows = [
        rng.integers(1, vocab, size=rng.integers(3, maxlen + 1)) for _ in range(count)
    ]
    y = np.array([float(np.mean(r) > vocab / 2) for r in rows], "float32")
    return keras.utils.pad_sequences(rows, maxlen=maxlen), y


out = {}
for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(10 + rank)  # unseeded ranks: rank 0 wins
    x, y = reviews(1, 37 * n + 5)
    xv, yv = reviews(2, 23)
    inputs = keras.Input(shape=(None,), dtype="int32")
    h = keras.layers.Embedding(60, 8, mask_zero=True)(inputs)
    h = keras.layers.Bidirectional(LSTM(6, return_sequences=True))(h)
    h = keras.layers.Bidirectional(GRU(6))(h)
    outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=kmp.DistributedOptimizer("adam"),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    xs, ys = kmp.shard(x, y)  # 37 + 2 rows per rank: batches of 16, 16, 7
    hist = model.fit(
        xs, ys, batch_size=16, epochs=2, validation_data=(xv, yv), verbose=0
    )
    losses = hist.history["loss"] + hist.history["val_loss"]

    # (b) lanes: every rank has sequences of the same lengths (equal chunk
    # counts, hence equal steps), different values.
    rng = np.random.default_rng(100 + rank)
    sequences = [rng.normal(size=(m, 2)).astype("float32") for m in (9, 5, 7, 6)]
    targets = [rng.normal(size=(len(s), 1)).astype("float32") for s in sequences]
    keras.utils.set_random_seed(20 + rank)
    lanes = keras.Sequential(
        [
            keras.Input(batch_shape=(2, 4, 2)),
            LSTM(4, stateful=True, return_sequences=True),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    lanes.compile(optimizer=kmp.DistributedOptimizer("adam"), loss="mse")
    for chunk in LaneBatcher(sequences, targets, lanes=2, chunk_length=4):
        reset_lanes(lanes, chunk.reset)
        losses.append(
            float(
                lanes.train_on_batch(
                    chunk.x, chunk.y, sample_weight=chunk.sample_weight
                )
            )
        )
    out[policy] = {
        "finite": bool(np.all(np.isfinite(losses))),
        "digest": state_digest(model),
        "lanes_digest": digest(lanes.trainable_variables),
        "val_accuracy": hist.history["val_accuracy"],
    }
keras.config.set_dtype_policy("float32")
print(json.dumps({"rank": rank, "size": n, "policies": out}), flush=True)
