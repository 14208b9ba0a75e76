"""One rank runs out of data during `fit` (issue 38, item 3).

Run as `mpirun -np N python data_mismatch.py`. The last rank's training
data has 5 batches, the others' 50 (a pipeline of unknown length, so no
check can see it before the epoch runs), with validation data: the last
rank leaves its epoch and starts validating while the others still train.

Before issue 38 the last rank's test-step metric reduction met the others'
gradient allreduce on the same communicator (MPI matches collectives by
order, whatever their sizes): `MPI_ERR_TRUNCATE` on the rank whose buffer
was too small, and, sometimes, a corrupted heap (glibc
`malloc_consolidate(): invalid chunk size`, SIGABRT). Now train and test
steps reduce on separate communicators: the ranks cannot meet, and the job
ends with the library's error.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

rank, n = kmp.rank(), kmp.size()
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(400, 8)).astype("float32")
y = rng.integers(0, 2, 400).astype("float32")
rows = 40 if rank == n - 1 else 400
train = tf.data.Dataset.from_tensor_slices((x[:rows], y[:rows]))
train = train.filter(lambda a, b: True).batch(8)  # unknown length
model = keras.Sequential(
    [
        keras.Input((8,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(
    kmp.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
    "binary_crossentropy",
    metrics=["accuracy"],
)
model.fit(train, epochs=2, verbose=0, validation_data=(x[:64], y[:64]))
print(f"rank {rank}: fit returned", flush=True)
