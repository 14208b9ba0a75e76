"""What averaging BatchNorm statistics every step costs, at np=2.

    mpirun -np 2 --bind-to core python examples/benchmarks/state_sync.py \\
        --rounds 7 --out docs/benchmarks/state_sync.json

One job builds the stacked-LSTM benchmark model with a BatchNormalization
after each LSTM twice: with `DistributedOptimizer(non_trainable_sync="step")`
(the default: the statistics' changes ride in the per-step metric reduction)
and with `"epoch"` (averaged once per epoch, host side). Rounds alternate
the two (A B, B A, ...); each measurement is `fit` over `--steps` batches
(64 per rank), timed per step after a warm-up. Printed and saved: samples/s
of both per round, the median per-round ratio step/epoch, the per-step time
difference, and what the step mode adds to the per-step MPI message.
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
from keras_mpfp16.benchmark.models import random_data  # noqa: E402
from keras_mpfp16.benchmark.train import seconds_per_step  # noqa: E402
from keras_mpfp16.sync import replica  # noqa: E402


def build(mode: str):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((128, 16)),
            keras.layers.LSTM(128, return_sequences=True),
            keras.layers.BatchNormalization(),
            keras.layers.LSTM(128),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(
        optimizer=kmp.DistributedOptimizer(
            keras.optimizers.Adam(1e-3), non_trainable_sync=mode
        ),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out")
    args = p.parse_args()
    batch, n = 64, kmp.size()
    x, y = random_data(batch * args.steps, 128, 16, seed=kmp.rank())
    models = {m: build(m) for m in ("step", "epoch")}
    for model in models.values():
        seconds_per_step(model, x, y, batch, 5)  # trace and warm up
    times = {m: [] for m in models}
    for r in range(args.rounds):
        order = ("step", "epoch") if r % 2 == 0 else ("epoch", "step")
        for m in order:
            times[m].append(seconds_per_step(models[m], x, y, batch, args.steps))
        if kmp.is_root():
            print(
                f"round {r + 1}: "
                + "  ".join(
                    f"{m}={n * batch / times[m][-1]:.0f} samples/s" for m in models
                ),
                flush=True,
            )
    averaged = replica.averaged_variables(models["step"])
    result = {
        "command": "mpirun -np 2 --bind-to core python examples/benchmarks/state_sync.py "
        + " ".join(sys.argv[1:]),
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d"),
        "size": n,
        "batch_per_rank": batch,
        "samples_per_s": {m: [n * batch / t for t in ts] for m, ts in times.items()},
        "ratio_step_over_epoch": statistics.median(
            e / s for s, e in zip(times["step"], times["epoch"])
        ),
        "extra_ms_per_step": statistics.median(
            (s - e) * 1e3 for s, e in zip(times["step"], times["epoch"])
        ),
        "averaged_values": int(sum(np.prod(v.shape) for v in averaged)),
        "averaged_bytes_per_step": int(8 * sum(np.prod(v.shape) for v in averaged)),
    }
    if kmp.is_root():
        print(json.dumps({k: v for k, v in result.items() if k != "samples_per_s"}))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")


if __name__ == "__main__":
    main()
