"""Renders a keras-mpfp16 timeline (Chrome trace-event JSON) to a PNG.

    python examples/benchmarks/plot_timeline.py trace.json docs/timeline.png \\
        --steps 12-14

One row per (rank, thread), as Perfetto shows it: train steps, validation,
checkpoints and the initial broadcast on the host row; bucket reductions,
their MPI calls (thinner, inside), the other collectives and the waits for
the slowest rank (hatched) on the reduction row. `--steps first-last`
crops the picture to those train steps (by the first rank's step spans).
Needs matplotlib (the `bench` extra).
"""

import argparse
import json

COLORS = {
    "step": "#9ecae1",
    "validation": "#fdd0a2",
    "checkpoint": "#d9d9d9",
    "broadcast": "#c7e9c0",
    "reduction": "#3182bd",
    "mpi": "#08306b",
    "collective": "#74c476",
    "wait": "#e6550d",
    "backward": "#fdae6b",
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("png")
    p.add_argument("--steps", default=None, help="first-last train steps to show")
    p.add_argument("--title", default=None)
    args = p.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(args.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {
        e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"
    }
    spans = [e for e in events if e.get("ph") == "X"]
    lo = min(e["ts"] for e in spans)
    hi = max(e["ts"] + e["dur"] for e in spans)
    if args.steps:
        first, last = (int(s) for s in args.steps.split("-"))
        steps = [
            e
            for e in spans
            if e.get("cat") == "step" and first <= e["args"]["step"] <= last
        ]
        lo = min(e["ts"] for e in steps)
        hi = max(e["ts"] + e["dur"] for e in steps)
    pad = (hi - lo) * 0.02
    lo, hi = lo - pad, hi + pad
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(rows) + 1.6))
    for y, (pid, tid) in enumerate(rows):
        for e in spans:
            if (e["pid"], e["tid"]) != (pid, tid):
                continue
            if e["ts"] + e["dur"] < lo or e["ts"] > hi:
                continue
            cat = e.get("cat", "")
            height = {"mpi": 0.3, "wait": 0.5}.get(cat, 0.7)
            ax.barh(
                y,
                e["dur"] / 1e3,
                left=(e["ts"] - lo) / 1e3,
                height=height,
                color=COLORS.get(cat, "#bbbbbb"),
                edgecolor="black" if cat in ("step", "reduction") else "none",
                linewidth=0.3,
                hatch="///" if cat == "wait" else None,
                alpha=0.9 if cat != "wait" else 0.7,
            )
            middle = e["ts"] + e["dur"] / 2
            if cat == "step" and e["dur"] > (hi - lo) * 0.05 and lo < middle < hi:
                ax.text(
                    (e["ts"] - lo + e["dur"] / 2) / 1e3,
                    y,
                    str(e["args"]["step"]),
                    ha="center",
                    va="center",
                    fontsize=7,
                )
        for e in events:
            if (
                e.get("ph") == "i"
                and e["pid"] == pid
                and tid == 0
                and lo <= e["ts"] <= hi
            ):
                ax.plot((e["ts"] - lo) / 1e3, y + 0.42, "v", color="red", markersize=5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [
            f"{names.get(pid, pid)}\n"
            + {0: "host", 1: "reduction", 2: "fwd + bwd"}.get(tid, str(tid))
            for pid, tid in rows
        ],
        fontsize=8,
    )
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_xlabel("ms (rank 0's clock)")
    used = {e.get("cat") for e in spans if lo <= e["ts"] <= hi}
    handles = [Patch(color=c, label=k) for k, c in COLORS.items() if k in used]
    ax.legend(handles=handles, loc="upper center", ncol=8, fontsize=7,
              bbox_to_anchor=(0.5, -0.18 if len(rows) < 5 else -0.1))  # fmt: skip
    if args.title:
        ax.set_title(args.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}: {len(rows)} rows, {(hi - lo) / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
