"""Trains a small LSTM on every rank; checks falling loss and identical weights.

Usage: fit_policies.py POLICY [--jit] [--wire DTYPE] [--accum K]
Prints one JSON line per rank on success.
"""

import argparse
import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
import keras  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("policy")
p.add_argument("--jit", action="store_true")
p.add_argument("--wire", default="float32")
p.add_argument("--accum", type=int, default=None)
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()

keras.config.set_dtype_policy(args.policy)
rank, size = kmp.rank(), kmp.size()
# Different seeds per rank: the initial broadcast must make them one model.
keras.utils.set_random_seed(1234 + rank)

rng = np.random.default_rng(0)
x = rng.normal(size=(256 * size, 12, 4)).astype("float32")
y = (x[:, :, 0].mean(axis=1, keepdims=True) > 0).astype("float32")
x, y = x[rank::size], y[rank::size]

model = keras.Sequential(
    [
        keras.Input((12, 4)),
        keras.layers.LSTM(16),
        keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
    ]
)
opt = kmp.DistributedOptimizer(
    keras.optimizers.Adam(3e-3), wire_dtype=args.wire, gradient_accumulation_steps=args.accum
)
model.compile(optimizer=opt, loss="binary_crossentropy", jit_compile=args.jit)


def digest():
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


class Check(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        digests = kmp.allgather(np.frombuffer(bytes.fromhex(digest()), dtype=np.uint8)[None])
        same = all((d == digests[0]).all() for d in digests)
        if not same:
            raise SystemExit(f"rank {rank}: weights differ across ranks after epoch {epoch}")


hist = model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=0, callbacks=[Check()])
loss = hist.history["loss"]
print(
    json.dumps(
        {
            "rank": rank,
            "size": size,
            "loss": loss,
            "digest": digest(),
            "scale": float(opt.dynamic_scale.numpy()),
            "scaling": opt.loss_scaling,
            "jit": bool(model.jit_compile),
            "policy": args.policy,
        }
    ),
    flush=True,
)
