"""Training check on real EEG: keras_mpfp16's LSTM under mixed precision vs float32.

Data: BCI Competition II Ia "Self-regulation of slow cortical potentials"
(SelfRegulationSCP1.npz: X_train (268, 896, 6), y_train (268,), X_test
(293, 896, 6), y_test (293,)). Channels are normalised with training
statistics and time is downsampled 4x by averaging blocks of 4 samples
(896 -> 224 steps). Model: `LSTM(32, return_sequences=True) -> LSTM(32) ->
Dense(1, sigmoid, float32)`, Adam(3e-3), batch 16, binary cross-entropy.
Under `mixed_float16` `compile` wraps the optimizer in Keras's
LossScaleOptimizer. Each (policy, implementation) is trained from the same
seeds; the test accuracy after the last epoch is reported per seed, as mean
+- std, and paired by seed against float32.

    python examples/benchmarks/layers_eeg.py /work/shared/data/SelfRegulationSCP1.npz \
        --out eeg.json
    python examples/benchmarks/layers_eeg.py DATA --quick   # smoke run

Without the data file it prints why and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mpfp16 import layers as mp_layers  # noqa: E402

IMPLEMENTATIONS = {"ours": mp_layers.LSTM, "keras": keras.layers.LSTM}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="path to SelfRegulationSCP1.npz")
    parser.add_argument(
        "--runs",
        nargs="+",
        default=["float32:ours", "mixed_float16:ours", "mixed_bfloat16:ours"],
        help="POLICY:IMPL pairs, IMPL in {ours, keras}",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--downsample", type=int, default=4)
    parser.add_argument(
        "--downsample-method",
        choices=["mean", "stride"],
        default="mean",
        help="average each block of DOWNSAMPLE samples, or keep every DOWNSAMPLE-th",
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 epochs, 1 seed, every 4th trial"
    )
    parser.add_argument(
        "--out", help="write the results as JSON to this file (updated after every run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.seeds = 2, args.seeds[:1]
    for run in args.runs:
        policy, _, impl = run.partition(":")
        if impl not in IMPLEMENTATIONS:
            parser.error(f"run {run!r}: IMPL must be one of {sorted(IMPLEMENTATIONS)}")
    return args


def load(path, downsample, quick, method="mean"):
    data = np.load(path)
    x_train, y_train = (
        data["X_train"].astype("float32"),
        data["y_train"].astype("float32"),
    )
    x_test, y_test = data["X_test"].astype("float32"), data["y_test"].astype("float32")
    mean = x_train.mean(axis=(0, 1), keepdims=True)
    std = x_train.std(axis=(0, 1), keepdims=True)

    def prepare(x):
        x = (x - mean) / std
        if method == "stride":
            return x[:, ::downsample]
        steps = x.shape[1] // downsample
        x = x[:, : steps * downsample].reshape(
            x.shape[0], steps, downsample, x.shape[2]
        )
        return x.mean(axis=2)

    x_train, x_test = prepare(x_train), prepare(x_test)
    if quick:  # every 4th trial: the files are sorted by class
        x_train, y_train, x_test, y_test = (
            x_train[::4],
            y_train[::4],
            x_test[::4],
            y_test[::4],
        )
    return x_train, y_train, x_test, y_test


def train_once(policy, impl, seed, data, args):
    x_train, y_train, x_test, y_test = data
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(seed)
    lstm = IMPLEMENTATIONS[impl]
    model = keras.Sequential(
        [
            keras.Input(x_train.shape[1:]),
            lstm(32, return_sequences=True),
            lstm(32),
            keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    started = time.time()
    # Test accuracy after every epoch is recorded (it does not affect
    # training); the reported figure is the one after the last epoch.
    history = model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(x_test, y_test),
        verbose=0,
    )
    seconds = time.time() - started
    test_loss, test_accuracy = model.evaluate(x_test, y_test, verbose=0)
    keras.mixed_precision.set_global_policy("float32")
    return {
        "policy": policy,
        "impl": impl,
        "seed": seed,
        "lstm_compute_dtype": model.layers[0].compute_dtype,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "final_train_loss": float(history.history["loss"][-1]),
        "final_train_accuracy": float(history.history["accuracy"][-1]),
        "test_accuracy_per_epoch": [float(a) for a in history.history["val_accuracy"]],
        "test_accuracy_last5_mean": float(
            np.mean(history.history["val_accuracy"][-5:])
        ),
        "train_seconds": round(seconds, 1),
    }


METRICS = {
    "test_accuracy": "test accuracy after the last epoch",
    "test_accuracy_last5_mean": "test accuracy averaged over the last 5 epochs",
}


def summarise(runs, seeds):
    """Per metric and run name: mean, std, range, and the paired difference
    to float32 by seed."""
    return {metric: _summarise_metric(runs, seeds, metric) for metric in METRICS}


def _summarise_metric(runs, seeds, metric):
    by_run = {}
    for r in runs:
        by_run.setdefault(f"{r['policy']}:{r['impl']}", {})[r["seed"]] = r[metric]
    baseline = by_run.get("float32:ours") or by_run.get("float32:keras") or {}
    summary = {}
    for name, values_by_seed in by_run.items():
        values = [values_by_seed[s] for s in seeds if s in values_by_seed]
        paired = [
            values_by_seed[s] - baseline[s]
            for s in seeds
            if s in values_by_seed and s in baseline
        ]
        summary[name] = {
            "n": len(values),
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
            "paired_diff_vs_float32_mean": statistics.fmean(paired) if paired else None,
            "paired_diff_vs_float32_std": (
                statistics.stdev(paired) if len(paired) > 1 else None
            ),
        }
    return summary


def print_summary(summary):
    for metric, title in METRICS.items():
        print(f"\n{title}, mean +- std over seeds; paired difference vs float32:")
        for name, s in summary[metric].items():
            line = (
                f"{name:22} n={s['n']} {s['mean']:.4f} +- {s['std']:.4f} "
                f"[{s['min']:.4f}, {s['max']:.4f}]"
            )
            if s["paired_diff_vs_float32_mean"] is not None:
                line += (
                    f"  paired diff {s['paired_diff_vs_float32_mean']:+.4f}"
                    f" +- {s['paired_diff_vs_float32_std'] or 0.0:.4f}"
                )
            print(line)


def main(argv=None):
    args = parse_args(argv)
    if not os.path.exists(args.data):
        print(f"layers_eeg: skipped, data file not found: {args.data}")
        return None
    data = load(args.data, args.downsample, args.quick, args.downsample_method)
    print(
        f"train {data[0].shape}, test {data[2].shape}, epochs {args.epochs}, seeds {args.seeds}",
        flush=True,
    )
    result = {
        "benchmark": "layers_eeg",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "args": vars(args),
        "runs": [],
    }
    for seed in args.seeds:  # seed-major: partial results are already paired
        for run in args.runs:
            policy, _, impl = run.partition(":")
            row = train_once(policy, impl, seed, data, args)
            result["runs"].append(row)
            print(
                f"{policy:15} {impl:5} seed {seed}: test acc {row['test_accuracy']:.4f} "
                f"(train loss {row['final_train_loss']:.6f}, LSTM computes in "
                f"{row['lstm_compute_dtype']}, {row['train_seconds']} s)",
                flush=True,
            )
            result["summary"] = summarise(result["runs"], args.seeds)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    print_summary(result["summary"])
    return result


if __name__ == "__main__":
    sys.exit(0 if main() is not False else 1)
