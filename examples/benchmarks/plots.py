"""PNG figures for docs/benchmarks.md from the JSON the benchmark scripts write.

    python examples/benchmarks/plots.py docs/benchmarks

Reads (whichever exist) peers.json, allreduce_np2.json, allreduce_scaling.json,
loss_scale.json in that folder and writes throughput.png, allreduce.png,
allreduce_scaling.png, loss_scale.png next to them.
"""

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def throughput(folder: Path):
    src = folder / "peers.json"
    if not src.exists():
        return
    data = json.loads(src.read_text())["policies"]
    labels = {
        "pinned": "1 process, 1 core",
        "plain": "1 process, TF default threads",
        "mwms2_bound": "tf_keras MWMS, 2 workers, 1 core + 1 thread each",
        "ours2": "keras-mpfp16, 2 ranks, 1 core + 1 thread each",
        "mwms2": "tf_keras MWMS, 2 workers, TF defaults",
        "ours2_tfdef": "keras-mpfp16, 2 ranks, TF defaults",
    }
    policies = list(data)
    configs = [c for c in labels if c in data[policies[0]]["samples_per_s"]]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(configs)
    for i, c in enumerate(configs):
        med = [statistics.median(data[p]["samples_per_s"][c]) for p in policies]
        ax.bar(
            [j + i * width for j in range(len(policies))], med, width, label=labels[c]
        )
    ax.set_xticks(
        [j + (len(configs) - 1) * width / 2 for j in range(len(policies))], policies
    )
    ax.set_ylabel("samples/s (median of rounds)")
    ax.set_title("Stacked LSTM training throughput, 2-core CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=120)


def allreduce(folder: Path):
    src = folder / "allreduce_np2.json"
    if not src.exists():
        return
    recs = json.loads(src.read_text())["records"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in sorted({r["variant"] for r in recs}):
        pts = sorted((r["bytes"], r["GBps"]) for r in recs if r["variant"] == variant)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (float32 bytes)")
    ax.set_ylabel("GB/s of float32 payload")
    ax.set_title("Allreduce, 2 ranks, shared memory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "allreduce.png", dpi=120)


def scaling(folder: Path):
    src = folder / "allreduce_scaling.json"
    if not src.exists():
        return
    runs = json.loads(src.read_text())["runs"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for np_, rows in runs.items():
        ax.plot(
            [r["bytes"] for r in rows],
            [r["raw_mpi4py"] * 1e6 for r in rows],
            marker="o",
            label=f"np={np_}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce time (µs)")
    ax.set_title("Allreduce time vs ranks (oversubscribed 2-core CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "allreduce_scaling.png", dpi=120)


def loss_scale(folder: Path):
    src = folder / "loss_scale.json"
    if not src.exists():
        return
    d = json.loads(src.read_text())
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(d["scale"], drawstyle="steps-post")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("train step")
    ax.set_ylabel("loss scale")
    ax.set_title(
        f"mixed_float16 loss scale, {d['ranks']} ranks (identical on all: {d['identical_on_all_ranks']})"
    )
    fig.tight_layout()
    fig.savefig(folder / "loss_scale.png", dpi=120)


def main():
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks")
    for fn in (throughput, allreduce, scaling, loss_scale):
        fn(folder)


if __name__ == "__main__":
    main()
