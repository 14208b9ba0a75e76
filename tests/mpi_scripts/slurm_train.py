"""A whole small training script, as a user launches it under srun or mpirun.

The same file is the `train.py` of the documented batch script
(examples/slurm/train.sbatch) in tests/test_slurm.py. The block at the end
is test harness only: one JSON line per rank with a digest of every weight.
"""

import keras
import numpy as np

import keras_mpfp16 as kmp

keras.utils.set_random_seed(7)
rng = np.random.default_rng(0)
x = rng.normal(size=(480, 8)).astype("float32")
y = (x[:, 0] - 0.5 * x[:, 1] + 0.25 * x[:, 2] > 0).astype("float32")
x_val, y_val = x[:96], y[:96]
x_train, y_train = kmp.shard(x[96:], y[96:])

model = keras.Sequential(
    [
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(
    optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(0.01)),
    loss="binary_crossentropy",
)
history = model.fit(
    x_train,
    y_train,
    batch_size=16,
    epochs=3,
    validation_data=(x_val, y_val),
    verbose=2,
)

# -- test harness only ------------------------------------------------------------
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

digest = hashlib.sha256(
    b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
).hexdigest()[:16]
print(
    json.dumps(
        {
            "rank": kmp.rank(),
            "size": kmp.size(),
            "digest": digest,
            "val_loss": history.history["val_loss"],
            "slurm_procid": os.environ.get("SLURM_PROCID"),
        }
    ),
    flush=True,
)
