"""What `kmp.layers.SyncBatchNormalization` costs per step against Keras's layer.

    mpirun -np 2 --bind-to none python examples/benchmarks/sync_batch_norm.py \\
        --rounds 7 --out docs/benchmarks/sync_batch_norm.json

Two models, each built twice (Keras's `BatchNormalization`, then
`SyncBatchNormalization` in its place), all with `DistributedOptimizer`:

- "guide": keras.io's "Working with RNNs" model, LSTM(64) -> BatchNorm ->
  Dense(10) on 28x28 inputs (one BatchNorm of 64 features, 2-D input);
- "stacked": the benchmark model of docs/benchmarks.md with a BatchNorm after
  each LSTM (128 steps x 16 features, LSTM(128, sequences) -> BatchNorm over
  3-D input -> LSTM(128) -> BatchNorm -> Dense(1)).

Rounds alternate the configurations (plain, sync / sync, plain, ...); each
measurement is one `fit` over `--steps` batches of 64 rows per rank, timed
per step after skipping the first steps (the slowest rank's time). Printed
and saved: the raw seconds per step, the median per-round ratio sync/plain
and the median extra milliseconds per step.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.benchmark.train import seconds_per_step  # noqa: E402

NORMS = {
    "plain": keras.layers.BatchNormalization,
    "sync": kmp.layers.SyncBatchNormalization,
}


def build(model: str, norm: str):
    keras.utils.set_random_seed(0)
    bn = NORMS[norm]
    if model == "guide":
        layers = [
            keras.Input((28, 28)),
            keras.layers.LSTM(64),
            bn(),
            keras.layers.Dense(10),
        ]
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        optimizer = "sgd"
    else:
        layers = [
            keras.Input((128, 16)),
            keras.layers.LSTM(128, return_sequences=True),
            bn(),
            keras.layers.LSTM(128),
            bn(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
        loss = "binary_crossentropy"
        optimizer = "adam"
    m = keras.Sequential(layers)
    m.compile(optimizer=kmp.DistributedOptimizer(optimizer), loss=loss)
    return m


def data(model: str, rows: int):
    rng = np.random.default_rng(kmp.rank())
    if model == "guide":
        return rng.random((rows, 28, 28), "float32"), rng.integers(0, 10, rows)
    x = rng.normal(size=(rows, 128, 16)).astype("float32")
    return x, (rng.random(rows) < 0.5).astype("float32")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--models", default="guide,stacked")
    p.add_argument("--out")
    args = p.parse_args()
    batch, n = 64, kmp.size()
    result = {
        "command": "mpirun -np "
        + str(n)
        + " --bind-to none python examples/benchmarks/sync_batch_norm.py "
        + " ".join(sys.argv[1:]),
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d"),
        "size": n,
        "batch_per_rank": batch,
        "steps_per_measurement": args.steps,
        "models": {},
    }
    for name in args.models.split(","):
        x, y = data(name, batch * args.steps)
        models = {norm: build(name, norm) for norm in NORMS}
        for model in models.values():
            seconds_per_step(model, x, y, batch, 5)  # trace and warm up
        times = {norm: [] for norm in models}
        for r in range(args.rounds):
            order = ("plain", "sync") if r % 2 == 0 else ("sync", "plain")
            for norm in order:
                times[norm].append(
                    seconds_per_step(models[norm], x, y, batch, args.steps)
                )
            if kmp.is_root():
                print(
                    f"{name} round {r + 1}: "
                    + "  ".join(
                        f"{k}={v[-1] * 1e3:.1f} ms/step" for k, v in times.items()
                    ),
                    flush=True,
                )
        result["models"][name] = {
            "seconds_per_step": times,
            "ratio_sync_over_plain": statistics.median(
                s / p for p, s in zip(times["plain"], times["sync"])
            ),
            "extra_ms_per_step": statistics.median(
                (s - p) * 1e3 for p, s in zip(times["plain"], times["sync"])
            ),
            "batch_norm_features": [
                int(layer.moving_mean.shape[0])
                for layer in models["sync"].layers
                if isinstance(layer, keras.layers.BatchNormalization)
            ],
        }
    if kmp.is_root():
        print(
            json.dumps(
                {
                    k: {
                        m: {a: b for a, b in v.items() if a != "seconds_per_step"}
                        for m, v in result["models"].items()
                    }
                    for k in ["models"]
                }
            )
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")


if __name__ == "__main__":
    main()
