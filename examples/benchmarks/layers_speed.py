"""Train-step time of keras_mpfp16's LSTM/GRU relative to Keras's, per policy.

One model per layer kind and implementation, `Input -> RNN(return_sequences)
-> Dense(1, float32)`, same weights, compiled the same way (Adam, MSE,
`jit_compile="auto"` unless told otherwise), trained with `train_on_batch`
(forward + backward + update). Configurations are timed interleaved (Keras, ours, Keras, ours, ...) because this machine's
step times switch between speed modes in streaks; the reported figure is the
median over rounds of the per-round ratio ours/Keras. Raw times are printed.

    python examples/benchmarks/layers_speed.py --out speed.json
    python examples/benchmarks/layers_speed.py --quick   # CI smoke run
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
from keras_mpfp16.layers.precision import (  # noqa: E402
    DEFAULT_INPUT_PRECISION,
    DEFAULT_RECURRENT_PRECISION,
    INPUT_PRECISIONS,
    RECURRENT_PRECISIONS,
)

KERAS_CLASSES = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
OUR_CLASSES = {"lstm": mp_layers.LSTM, "gru": mp_layers.GRU}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru"]
    )
    parser.add_argument(
        "--policies", nargs="+", default=["float32", "mixed_float16", "mixed_bfloat16"]
    )
    parser.add_argument(
        "--input-precisions",
        nargs="+",
        default=[DEFAULT_INPUT_PRECISION],
        choices=list(INPUT_PRECISIONS),
    )
    parser.add_argument(
        "--recurrent-precisions",
        nargs="+",
        default=[DEFAULT_RECURRENT_PRECISION],
        choices=list(RECURRENT_PRECISIONS),
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument(
        "--steps", type=int, default=10, help="train steps timed per round"
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--jit-compile",
        choices=["auto", "true", "false"],
        default="auto",
        help="passed to compile() for both models; Keras's 'auto' is no XLA "
        "on a CPU-only TensorFlow and XLA on JAX",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes for a smoke run"
    )
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.features, args.units = 4, 16, 4, 8
        args.steps, args.rounds = 2, 5
    return args


def make_model(layer, args):
    model = keras.Sequential(
        [
            keras.Input((args.length, args.features)),
            layer,
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3), loss="mse", jit_compile=jit_compile
    )
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
            keras.mixed_precision.set_global_policy(policy)
            keras.utils.set_random_seed(0)
            configs = {
                "keras": make_model(
                    KERAS_CLASSES[kind](args.units, return_sequences=True), args
                )
            }
            weights = configs["keras"].get_weights()
            for i in args.input_precisions:
                for r in args.recurrent_precisions:
                    layer = OUR_CLASSES[kind](
                        args.units,
                        return_sequences=True,
                        input_precision=i,
                        recurrent_precision=r,
                    )
                    configs[f"ours:in={i},rec={r}"] = model = make_model(layer, args)
                    model.set_weights(weights)
            for model in configs.values():  # trace and warm up
                time_steps(model, x, y, 2)
            raw = {name: [] for name in configs}
            for _ in range(args.rounds):
                for name, model in configs.items():
                    raw[name].append(time_steps(model, x, y, args.steps))
            for name in configs:
                if name == "keras":
                    continue
                ratios = [a / b for a, b in zip(raw[name], raw["keras"])]
                row = {
                    "layer": kind,
                    "policy": policy,
                    "impl": name,
                    "median_ratio": statistics.median(ratios),
                    "ratios": ratios,
                    "ours_s": raw[name],
                    "keras_s": raw["keras"],
                }
                results.append(row)
                print(
                    f"{kind:5} {policy:15} {name:28} median ours/keras = {row['median_ratio']:.3f}"
                    f"  ratios {[round(r, 3) for r in ratios]}\n"
                    f"{'':22}keras ms {[round(1e3 * t, 2) for t in raw['keras']]}\n"
                    f"{'':22}ours  ms {[round(1e3 * t, 2) for t in raw[name]]}",
                    flush=True,
                )
    keras.mixed_precision.set_global_policy("float32")
    return results


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    results = measure(args)
    result = {
        "benchmark": "layers_speed",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
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
