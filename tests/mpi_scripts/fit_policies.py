"""Trains a small LSTM under each dtype policy, one model after another.

Each model is built from a different random seed on every rank (the initial
sync must make them one model) and with a fresh DistributedOptimizer (the sync
must work for a second model in the same process). After every epoch the
weights' digests are allgathered and must be identical.

Usage: fit_policies.py [--jit] [--wire DTYPE] [--accum K] [--policies a,b,c]
Prints one JSON line per rank.
"""

import argparse
import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--jit", action="store_true")
p.add_argument("--wire", default="float32")
p.add_argument("--accum", type=int, default=None)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--policies", default="float32,mixed_float16,mixed_bfloat16")
args = p.parse_args()
rank, size = kmp.rank(), kmp.size()


def digest(model):
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.digest()


class SameWeights(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        d = kmp.allgather(np.frombuffer(digest(self.model), dtype=np.uint8)[None])
        if not all((row == d[0]).all() for row in d):
            raise SystemExit(
                f"rank {rank}: weights differ across ranks after epoch {epoch}"
            )


rng = np.random.default_rng(0)
x_all = rng.normal(size=(192 * size, 12, 4)).astype("float32")
y_all = (x_all[:, :, 0].mean(axis=1, keepdims=True) > 0).astype("float32")
x, y = x_all[rank::size], y_all[rank::size]

results = {}
for i, policy in enumerate(args.policies.split(",")):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(1000 * i + 17 * rank + 1)  # differs per rank
    model = keras.Sequential(
        [
            keras.Input((12, 4)),
            keras.layers.LSTM(16),
            keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
        ]
    )
    opt = kmp.DistributedOptimizer(
        keras.optimizers.Adam(3e-3),
        wire_dtype=args.wire,
        gradient_accumulation_steps=args.accum,
    )
    model.compile(optimizer=opt, loss="binary_crossentropy", jit_compile=args.jit)
    hist = model.fit(
        x, y, batch_size=32, epochs=args.epochs, verbose=0, callbacks=[SameWeights()]
    )
    results[policy] = {
        "loss": hist.history["loss"],
        "digest": digest(model).hex(),
        "scale": float(opt.dynamic_scale.numpy()),
        "scaling": opt.loss_scaling,
        "skipped": int(opt.skipped_steps.numpy()),
        "jit": bool(model.jit_compile),
    }
print(json.dumps({"rank": rank, "size": size, "results": results}), flush=True)
