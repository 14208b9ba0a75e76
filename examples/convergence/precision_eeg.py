"""Half vs single precision on real EEG: test accuracy and AUC over seeds.

Data: SelfRegulationSCP1.npz (BCI Competition II Ia: X_train (268, 896, 6),
X_test (293, 896, 6), one binary label per trial), channels normalised with
training statistics, time downsampled 4x by block means (896 -> 224 steps).
The float32 baseline recipe: `LSTM(32, return_sequences) -> LSTM(32) ->
Dense(1, sigmoid, float32)`, Adam 3e-3, batch 16, 30 epochs.

Configurations: float32, and `mixed_float16` / `mixed_bfloat16` each with
`keras_mpfp16.layers.LSTM` ("kmp", float32 carry) and `keras.layers.LSTM`
("keras"). Under float32 the two LSTMs run the same code, so float32 is one
configuration. Every policy uses `kmp.DistributedOptimizer(Adam(3e-3))`
(one process: no communication); under mixed_float16 it scales the loss
dynamically. Each seed trains every configuration from the same seed, so
differences can be paired by seed.

    python examples/convergence/precision_eeg.py /path/to/SelfRegulationSCP1.npz \
        --out docs/benchmarks/convergence_precision.json
    python examples/convergence/precision_eeg.py DATA --smoke   # seconds

The JSON is rewritten after every run; rerunning with the same --out skips
the runs it holds. Without the data file it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from common import shots  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

CONFIGS = [
    "float32",
    "mixed_float16:kmp",
    "mixed_float16:keras",
    "mixed_bfloat16:kmp",
    "mixed_bfloat16:keras",
]
LSTM_LAYERS = {"kmp": kmp.layers.LSTM, "keras": keras.layers.LSTM}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("data", help="path to SelfRegulationSCP1.npz")
    p.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--downsample", type=int, default=4)
    p.add_argument("--out", help="JSON results (rewritten after every run)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: every 8th trial, 1 epoch, 1 seed, float32 and mixed_float16:kmp",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.epochs, args.seeds = 1, args.seeds[:1]
        args.configs = ["float32", "mixed_float16:kmp"]
    return args


def load(path, downsample, smoke):
    train, test = shots.load_eeg_shots(path, downsample=downsample)
    arrays = []
    for part in (train, test):
        x, y = np.stack(part.signals), part.disruptive.astype("float32")
        if smoke:  # every 8th trial: the files are sorted by class
            x, y = x[::8], y[::8]
        arrays += [x, y]
    return arrays


class TestCurve(keras.callbacks.Callback):
    """Test accuracy and AUC after every epoch (does not affect training)."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y
        self.accuracy, self.auc = [], []

    def on_epoch_end(self, epoch, logs=None):
        p = np.asarray(self.model.predict(self.x, batch_size=256, verbose=0), "float64")
        p = p[:, 0]
        finite = bool(np.all(np.isfinite(p)))
        self.accuracy.append(
            float(np.mean((p > 0.5) == (self.y > 0.5))) if finite else None
        )
        self.auc.append(shots.roc_auc(p, self.y) if finite else None)


def train_once(config, seed, data, args):
    policy, _, impl = config.partition(":")
    x_train, y_train, x_test, y_test = data
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(seed)
        lstm = LSTM_LAYERS[impl or "kmp"]
        model = keras.Sequential(
            [
                keras.Input(x_train.shape[1:]),
                lstm(32, return_sequences=True),
                lstm(32),
                keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
            ]
        )
        model.compile(
            optimizer=kmp.DistributedOptimizer(
                keras.optimizers.Adam(args.learning_rate)
            ),
            loss="binary_crossentropy",
        )
        curve = TestCurve(x_test, y_test)
        started = time.time()
        history = model.fit(
            x_train,
            y_train,
            batch_size=args.batch_size,
            epochs=args.epochs,
            callbacks=[curve],
            verbose=0,
        )
        seconds = time.time() - started
        # Steps the optimizer skipped for non-finite gradients (loss scaling).
        skipped = int(keras.ops.convert_to_numpy(model.optimizer.skipped_steps))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return {
        "config": config,
        "seed": seed,
        "test_accuracy": curve.accuracy[-1],
        "test_auc": curve.auc[-1],
        "final_train_loss": float(history.history["loss"][-1]),
        "test_accuracy_per_epoch": curve.accuracy,
        "test_auc_per_epoch": curve.auc,
        "skipped_steps": skipped,
        "train_seconds": round(seconds, 1),
    }


