"""XLA (`jit_compile=True`) with keras_mpfp16's LSTM/GRU: CPU train-step time
against Keras's layer and against no XLA, side by side.

Per layer kind and policy, four models with the same weights,
`Input -> RNN(return_sequences) -> Dense(1, float32)`, Adam, MSE, trained with
`train_on_batch`: Keras's layer and ours, each compiled with
`jit_compile=False` and `jit_compile=True`. They are timed interleaved in
every round (this machine's step times drift in streaks); reported are the
medians over rounds of the per-round ratios, the raw times, whether Keras
kept XLA on (`model.jit_compile` after the first step) and the largest
difference between the XLA and non-XLA predictions after the same training
steps.

    python examples/benchmarks/layers_xla.py --out layers_xla.json
    python examples/benchmarks/layers_xla.py --quick   # CI smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mpfp16 import layers as mp_layers  # noqa: E402

KERAS_CLASSES = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
OUR_CLASSES = {"lstm": mp_layers.LSTM, "gru": mp_layers.GRU}
CONFIGS = ("keras", "keras+xla", "ours", "ours+xla")
RATIOS = {
    "ours+xla / ours": ("ours+xla", "ours"),
    "ours+xla / keras+xla": ("ours+xla", "keras+xla"),
    "ours+xla / keras": ("ours+xla", "keras"),
    "ours / keras": ("ours", "keras"),
    "keras+xla / keras": ("keras+xla", "keras"),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru"]
    )
    parser.add_argument(
        "--policies", nargs="+", default=["float32", "mixed_float16", "mixed_bfloat16"]
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.features, args.units = 4, 16, 4, 8
        args.steps, args.rounds = 2, 2
    return args


def make_model(cls, args, jit):
    model = keras.Sequential(
        [
            keras.Input((args.length, args.features)),
            cls(args.units, return_sequences=True),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", jit_compile=jit)
    return model


def time_steps(model, x, y, steps):
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / steps


def measure(args):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.length, args.features)).astype("float32")
    y = rng.normal(size=(args.batch, args.length, 1)).astype("float32")
    results = []
    for kind in args.layers:
        for policy in args.policies:
            keras.config.set_dtype_policy(policy)
            keras.utils.set_random_seed(0)
            models = {
                "keras": make_model(KERAS_CLASSES[kind], args, False),
                "keras+xla": make_model(KERAS_CLASSES[kind], args, True),
                "ours": make_model(OUR_CLASSES[kind], args, False),
                "ours+xla": make_model(OUR_CLASSES[kind], args, True),
            }
            weights = models["keras"].get_weights()
            for model in models.values():
                model.set_weights(weights)
            # The same two training steps on each, then compare predictions.
            for model in models.values():
                time_steps(model, x, y, 2)
            pred = {
                n: np.asarray(m.predict_on_batch(x), "float64")
                for n, m in models.items()
            }
            xla_kept = {n: bool(m.jit_compile) for n, m in models.items()}
            raw = {n: [] for n in models}
            for _ in range(args.rounds):
                for name, model in models.items():
                    raw[name].append(time_steps(model, x, y, args.steps))
            row = {
                "layer": kind,
                "policy": policy,
                "xla_kept": xla_kept,
                "max_abs_diff_xla_vs_not": {
                    "keras": float(np.abs(pred["keras+xla"] - pred["keras"]).max()),
                    "ours": float(np.abs(pred["ours+xla"] - pred["ours"]).max()),
                },
                "seconds": raw,
                "ratios": {},
            }
            for label, (a, b) in RATIOS.items():
                per_round = [p / q for p, q in zip(raw[a], raw[b])]
                row["ratios"][label] = {
                    "median": statistics.median(per_round),
                    "per_round": per_round,
                }
            results.append(row)
            print(
                f"{kind:5} {policy:15} xla kept {xla_kept}  "
                + "  ".join(f"{k} {v['median']:.3f}" for k, v in row["ratios"].items()),
                flush=True,
            )
    keras.config.set_dtype_policy("float32")
    return results


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    results = measure(args)
    result = {
        "benchmark": "layers_xla",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average_at_end": os.getloadavg(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "args": vars(args),
        "seconds": round(time.time() - started, 1),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
