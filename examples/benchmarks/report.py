"""Markdown tables for docs/benchmarks.md from the benchmark JSON files.

    python examples/benchmarks/report.py docs/benchmarks > /tmp/tables.md

Prints whichever sections have results; every number comes from the files.
"""

import json
import sys
from pathlib import Path


def load(folder, name):
    p = folder / name
    return json.loads(p.read_text()) if p.exists() else None


def fmt_list(xs, f="{:.0f}"):
    return ", ".join(f.format(x) for x in xs)


def peers(folder):
    d = load(folder, "peers.json")
    if not d:
        return
    print(f"### Peer comparison ({d['when']})\n")
    print(
        "| policy | ours np=2 / MWMS np=2 | scaling efficiency: ours np=2 / (2 × pinned) | ours np=2 / plain one process |"
    )
    print("|---|---|---|---|")
    for policy, r in d["policies"].items():
        m = r["median_ratios"]
        print(
            f"| {policy} | {m.get('ours2_over_mwms2', float('nan')):.2f} | "
            f"{m['ours2_over_2x_pinned (scaling efficiency)']:.2f} | {m['ours2_over_plain']:.2f} |"
        )
    print("\nRaw samples/s per round:\n")
    print("| policy | config | rounds |")
    print("|---|---|---|")
    for policy, r in d["policies"].items():
        for c, xs in r["samples_per_s"].items():
            print(f"| {policy} | {c} | {fmt_list(xs)} |")
    print()


def overhead(folder):
    rows = []
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
        d = load(folder, f"overhead_{policy}.json")
        if d:
            rows.append((policy, d))
    if not rows:
        return
    print("### One process: DistributedOptimizer vs the bare optimizer\n")
    print(
        "| policy | ours / plain (median of per-round ratios) | plain samples/s | ours samples/s |"
    )
    print("|---|---|---|---|")
    for policy, d in rows:
        print(
            f"| {policy} | {d['ratio_ours_over_plain']:.3f} | {fmt_list(d['plain_samples_per_s'])} | "
            f"{fmt_list(d['ours_samples_per_s'])} |"
        )
    print()


def allreduce(folder):
    d = load(folder, "allreduce_np2.json")
    if not d:
        return
    print(f"### Allreduce, 2 ranks ({d['meta']['when']})\n")
    variants = sorted({r["variant"] for r in d["records"]})
    print(
        "| size | "
        + " | ".join(f"{v} GB/s" for v in variants)
        + " | ours_float32 / raw |"
    )
    print("|---|" + "---|" * (len(variants) + 1))
    by = {}
    for r in d["records"]:
        by.setdefault(r["bytes"], {})[r["variant"]] = r
    for size, v in sorted(by.items()):
        cells = " | ".join(f"{v[k]['GBps']:.3f}" if k in v else "" for k in variants)
        ratio = v["raw_mpi4py"]["seconds"] / v["ours_float32"]["seconds"]
        print(f"| {size:,} B | {cells} | {ratio:.2f} |")
    lowp = [r for r in d["records"] if r["variant"] == "ours_float16"]
    if lowp:
        big = max(lowp, key=lambda r: r["bytes"])
        print(
            f"\nBytes sent per rank for {big['bytes']:,} B of float32 gradients: float32 ring allreduce "
            f"≈ {big['bytes']:,} B (2·(N−1)/N of the payload); 16-bit wire {big['bytes_sent_per_rank']:,} B."
        )
    print()


def threads(folder):
    d = load(folder, "threads.json")
    if not d:
        return
    print(f"### Thread settings at np=2 ({d['when']}, {d['policy']})\n")
    print("| setting | throughput relative to TF defaults (median) | raw samples/s |")
    print("|---|---|---|")
    for s, rel in d["relative_to_off"].items():
        print(f"| {s} | {rel:.2f} | {fmt_list(d['samples_per_s'][s])} |")
    print()


def comm_heavy(folder):
    d = load(folder, "comm_heavy.json")
    if not d:
        return
    m = d["median_seconds"]
    print(
        f"### Communication-heavy model ({d['params']:,} parameters, {d['gradient_MB']:.0f} MB of gradients; {d['when']})\n"
    )
    print("| measurement | median seconds per step | rounds |")
    print("|---|---|---|")
    for k in m:
        print(f"| {k} | {m[k]:.3f} | {fmt_list(d['raw'][k], '{:.3f}')} |")
    print(f"| compute + comm | {d['sum_compute_comm']:.3f} | |")
    print(f"| max(compute, comm) | {d['max_compute_comm']:.3f} | |")
    if "sum_compute_x2_comm" in d:
        print(f"| compute_x2 + comm | {d['sum_compute_x2_comm']:.3f} | |")
        print(f"| max(compute_x2, comm) | {d['max_compute_x2_comm']:.3f} | |")
    print()


def scaling(folder):
    d = load(folder, "allreduce_scaling.json")
    if not d:
        return
    print(f"### Allreduce time vs ranks ({d['when']}, oversubscribed)\n")
    nps = list(d["runs"])
    sizes = [r["bytes"] for r in d["runs"][nps[0]]]
    print("| size | " + " | ".join(f"np={n} raw µs (algorithm)" for n in nps) + " |")
    print("|---|" + "---|" * len(nps))
    for i, size in enumerate(sizes):
        cells = []
        for n in nps:
            r = d["runs"][n][i]
            cells.append(
                f"{r['raw_mpi4py'] * 1e6:.0f} ({r['closest_forced_algorithm']})"
            )
        print(f"| {size:,} B | " + " | ".join(cells) + " |")
    print()


def loss_scale(folder):
    d = load(folder, "loss_scale.json")
    if not d:
        return
    s = d["scale"]
    print(
        f"### Loss scale trajectory\n\n{len(s)} steps on {d['ranks']} ranks, growth interval "
        f"{d['growth_interval']}: scale from {s[0]:g} to {s[-1]:g} (min {min(s):g}, max {max(s):g}), "
        f"{d['skipped'][-1]} skipped steps; identical on all ranks: {d['identical_on_all_ranks']}.\n"
    )


def autogroup(folder):
    d = load(folder, "autogroup.json")
    if not d:
        return
    print(
        f"### A competing job in another session ({d['when']}, "
        f"sched_autogroup_enabled={d['sched_autogroup_enabled']})\n"
    )
    print("| condition | throughput relative to quiet (median) | raw samples/s |")
    print("|---|---|---|")
    for c, rel in d["relative_to_quiet"].items():
        print(f"| {c} | {rel:.2f} | {fmt_list(d['samples_per_s'][c])} |")
    print()


def main():
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks")
    for section in (
        peers,
        autogroup,
        overhead,
        allreduce,
        threads,
        comm_heavy,
        scaling,
        loss_scale,
    ):
        section(folder)


if __name__ == "__main__":
    main()
