"""keras.io's "Bidirectional LSTM on IMDB", in miniature, made data-parallel.

The three lines marked `# kmp` are the whole change (docs/callbacks.md);
everything else is the example as published, with synthetic integer
sequences standing in for `keras.datasets.imdb.load_data` and smaller sizes.
The block at the end is test harness only: it reports what the test checks.
"""

import keras
import numpy as np
from keras import layers

import keras_mpfp16 as kmp  # kmp

max_features = 200  # Only consider the top 200 words
maxlen = 20  # Only consider the first 20 words of each movie review

# Input for variable-length sequences of integers
inputs = keras.Input(shape=(None,), dtype="int32")
# Embed each integer in an 8-dimensional vector
x = layers.Embedding(max_features, 8)(inputs)
# Add 2 bidirectional LSTMs
x = layers.Bidirectional(layers.LSTM(4, return_sequences=True))(x)
x = layers.Bidirectional(layers.LSTM(4))(x)
# Add a classifier
outputs = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, outputs)
model.summary()


def load_data(num_words, n_train=197, n_val=64, seed=0):
    """Stand-in for keras.datasets.imdb.load_data: lists of word indices."""
    rng = np.random.default_rng(seed)

    def reviews(n):
        xs = [rng.integers(1, num_words, size=rng.integers(5, 40)) for _ in range(n)]
        ys = np.array([int(np.mean(r) > num_words / 2) for r in xs])
        return xs, ys

    return reviews(n_train), reviews(n_val)


(x_train, y_train), (x_val, y_val) = load_data(num_words=max_features)
# Use pad_sequence to standardize sequence length:
# this will truncate sequences longer than 20 words and zero-pad shorter ones.
x_train = keras.utils.pad_sequences(x_train, maxlen=maxlen)
x_val = keras.utils.pad_sequences(x_val, maxlen=maxlen)
x_train, y_train = kmp.shard(x_train, y_train)  # kmp

model.compile(
    optimizer=kmp.DistributedOptimizer("adam"),  # kmp
    loss="binary_crossentropy",
    metrics=["accuracy"],
)
history = model.fit(
    x_train, y_train, batch_size=32, epochs=2, validation_data=(x_val, y_val)
)

# -- test harness only ------------------------------------------------------------
import hashlib  # noqa: E402
import json  # noqa: E402


def row_ids(rows):
    return [int.from_bytes(hashlib.sha1(r.tobytes()).digest()[:7], "big") for r in rows]


h = hashlib.sha256(
    b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
)
digests = kmp.allgather(np.frombuffer(h.digest(), dtype=np.uint8)[None])
ids = kmp.allgather(np.array(row_ids(x_train), dtype=np.int64))
print(
    json.dumps(
        {
            "rank": kmp.rank(),
            "size": kmp.size(),
            "rows_here": len(x_train),
            "same_weights": bool(all((d == digests[0]).all() for d in digests)),
            "rows_total": int(ids.size),
            "rows_distinct": int(np.unique(ids).size),
            "val_loss": history.history["val_loss"],
        }
    ),
    flush=True,
)
