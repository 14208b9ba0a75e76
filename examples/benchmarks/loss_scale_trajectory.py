"""The loss scale over a mixed_float16 run, recorded every step on every rank.

    mpirun -np 2 python examples/benchmarks/loss_scale_trajectory.py --out docs/benchmarks/loss_scale.json

Trains the benchmark-style stacked LSTM on the synthetic precursor task of
examples/train_keras.py under mixed_float16, starting from the largest scale
(2**24, where the fp16 gradients overflow) with a short growth interval (100
steps), so backoff and growth both show in a few minutes. Every rank
records (scale, skipped steps) after each batch; the script checks the
trajectories are identical on all ranks and writes rank 0's.
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_keras import make_data  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--growth-interval", type=int, default=100)
    p.add_argument("--initial-scale", type=float, default=2.0**24)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--out")
    args = p.parse_args()
    keras.config.set_dtype_policy("mixed_float16")
    x, y = make_data(args.samples, 64, 4, seed=0)
    x, y = kmp.shard(x, y, batch_size=32)
    model = keras.Sequential(
        [
            keras.Input((64, 4)),
            keras.layers.LSTM(64, return_sequences=True),
            keras.layers.LSTM(64),
            keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
        ]
    )
    opt = kmp.DistributedOptimizer(
        keras.optimizers.Adam(3e-3),
        initial_scale=args.initial_scale,
        growth_interval=args.growth_interval,
    )
    model.compile(optimizer=opt, loss="binary_crossentropy")
    trace = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            trace.append(
                (float(opt.dynamic_scale.numpy()), int(opt.skipped_steps.numpy()))
            )

    model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=0, callbacks=[Record()])
    everyone = kmp.allgather(np.asarray(trace, dtype=np.float64)[None])
    identical = all((t == everyone[0]).all() for t in everyone)
    if kmp.is_root():
        scales = [s for s, _ in trace]
        print(
            f"{len(trace)} steps on {kmp.size()} ranks; identical on all ranks: {identical}; "
            f"scale from {scales[0]:g} to {scales[-1]:g} (min {min(scales):g}, max {max(scales):g}); "
            f"skipped steps: {trace[-1][1]}"
        )
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(
                json.dumps(
                    {
                        "ranks": kmp.size(),
                        "identical_on_all_ranks": identical,
                        "growth_interval": args.growth_interval,
                        "initial_scale": args.initial_scale,
                        "scale": scales,
                        "skipped": [k for _, k in trace],
                    }
                )
            )


if __name__ == "__main__":
    main()
