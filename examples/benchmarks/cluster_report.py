"""Tables and figures of the multi-node section, from the cluster JSON files.

    python examples/benchmarks/cluster_report.py docs/benchmarks           # print the tables
    python examples/benchmarks/cluster_report.py docs/benchmarks --plot    # and draw the figures

Reads cluster_link.json, cluster_main.json, cluster_overlap.json,
cluster_sparse.json, cluster_faults.json and cluster_scaling.json (those that
exist) and prints the Markdown tables of docs/benchmarks.md's "Multi-node
(emulated cluster)" section; `--plot` writes cluster_main.png next to them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def md(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(x) -> str:
    return "–" if x is None else f"{x * 1e3:.0f}"


def ratio(raw, num, den) -> float:
    return statistics.median(a / b for a, b in zip(raw[num], raw[den]))


def load(folder: Path, name: str):
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def link_table(d) -> str:
    rows = []
    for j in d["jobs"]:
        ar = {int(k): min(v) for k, v in j["allreduce_s"].items()}
        rows.append(
            [
                j["rate"],
                j["nodes"],
                j.get("allreduce_algorithm", "Open MPI default"),
                f"{j['alpha_s'] * 1e6:.0f}",
                f"{j['beta_bytes_per_s'] * 8 / 1e9:.2f}",
                f"{ar[8] * 1e6:.0f}",
                f"{ar[1 << 20] * 1e3:.1f}",
                f"{ar[64 << 20] * 1e3:.0f}",
            ]
        )
    return md(
        [
            "link",
            "nodes",
            "allreduce algorithm",
            "alpha (one-way, 8 B) µs",
            "beta (64 MB ping-pong) Gbit/s",
            "allreduce 8 B µs",
            "allreduce 1 MiB ms",
            "allreduce 64 MiB ms",
        ],
        rows,
    )


def main_tables(d) -> dict[str, str]:
    out = {}
    for model in dict.fromkeys(j["name"] for j in d["jobs"]):
        jobs = [j for j in d["jobs"] if j["name"] == model]
        params = jobs[0]["params"]
        cols = [c for c in jobs[0]["median"]]
        rows = []
        for j in jobs:
            med = j["median"]
            rows.append([j["rate"], j["nodes"], *[ms(med.get(c)) for c in cols]])
        out[f"{model}_times"] = (
            f"*{model}: {params:,} parameters, median ms per step*\n\n"
            + md(["link", "nodes", *cols], rows)
        )
        rows = []
        for j in jobs:
            raw = j["seconds_per_step"]
            r = j["ratios"]
            ins = j.get("in_collectives_per_step", {}).get("f32")
            rows.append(
                [
                    j["rate"],
                    j["nodes"],
                    f"{r['f16/f32 comm']:.2f}",
                    f"{r['bf16/f32 comm']:.2f}",
                    f"{r['f16/f32 step']:.2f}",
                    f"{r['bf16/f32 step']:.2f}",
                    f"{r['f32/max(compute,comm)']:.2f}",
                    f"{r['f32/(compute+comm)']:.2f}",
                    ms(statistics.median(ins)) if ins else "–",
                    f"{ratio(raw, 'f32_1b', 'f32'):.2f}" if "f32_1b" in raw else "–",
                    f"{ratio(raw, 'f32_4mb', 'f32'):.2f}" if "f32_4mb" in raw else "–",
                ]
            )
        out[f"{model}_ratios"] = md(
            [
                "link",
                "nodes",
                "comm f16/f32",
                "comm bf16/f32",
                "step f16/f32",
                "step bf16/f32",
                "step f32 / max(compute, comm)",
                "step f32 / (compute + comm)",
                "f32: ms in gradient collectives per step",
                "1 bucket / 25 MB",
                "4 MB / 25 MB",
            ],
            rows,
        )
    return out


def overlap_table(d) -> str:
    rows = []
    for j in d["jobs"]:
        raw, med = j["seconds_per_step"], j["median"]
        ins = j.get("in_collectives_per_step", {}).get("f32")
        rows.append(
            [
                j["rate"],
                j["name"],
                ms(med["compute"]),
                ms(med["comm_f32"]),
                ms(med["f32"]),
                ms(med["f32_1b"]),
                f"{j['ratios']['f32/max(compute,comm)']:.2f}",
                f"{j['ratios']['f32/(compute+comm)']:.2f}",
                f"{ratio(raw, 'f32_1b', 'f32'):.2f}",
                ms(statistics.median(ins)) if ins else "–",
            ]
        )
    return md(
        [
            "link",
            "threads",
            "compute ms",
            "comm ms",
            "step 25 MB buckets ms",
            "step 1 bucket ms",
            "step / max(compute, comm)",
            "step / (compute + comm)",
            "1 bucket / 25 MB",
            "ms in gradient collectives per step",
        ],
        rows,
    )


def sparse_table(d) -> str:
    rows = []
    for j in d["jobs"]:
        med, r = j["median"], j["ratios"]
        rows.append(
            [
                j["rate"],
                j["nodes"],
                ms(med["compute"]),
                ms(med["comm_dense"]),
                ms(med["comm_sparse"]),
                ms(med["dense"]),
                ms(med["sparse"]),
                f"**{r['dense/sparse step']:.2f}**",
                f"{r['dense/sparse comm']:.2f}",
            ]
        )
    return md(
        [
            "link",
            "nodes",
            "compute ms",
            "comm dense ms",
            "comm sparse ms",
            "step dense ms",
            "step sparse ms",
            "dense / sparse step",
            "dense / sparse comm",
        ],
        rows,
    )


def faults_table(d) -> str:
    rows = []
    for i, run in enumerate(d["runs"]):
        ranks = run["ranks"]
        cells = [
            f"{x['ended_after_cut_s']:.1f} s, {x['exit_status']}"
            if x["ended_after_cut_s"] is not None
            else f"running, {x['exit_status']}"
            for x in ranks.values()
        ]
        m = run["mpirun"]
        mp = (
            f"{m['ended_after_cut_s']:.1f} s, exit {m['exit_status']}"
            if m["ended_after_cut_s"] is not None
            else m["exit_status"]
        )
        rows.append([i // 2 + 1, run["variant"], *cells, mp])
    n = len(d["runs"][0]["ranks"])
    return md(
        [
            "run",
            "mpirun flags",
            *[f"rank {r}: ended, status" for r in range(n)],
            "mpirun",
        ],
        rows,
    )


def plot(folder: Path, main) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(j["name"] for j in main["jobs"]))
    rates = list(dict.fromkeys(j["rate"] for j in main["jobs"]))
    fig, axes = plt.subplots(
        len(models),
        len(rates),
        figsize=(5.5 * len(rates), 3.4 * len(models)),
        squeeze=False,
    )
    series = [
        ("compute", "compute only"),
        ("comm_f32", "comm only f32"),
        ("comm_f16", "comm only f16"),
        ("f32", "step f32"),
        ("f16", "step f16"),
        ("bf16", "step bf16"),
    ]
    for i, model in enumerate(models):
        for k, rate in enumerate(rates):
            ax = axes[i][k]
            jobs = [j for j in main["jobs"] if j["name"] == model and j["rate"] == rate]
            width = 0.8 / len(series)
            for s, (key, label) in enumerate(series):
                xs = [j["nodes"] + (s - len(series) / 2 + 0.5) * width for j in jobs]
                ys = [j["median"].get(key, 0) * 1e3 for j in jobs]
                ax.bar(xs, ys, width, label=label if i == 0 and k == 0 else None)
            ax.set_xticks([j["nodes"] for j in jobs])
            ax.set_xlabel("nodes")
            ax.set_ylabel("ms per step")
            ax.set_title(f"{model}, {rate}", fontsize=10)
    fig.legend(loc="lower center", ncol=len(series), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = folder / "cluster_main.png"
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("folder", nargs="?", default="docs/benchmarks")
    p.add_argument("--plot", action="store_true")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    link = load(folder, "cluster_link.json")
    if link:
        print(f"## link ({link['when']})\n\n{link_table(link)}\n")
    main_ = load(folder, "cluster_main.json")
    if main_:
        for name, table in main_tables(main_).items():
            print(f"## {name} ({main_['when']})\n\n{table}\n")
    overlap = load(folder, "cluster_overlap.json")
    if overlap:
        print(f"## overlap ({overlap['when']})\n\n{overlap_table(overlap)}\n")
    sparse = load(folder, "cluster_sparse.json")
    if sparse:
        print(f"## sparse ({sparse['when']})\n\n{sparse_table(sparse)}\n")
    faults = load(folder, "cluster_faults.json")
    if faults:
        print(f"## faults ({faults['when']})\n\n{faults_table(faults)}\n")
    if args.plot and main_:
        plot(folder, main_)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
