"""Under mixed_float16 one rank alone gets an overflowing batch.

Every rank must skip that step, back the scale off identically, and keep
bitwise-identical weights. Prints one JSON line per rank.
"""

import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

keras.config.set_dtype_policy("mixed_float16")
rank, n = kmp.rank(), kmp.size()
keras.utils.set_random_seed(3)
rng = np.random.default_rng(rank)
b, steps, bad_step = 16, 6, 2
x = rng.normal(size=(steps * b, 8, 3)).astype("float32")
y = rng.normal(size=(steps * b, 1)).astype("float32")
if rank == n - 1:
    # Finite in float32, inf once cast to float16 inside the model.
    x[bad_step * b : (bad_step + 1) * b] *= 1e6

model = keras.Sequential(
    [keras.Input((8, 3)), keras.layers.LSTM(8), keras.layers.Dense(1, dtype="float32")]
)
opt = kmp.DistributedOptimizer("adam", initial_scale=2.0**10)
model.compile(optimizer=opt, loss="mse")

scales = []


class Record(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        scales.append(float(opt.dynamic_scale.numpy()))


model.fit(x, y, batch_size=b, epochs=1, shuffle=False, verbose=0, callbacks=[Record()])
h = hashlib.sha256()
for w in model.get_weights():
    h.update(np.ascontiguousarray(w).tobytes())
print(
    json.dumps(
        {
            "rank": rank,
            "scales": scales,
            "skipped": int(opt.skipped_steps.numpy()),
            "iterations": int(opt.iterations.numpy()),
            "digest": h.hexdigest(),
            "finite_weights": bool(
                all(np.isfinite(w).all() for w in model.get_weights())
            ),
        }
    ),
    flush=True,
)