def last5_mean(values):
    """Mean over the last 5 epochs: less noisy than the last epoch alone."""
    values = [v for v in values[-5:] if v is not None]
    return float(np.mean(values)) if values else None


# Metric name -> its value from one run's row.
METRICS = {
    "test_accuracy": lambda row: row["test_accuracy"],
    "test_auc": lambda row: row["test_auc"],
    "test_accuracy_last5_mean": lambda row: last5_mean(row["test_accuracy_per_epoch"]),
    "test_auc_last5_mean": lambda row: last5_mean(row["test_auc_per_epoch"]),
}


def summarise(runs, configs):
    """Per metric and configuration: mean, std, and the paired difference to
    float32 (same seed)."""
    summary = {}
    for metric, value in METRICS.items():
        summary[metric] = {}
        baseline = {r["seed"]: value(r) for r in runs if r["config"] == "float32"}
        for config in configs:
            by_seed = {r["seed"]: value(r) for r in runs if r["config"] == config}
            mean, std, n = common.mean_std(list(by_seed.values()))
            paired = [
                by_seed[s] - baseline[s]
                for s in by_seed
                if s in baseline and by_seed[s] is not None and baseline[s] is not None
            ]
            diff_mean, diff_std, diff_n = common.mean_std(paired)
            summary[metric][config] = {
                "mean": mean,
                "std": std,
                "n": n,
                "paired_diff_mean": diff_mean if config != "float32" else None,
                "paired_diff_std": diff_std if config != "float32" else None,
                "paired_n": diff_n if config != "float32" else None,
            }
    return summary


def main(argv=None):
    args = parse_args(argv)
    if not os.path.exists(args.data):
        print(f"precision_eeg: skipped, data file not found: {args.data}")
        return None
    data = load(args.data, args.downsample, args.smoke)
    print(
        f"train {data[0].shape}, test {data[2].shape}, epochs {args.epochs}", flush=True
    )
    result = {
        "study": "convergence_precision",
        "date": time.strftime("%Y-%m-%d"),
        "machine": common.MACHINE,
        "platform": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join(
            ["python", "examples/convergence/precision_eeg.py", *(argv or sys.argv[1:])]
        ),
        "args": vars(args),
        "runs": [],
    }
    if args.out and os.path.exists(args.out):
        with open(args.out) as f:
            result["runs"] = json.load(f).get("runs", [])
    done = {(r["config"], r["seed"]) for r in result["runs"]}
    for seed in args.seeds:  # seed-major: partial results are already paired
        for config in args.configs:
            if (config, seed) in done:
                continue
            row = train_once(config, seed, data, args)
            result["runs"].append(row)
            result["summary"] = summarise(result["runs"], args.configs)
            print(
                f"{config:22s} seed {seed}: test accuracy {row['test_accuracy']:.4f}, "
                f"AUC {row['test_auc']:.4f}, {row['train_seconds']} s",
                flush=True,
            )
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    result["summary"] = summarise(result["runs"], args.configs)
    for metric in METRICS:
        print(f"\n{metric}: mean +- std over seeds; paired difference vs float32")
        for config, s in result["summary"][metric].items():
            line = f"{config:22s} n={s['n']} {s['mean']:.4f} +- {s['std']:.4f}"
            if s["paired_diff_mean"] is not None:
                line += (
                    f"  diff {s['paired_diff_mean']:+.4f} +- {s['paired_diff_std']:.4f}"
                )
            print(line)
    return result


if __name__ == "__main__":
    main()
