"""An Embedding model trained with sparse (allgathered) and dense gradients.

Every configuration starts from the same weights (rank 0's, synced in the
first step) and trains one epoch on each rank's own tokens with SGD, whose
update is linear in the gradient: the sparse path
(KERAS_MPFP16_SPARSE_GRADIENTS=sparse) must give the dense path's weights to
float tolerance, and `auto` must pick the gather for this shape. Runs under
float32 and mixed_float16 (loss scaling), and with a float16 wire. (Adam is
not linear in the gradient: there the reference is one process, see
sparse_equivalence.py.)

Prints one JSON line per rank.
"""

import json
import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from call_counter import counting, gradient_calls  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.backend import tf_sparse  # noqa: E402

rank, n = kmp.rank(), kmp.size()
VOCAB, DIM, T, B, STEPS = 3000, 16, 12, 8, 6
rng = np.random.default_rng(rank)
# Zipf-like tokens: frequent words repeat inside a batch (duplicates to sum).
tokens = np.minimum(rng.zipf(1.3, size=(B * STEPS, T)), VOCAB - 1).astype("int32")
labels = rng.random((B * STEPS, 1)).astype("float32")


def build():
    keras.utils.set_random_seed(1234)
    return keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            keras.layers.Embedding(VOCAB, DIM),
            keras.layers.LSTM(8),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )


def train(mode, policy, wire="float32"):
    os.environ[tf_sparse.SPARSE_ENV] = mode
    keras.config.set_dtype_policy(policy)
    model = build()
    opt = kmp.DistributedOptimizer(keras.optimizers.SGD(0.5), wire_dtype=wire)
    model.compile(optimizer=opt, loss="mse")
    with counting() as calls:
        model.fit(tokens, labels, batch_size=B, epochs=1, shuffle=False, verbose=0)
    weights = model.get_weights()
    crc = 0
    for a in weights:
        crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1), crc)
    return {
        "weights": weights,
        "digest": crc,
        "allgathers": gradient_calls(calls).get("Allgatherv", 0),
        "skipped": int(opt.skipped_steps.numpy()),
        "scale": float(opt.dynamic_scale.numpy()),
    }


def max_rel_diff(a, b):
    return max(
        float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12)) for x, y in zip(a, b)
    )


out = {"rank": rank, "size": n}
initial = build().get_weights()
for policy in ("float32", "mixed_float16"):
    runs = {mode: train(mode, policy) for mode in ("dense", "sparse", "auto")}
    dense = runs["dense"]
    for mode in ("sparse", "auto"):
        out[f"{policy}_{mode}_vs_dense"] = max_rel_diff(
            runs[mode]["weights"], dense["weights"]
        )
    out[f"{policy}_moved"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(dense["weights"], initial)
    )
    for mode, r in runs.items():
        out[f"{policy}_{mode}_digest"] = r["digest"]
        out[f"{policy}_{mode}_allgathers"] = r["allgathers"]
        out[f"{policy}_{mode}_skipped"] = r["skipped"]
        out[f"{policy}_{mode}_scale"] = r["scale"]
keras.config.set_dtype_policy("float32")
r16 = train("auto", "float32", wire="float16")
out["float16_wire_auto_digest"] = r16["digest"]
out["float16_wire_auto_allgathers"] = r16["allgathers"]
out["float16_wire_auto_vs_dense"] = max_rel_diff(
    r16["weights"], train("dense", "float32", wire="float16")["weights"]
)
print(json.dumps(out), flush=True)
