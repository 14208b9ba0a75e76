"""N ranks with gathered Embedding gradients == one process on the whole batch.

Like equivalence.py, for an Embedding model trained with Adam: rank r gets
rows [k*N*b + r*b, k*N*b + (r+1)*b) of every global batch k, gradients of the
Embedding are gathered (KERAS_MPFP16_SPARSE_GRADIENTS=sparse), and rank 0
then trains the same initial model alone with a plain Adam on batch N*b.
Adam is not linear in the gradient: Keras squares the *slices* of an
IndexedSlices gradient (repeated rows included) for its second moment, so
only handing the inner optimizer every rank's slices reproduces one process.

Prints one JSON line per rank: {"rank", "max_rel_diff", "moved"} (rank 0
compares).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_MPFP16_SPARSE_GRADIENTS"] = "sparse"

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import against_one_process, emit  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

rank, n = kmp.rank(), kmp.size()
VOCAB, DIM, T, b, steps = 400, 8, 10, 8, 6
rng = np.random.default_rng(42)
total = steps * n * b
# Zipf-like tokens: frequent words repeat inside a batch.
x = np.minimum(rng.zipf(1.3, size=(total, T)), VOCAB - 1).astype("int32")
y = rng.normal(size=(total, 1)).astype("float32")


def build():
    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            keras.layers.Embedding(VOCAB, DIM),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )


# This rank's rows: batch s is block s*n + rank.
result = against_one_process(build, lambda: keras.optimizers.Adam(0.05), (x, y), b)
emit(result)
