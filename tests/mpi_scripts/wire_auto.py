"""`wire_dtype="auto"` in a real fit (tests/test_wire_auto.py).

Usage: wire_auto.py DIR MODE

MODE:
  split   injected timings that differ by rank: rank 0 measures float16 twice
          as fast as float32, the last rank measures it twice as slow; the
          slowest rank sets the pace, so every rank must apply float32.
  f16     injected timings, different numbers on every rank, all favouring
          float16, for the reductions and for whole steps: every rank
          switches to float16 (the step is re-traced).
  steps32 the reductions favour float16 (as in f16) but whole train steps
          favour float32 (injected, different on every rank): the trial
          runs float16 steps, then every rank returns to float32.
  pin     KERAS_MPFP16_WIRE_AUTO pins the wire (set by the test): the hook
          raises if anything measures.
  real    no injection: the backend's probe times both wires.
  sparse  an Embedding-only model (sparse gradients only): float32 without
          measuring (the hook raises if called).

Every mode records a timeline (DIR/trace.json). Prints one JSON line per
rank: the decision, the wire the step ran with, the final weights' checksum.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.runtime.mpi import wire_tuner  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
rank, size = kmp.rank(), kmp.size()
calls = []


def injected(distinct):
    calls.append(list(distinct))
    if mode in ("pin", "sparse"):
        raise AssertionError("measured although the decision needs no measurement")
    if mode == "split":
        f16 = 0.5 if rank == 0 else (2.0 if rank == size - 1 else 1.0)
        per = {"float32": [1.0, 1.1, 0.9], "float16": [f16] * 3}
    else:  # f16: each rank its own numbers, float16 always faster
        per = {
            "float32": [1.0 + rank, 1.2 + rank, 0.8 + rank],
            "float16": [0.3 + 0.1 * rank] * 3,
        }
    return {s: {w: [t * s * 1e-6 for t in v] for w, v in per.items()} for s in distinct}


def injected_steps(wire, seconds):
    # Rank-dependent numbers; the slowest rank decides.
    fast = [0.010 + 0.001 * rank] * len(seconds)
    slow = [0.020 + 0.002 * rank] * len(seconds)
    if mode == "steps32":
        return fast if wire == "float32" else slow
    return fast if wire == "float16" else slow


if mode != "real":
    wire_tuner.timings_hook = injected
    wire_tuner.step_times_hook = injected_steps

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
if mode == "sparse":
    x = rng.integers(0, 50, size=(64 * size, 5)).astype("int32")
    y = rng.normal(size=(64 * size, 4)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(50, 4),
            keras.layers.GlobalAveragePooling1D(),
        ]
    )
    loss = "mse"
else:
    x = rng.normal(size=(64 * size, 16)).astype("float32")
    y = (x.mean(axis=1, keepdims=True) > 0).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    loss = "binary_crossentropy"
x, y = kmp.shard(x, y)
opt = kmp.DistributedOptimizer("sgd", wire_dtype="auto", bucket_size_mb=0.01)
model.compile(optimizer=opt, loss=loss)
timeline = kmp.callbacks.Timeline(f"{out_dir}/trace.json")
model.fit(x, y, batch_size=8, epochs=2, callbacks=[timeline], verbose=0)

decision = opt.wire_decision
weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
print(
    json.dumps(
        {
            "rank": rank,
            "decision": None if decision is None else decision.as_dict(),
            "effective": opt.effective_wire_dtype,
            "config_wire": opt.get_config()["wire_dtype"],
            "measured_sizes": calls,
            "weights_sum": float(np.sum(weights.astype(np.float64))),
            "weights_bytes": weights.tobytes().hex()[:64],
        }
    ),
    flush=True,
)
