"""How each per-job and per-step cost grows with N: table, fit and plot.

    python examples/benchmarks/scale_costs.py \
        --inputs docs/benchmarks/scale_costs_small.json \
                 docs/benchmarks/scale_guarantees.json \
        --out docs/benchmarks/scale_costs.json --plot docs/benchmarks/scale_costs.png

Reads the healthy (`fit`) runs of `scale_guarantees.py` (which measure the
costs, see its worker) at every N given, prints a markdown table, fits each
cost to a * N^p over the N measured (least squares in log-log; p is the
growth exponent: 0 constant, 1 linear) and writes both, with the per-step
control bytes the code sends (computed from the message layout, not
measured), to `--out`.

On this 2-core machine every rank beyond 2 shares a core: times that grow
with N here include the oversubscription itself (N processes time-sharing 2
cores), which a real cluster with a core per rank does not have. The table
says which costs are CPU-bound (grow with N here for that reason) and which
are message counts or bytes (exact, machine-independent).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

# Costs in the table: (key in the worker's costs, label, unit factor, unit).
ROWS = [
    (
        "startup_to_first_step_s",
        "start-up: launch to first step (slowest rank)",
        1,
        "s",
    ),
    ("python_import_s_median", "  of which: import (median rank)", 1, "s"),
    ("broadcast_model_s", "initial broadcast (5.4 kB model)", 1e3, "ms"),
    ("broadcast_4MiB_s", "broadcast of 4 MiB", 1e3, "ms"),
    ("shard_check_s", "kmp.shard's same-data check", 1e3, "ms"),
    ("control_allreduce_s", "per-step control allreduce", 1e3, "ms"),
    ("control_bytes", "per-step control bytes sent by a rank (f32 wire)", 1, "B"),
    ("inspector_rank0_msgs_per_s", "stall inspector: messages/s at rank 0", 1, "/s"),
    (
        "inspector_other_rank_msgs_per_s",
        "stall inspector: messages/s at rank > 0",
        1,
        "/s",
    ),
    ("timeline_merge_s", "timeline merge at the end of fit", 1e3, "ms"),
    ("rss_mb_median", "resident memory per rank (median)", 1, "MB"),
    ("teardown_s", "teardown: last rank done to mpirun exit", 1, "s"),
]

METRIC_VALUES = 4  # loss and mae: (total, count) each, in the worker's model
STEP_SLOTS = 2  # (epoch, train step) per rank in the first gradient bucket


def control_bytes(n: int) -> int:
    """What a rank contributes per train step beyond the gradients: the
    metric/state float64 message (metric values, 2 learning-rate slots per
    rank, the evaluating and preemption flags) and the step check's float32
    pairs per rank in the first float32 gradient bucket."""
    metric = 8 * (METRIC_VALUES + 2 * n + 2)
    steps = 4 * 2 * STEP_SLOTS * n
    return metric + steps


def growth(ns: list[int], values: list[float]) -> float | None:
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    return sxy / sxx


def collect(paths: list[str]) -> dict[int, dict]:
    by_n: dict[int, dict] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for n, modes in doc["runs"].items():
            fit = modes.get("fit")
            if not fit or "costs" not in fit:
                continue
            c = dict(fit["costs"])
            c["shard_check_s"] = c["shard_checked_s"] - c["shard_unchecked_s"]
            c["control_bytes"] = control_bytes(int(n))
            c["source"] = path
            by_n[int(n)] = c
    return dict(sorted(by_n.items()))


def plot(by_n: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = list(by_n)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    groups = [
        (
            "seconds (CPU-bound here: N ranks on 2 cores)",
            ["startup_to_first_step_s", "python_import_s_median", "teardown_s"],
        ),
        (
            "milliseconds per call",
            [
                "broadcast_model_s",
                "broadcast_4MiB_s",
                "shard_check_s",
                "control_allreduce_s",
                "timeline_merge_s",
            ],
        ),
        (
            "counts",
            [
                "inspector_rank0_msgs_per_s",
                "inspector_other_rank_msgs_per_s",
                "control_bytes",
                "rss_mb_median",
            ],
        ),
    ]
    labels = {k: label for k, label, _, _ in ROWS}
    scale = {k: f for k, _, f, _ in ROWS}
    for ax, (title, keys) in zip(axes, groups):
        for k in keys:
            vals = [by_n[n].get(k) for n in ns]
            vals = [v * scale[k] if v is not None else float("nan") for v in vals]
            ax.plot(ns, vals, "o-", label=labels[k].strip())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("ranks N (one machine, oversubscribed)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--out")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    by_n = collect(args.inputs)
    ns = list(by_n)
    table = []
    header = (
        "| cost | "
        + " | ".join(f"N={n}" for n in ns)
        + " | growth N^p | p, N ≥ 4 (all oversubscribed) |"
    )
    table.append(header)
    table.append("|---" * (len(ns) + 3) + "|")
    fits4 = {}
    fits = {}
    for key, label, factor, unit in ROWS:
        vals = [by_n[n].get(key) for n in ns]
        p_ = growth(ns, vals)
        fits[key] = p_
        big = [(n, v) for n, v in zip(ns, vals) if n >= 4]
        p4 = growth([n for n, _ in big], [v for _, v in big])
        fits4[key] = p4
        cells = ["–" if v is None else f"{v * factor:.3g}" for v in vals]
        table.append(
            f"| {label} ({unit}) | "
            + " | ".join(cells)
            + f" | {'–' if p_ is None else f'{p_:.2f}'}"
            + f" | {'–' if p4 is None else f'{p4:.2f}'} |"
        )
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "inputs": args.inputs,
                    "costs": by_n,
                    "growth_exponent": fits,
                    "growth_exponent_n_ge_4": fits4,
                },
                indent=1,
            )
            + "\n"
        )
    if args.plot:
        plot(by_n, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
