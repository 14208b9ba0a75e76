"""Plots of the convergence studies from their JSON results.

    python examples/convergence/plots.py \
        --scaling docs/benchmarks/convergence_scaling.json \
        --precision docs/benchmarks/convergence_precision.json

writes `convergence_scaling.png` and `convergence_precision.png` next to
the JSON files (needs matplotlib: `pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_scaling(path):
    with open(path) as f:
        result = json.load(f)
    summary, args = result["summary"], result["args"]
    workers = sorted(args["workers"])
    base = summary[next(iter(summary))]["1"]
    # Left: everything; right: zoomed on N = 1's neighbourhood (the failures
    # at large N would otherwise squash the differences that matter).
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, zoom in zip(axes, (False, True)):
        ax.axhspan(
            base["mean"] - 0.01,
            base["mean"] + 0.01,
            color="0.88",
            label="N = 1 ± 1 point",
        )
        for i, (rule, row) in enumerate(summary.items()):
            ns = [n for n in workers if row[str(n)]["n"]]
            mean = np.array([row[str(n)]["mean"] for n in ns])
            std = np.nan_to_num(np.array([row[str(n)]["std"] for n in ns]))
            # Small horizontal offsets keep the error bars apart.
            x = np.array(ns) * 2 ** ((i - 3) * 0.05)
            # Dashed: the extra rules (warmup added to sqrt and paper).
            style = "--" if rule in ("sqrt+warmup", "paper+warmup") else "-"
            ax.errorbar(
                x, mean, yerr=std, marker="o", ms=4, capsize=3, ls=style, label=rule
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(n) for n in workers])
        ax.set_xlabel(f"workers N (global batch N·b, b = {args['batch']})")
        ax.grid(alpha=0.3)
        if zoom:
            ax.set_ylim(base["mean"] - 0.04, base["mean"] + 0.01)
            ax.set_title("zoom: within 4 points of N = 1", fontsize=9)
        else:
            ax.set_ylabel("final test AUC (mean ± std over seeds)")
            ax.set_ylim(0.2, 1.0)
            ax.legend(fontsize=8, loc="lower left")
            ax.set_title(
                f"synthetic shots, LSTM({args['units']}), SGD momentum "
                f"{args['momentum']}, lr0 = {args['learning_rate']}, "
                f"{args['epochs']} epochs for every N",
                fontsize=9,
            )
    fig.tight_layout()
    out = os.path.join(os.path.dirname(path), "convergence_scaling.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def plot_precision(path):
    with open(path) as f:
        result = json.load(f)
    configs = result["args"]["configs"]
    metrics = [("test_accuracy", "test accuracy"), ("test_auc", "test AUC")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (metric, label) in zip(axes, metrics):
        for i, config in enumerate(configs):
            values = [
                r[metric]
                for r in result["runs"]
                if r["config"] == config and r[metric] is not None
            ]
            jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else [0.0]
            ax.scatter(i + np.asarray(jitter), values, s=14, color="0.5", zorder=2)
            if values:
                std = np.std(values, ddof=1) if len(values) > 1 else 0.0
                ax.errorbar(
                    i + 0.25,
                    np.mean(values),
                    yerr=std,
                    fmt="o",
                    color="C0",
                    capsize=4,
                    zorder=3,
                )
        ax.set_xticks(
            range(len(configs)), [c.replace(":", "\n") for c in configs], fontsize=8
        )
        ax.set_ylabel(f"{label} after the last epoch")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        "EEG (SelfRegulationSCP1): seeds (grey) and mean ± std (blue)", fontsize=10
    )
    fig.tight_layout()
    out = os.path.join(os.path.dirname(path), "convergence_precision.png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scaling", help="convergence_scaling.json")
    p.add_argument("--precision", help="convergence_precision.json")
    args = p.parse_args(argv)
    if args.scaling:
        plot_scaling(args.scaling)
    if args.precision:
        plot_precision(args.precision)


if __name__ == "__main__":
    main()
