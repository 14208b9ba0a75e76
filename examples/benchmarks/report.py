"""Every table of figures in docs/, written from the JSON files that hold them.

    python examples/benchmarks/report.py docs/benchmarks           # rewrite the tables in place
    python examples/benchmarks/report.py docs/benchmarks --check   # exit 1 where a page and its JSON disagree
    python examples/benchmarks/report.py docs/benchmarks --print   # print every table

A table lives in a page between two markers,

    <!-- table:NAME -->
    ...generated Markdown...
    <!-- /table -->

and NAME is one of `TABLES` below, a function of the JSON folder. The pages
are every Markdown file under the docs folder and README.md beside it (the
repository root). Rewriting
replaces what is between the markers and nothing else. Figures quoted in the
prose around the tables are listed in `PROSE`: each entry builds the exact
phrase from the JSON, and the page must contain it (whitespace and line
breaks aside). `--check` does both without writing and prints what differs;
tests/test_docs_tables.py runs it in CI.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

TABLES: dict[str, Callable[[Path], str]] = {}
RUN_ALL = Path(__file__).resolve().parent / "run_all.sh"
MARKER = re.compile(
    r"(<!-- table:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(\n<!-- /table -->)", re.S
)


def pages(docs: Path) -> list[tuple[Path, Path]]:
    """(page, name to report) for every page with tables: docs/ and the README."""
    out = [(page, page.relative_to(docs)) for page in sorted(docs.rglob("*.md"))]
    readme = docs.parent / "README.md"
    if readme.exists():
        out.append((readme, Path("README.md")))
    return out


def table(name):
    def register(fn):
        TABLES[name] = fn
        return fn

    return register


def load(folder: Path, name: str) -> dict:
    path = folder / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing (a docs table is built from it)")
    return json.loads(path.read_text())


def md(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_list(xs, f="{:.0f}") -> str:
    return ", ".join(f.format(x) for x in xs)


def minus(text: str) -> str:
    """A typographic minus sign, as the prose uses."""
    return text.replace("-", "−")


def signed(x: float, f: str = "{:+.1f}") -> str:
    return minus(f.format(x))


def pm(mean: float, std: float, f: str = "{:.2f}") -> str:
    return f"{f.format(mean)} ± {f.format(std)}"


def span(xs, f="{:.2f}") -> str:
    lo, hi = f.format(min(xs)), f.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def mean_std(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else math.nan)


# -- docs/benchmarks.md ------------------------------------------------------------

PEER_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
PEER_CONFIGS = {
    "plain": "plain Keras, one process, TF default threads",
    "pinned": "plain Keras, one process on one core",
    "ours2": "ours, np=2, one core and one thread per rank (library default)",
    "mwms2_bound": "MWMS, 2 workers, one core and one thread per worker",
    "ours2_tfdef": "ours, np=2, unpinned, TF default threads",
    "mwms2": "MWMS, 2 workers, unpinned, TF default threads (its default)",
}
EFFICIENCY = "ours2_over_2x_pinned (scaling efficiency)"


def peer_ratio(folder, policy, key):
    return load(folder, "peers.json")["policies"][policy]["median_ratios"][key]


@table("peers")
def peers(folder):
    d = load(folder, "peers.json")
    rows = []
    for policy, r in d["policies"].items():
        m = r["median_ratios"]
        rows.append(
            [
                policy,
                f"**{m['ours2_over_mwms2_bound']:.2f}**",
                f"**{m['ours2_tfdef_over_mwms2']:.2f}**",
                f"{m['ours2_over_mwms2']:.2f}",
                f"{m[EFFICIENCY]:.2f}",
                f"{m['ours2_over_plain']:.2f}",
            ]
        )
    ratios = md(
        [
            "policy",
            "ours / MWMS, both pinned, one thread (like for like)",
            "ours / MWMS, both unpinned, TF default threads (like for like)",
            "ours pinned / MWMS default (each its own default)",
            "scaling efficiency: ours / (2 × pinned)",
            "ours / plain one process",
        ],
        rows,
    )
    raw_rows = []
    for policy, r in d["policies"].items():
        for c, xs in r["samples_per_s"].items():
            raw_rows.append([policy, f"{c} ({PEER_CONFIGS.get(c, '')})", fmt_list(xs)])
        shares = r["others_cpu_share"]
        per_round = [
            max(shares[c][i] for c in shares)
            for i in range(len(shares[d["configs"][0]]))
        ]
        raw_rows.append(
            [
                policy,
                "other processes' share of the CPU, the most during any run of the round",
                fmt_list([100 * x for x in per_round], "{:.0f}%"),
            ]
        )
    repeated = sum(r["repeated_rounds"] for r in d["policies"].values())
    return (
        f"*{d['when']}, {d['rounds']} interleaved rounds of {d['steps']} timed steps"
        + (
            f"; {repeated} rounds measured again because other processes used more "
            f"than {d['max_others']:.0%} of the CPU (at most {d['retries']} repeats "
            "per round)"
            if d.get("max_others") is not None
            else ""
        )
        + "*"
        f"\n\n{ratios}\n\nRaw samples/s per round:\n\n"
        + md(["policy", "config", "samples/s per round"], raw_rows)
    )


@table("autogroup")
def autogroup(folder):
    d = load(folder, "autogroup.json")
    rows = [
        [c, f"{rel:.2f}", fmt_list(d["samples_per_s"][c])]
        for c, rel in d["relative_to_quiet"].items()
    ]
    return (
        f"*{d['when']}, sched_autogroup_enabled={d['sched_autogroup_enabled']}*\n\n"
        + md(
            ["condition", "throughput relative to quiet (median)", "raw samples/s"],
            rows,
        )
    )


@table("threads")
def threads(folder):
    d = load(folder, "threads.json")
    rows = [
        [s, f"{rel:.2f}", fmt_list(d["samples_per_s"][s])]
        for s, rel in d["relative_to_off"].items()
    ]
    return f"*{d['when']}, {d['policy']}*\n\n" + md(
        ["setting", "throughput relative to TF defaults (median)", "raw samples/s"],
        rows,
    )


def overhead_rows(folder):
    out = []
    for policy in PEER_POLICIES:
        path = folder / f"overhead_{policy}.json"
        if path.exists():
            out.append((policy, json.loads(path.read_text())))
    if not out:
        raise FileNotFoundError(f"no overhead_*.json in {folder}")
    return out


@table("overhead")
def overhead(folder):
    rows = [
        [
            policy,
            f"{d['ratio_ours_over_plain']:.3f}",
            str(len(d["plain_samples_per_s"])),
            fmt_list(d["plain_samples_per_s"]),
            fmt_list(d["ours_samples_per_s"]),
        ]
        for policy, d in overhead_rows(folder)
    ]
    when = overhead_rows(folder)[0][1]["meta"]["when"]
    return f"*{when}*\n\n" + md(
        [
            "policy",
            "ours / plain (median of per-round ratios)",
            "rounds",
            "plain samples/s",
            "ours samples/s",
        ],
        rows,
    )


def allreduce_by_size(folder):
    d = load(folder, "allreduce_np2.json")
    by = {}
    for r in d["records"]:
        by.setdefault(r["bytes"], {})[r["variant"]] = r
    return d, dict(sorted(by.items()))


def allreduce_spans(folder, big=1 << 20):
    """(ours / raw at >= 1 MiB, in-step path / raw at >= 1 MiB, 16-bit slowdown)."""
    _, by = allreduce_by_size(folder)
    ours = [
        v["raw_mpi4py"]["seconds"] / v["ours_float32"]["seconds"]
        for s, v in by.items()
        if s >= big
    ]
    graph = [
        v["raw_mpi4py"]["seconds"] / v["ours_graph_float32"]["seconds"]
        for s, v in by.items()
        if s >= big
    ]
    slow = [
        v[w]["seconds"] / v["ours_float32"]["seconds"]
        for v in by.values()
        for w in ("ours_float16", "ours_bfloat16")
    ]
    return ours, graph, slow


@table("allreduce")
def allreduce(folder):
    d, by = allreduce_by_size(folder)
    variants = sorted({r["variant"] for r in d["records"]})
    rows = []
    for size, v in by.items():
        cells = [f"{v[k]['GBps']:.3f}" if k in v else "" for k in variants]
        ratio = v["raw_mpi4py"]["seconds"] / v["ours_float32"]["seconds"]
        rows.append([f"{size:,} B", *cells, f"{ratio:.2f}"])
    text = f"*{d['meta']['when']}*\n\n" + md(
        ["size", *(f"{v} GB/s" for v in variants), "ours_float32 / raw"], rows
    )
    lowp = [r for r in d["records"] if r["variant"] == "ours_float16"]
    big = max(lowp, key=lambda r: r["bytes"])
    return text + (
        f"\n\nBytes sent per rank for {big['bytes']:,} B of float32 gradients: float32 ring "
        f"allreduce ≈ {big['bytes']:,} B (2·(N−1)/N of the payload); 16-bit wire "
        f"{big['bytes_sent_per_rank']:,} B."
    )


@table("comm_heavy")
def comm_heavy(folder):
    d = load(folder, "comm_heavy.json")
    m = d["median_seconds"]
    rows = [[k, f"{m[k]:.3f}", fmt_list(d["raw"][k], "{:.3f}")] for k in m]
    rows += [
        ["compute + comm", f"{d['sum_compute_comm']:.3f}", ""],
        ["max(compute, comm)", f"{d['max_compute_comm']:.3f}", ""],
        ["compute_x2 + comm", f"{d['sum_compute_x2_comm']:.3f}", ""],
        ["max(compute_x2, comm)", f"{d['max_compute_x2_comm']:.3f}", ""],
    ]
    return (
        f"*{d['params']:,} parameters, {d['gradient_MB']:.0f} MB of gradients; {d['when']}*\n\n"
        + md(["measurement", "median seconds per step", "rounds"], rows)
    )


def comm_heavy_np2(folder):
    d = load(folder, "comm_heavy.json")
    return [v for k, v in d["median_seconds"].items() if k.startswith("np2")], d


@table("allreduce_scaling")
def allreduce_scaling(folder):
    d = load(folder, "allreduce_scaling.json")
    nps = list(d["runs"])
    sizes = [r["bytes"] for r in d["runs"][nps[0]]]
    rows = []
    for i, size in enumerate(sizes):
        cells = []
        for n in nps:
            r = d["runs"][n][i]
            cells.append(
                f"{r['raw_mpi4py'] * 1e6:.0f} ({r['closest_forced_algorithm']})"
            )
        rows.append([f"{size:,} B", *cells])
    return f"*{d['when']}, oversubscribed*\n\n" + md(
        ["size", *(f"np={n} raw µs (algorithm)" for n in nps)], rows
    )


WIRES = ("float32", "float16", "bfloat16")


def wire_quiet(d, limit=0.15):
    """{side: [round indices in which others used < limit of the CPU]}."""
    return {
        side: [i for i, x in enumerate(d["others_cpu_share"][side]) if x < limit]
        for side in ("before", "after")
    }


def wire_ms(d, side, rounds, size, wire):
    return 1e3 * statistics.median(
        d["raw"][side][i]["seconds"][f"{size}/{wire}"] for i in rounds
    )


@table("wire_ingraph")
def wire_ingraph(folder):
    d = load(folder, "wire_ingraph.json")
    quiet = wire_quiet(d)
    sizes = list(d["median_ms"]["before"])
    rows = []
    for size in sizes:
        rows.append(
            [
                size,
                " / ".join(
                    f"{wire_ms(d, 'before', quiet['before'], size, w):.1f}"
                    for w in WIRES
                ),
                " / ".join(
                    f"{wire_ms(d, 'after', quiet['after'], size, w):.1f}" for w in WIRES
                ),
            ]
        )
    n = len(d["others_cpu_share"]["before"])
    shares = ", ".join(
        f"{100 * a:.0f}/{100 * b:.0f}%"
        for a, b in zip(d["others_cpu_share"]["before"], d["others_cpu_share"]["after"])
    )
    return (
        f"*{d['when']}; before = commit {d['before_commit']}, after = {d['after']}; "
        f"medians of the {len(quiet['after'])} of {n} rounds in which other processes "
        f"used less than 15% of the CPU (per round, before/after: {shares})*\n\n"
        + md(
            [
                "gradients",
                "before: float32 / float16 / bfloat16 ms",
                "after: float32 / float16 / bfloat16 ms",
            ],
            rows,
        )
    )


def wire_spans(folder):
    """(after: 16-bit / float32, before / after for the 16-bit wires), quiet rounds."""
    d = load(folder, "wire_ingraph.json")
    q = wire_quiet(d)
    slower, faster = [], []
    for size in d["median_ms"]["before"]:
        f32 = wire_ms(d, "after", q["after"], size, "float32")
        for w in WIRES[1:]:
            after = wire_ms(d, "after", q["after"], size, w)
            slower.append(after / f32)
            faster.append(wire_ms(d, "before", q["before"], size, w) / after)
    return slower, faster


@table("overlap_probe")
def overlap_probe(folder):
    d = load(folder, "overlap_probe.json")
    rows = []
    for threads, ranks in d["results"].items():
        for r in ranks:
            steps = r["per_step"]
            delay = statistics.median(
                1e3 * (s["first_bucket_start"] - s["first_grad_ready"]) for s in steps
            )
            early = [s["buckets_started_before_last_grad"] for s in steps]
            rows.append(
                [
                    threads,
                    r["rank"],
                    f"{1e3 * r['seconds_per_step']:.0f}",
                    f"{delay:.1f}",
                    f"{span(early, '{:.0f}')} of {r['buckets']}",
                ]
            )
    return f"*{d['when']}*\n\n" + md(
        [
            "threads (intra, inter)",
            "rank",
            "ms per step",
            "first bucket starts, ms after the first gradient (median)",
            "buckets started before the last gradient, per step",
        ],
        rows,
    )


def loss_scale_events(d):
    """[(step, scale after it)] for every skipped step (steps count from 1)."""
    out, prev = [], 0
    for i, (s, k) in enumerate(zip(d["scale"], d["skipped"])):
        if k != prev:
            out.append((i + 1, s))
            prev = k
    return out


@table("loss_scale")
def loss_scale(folder):
    d = load(folder, "loss_scale.json")
    s = d["scale"]
    skips = loss_scale_events(d)
    return (
        f"{len(s)} steps on {d['ranks']} ranks, growth interval {d['growth_interval']}, "
        f"initial scale 2^{math.log2(d['initial_scale']):.0f}: scale after the last step "
        f"2^{math.log2(s[-1]):.0f} (min 2^{math.log2(min(s)):.0f}, max "
        f"2^{math.log2(max(s)):.0f}); {d['skipped'][-1]} skipped steps, at steps "
        f"{', '.join(str(k) for k, _ in skips)}; identical on all ranks: "
        f"{d['identical_on_all_ranks']}."
    )


def met(values, target) -> str:
    bad = [f"{v:.3f}" for v in values if v < target]
    return "met" if not bad else f"not met ({', '.join(bad)} < {target})"


def summary_whole_script(folder):
    st = load(folder, "state_sync.json")
    job = load(folder, "imdb_job.json")["ratios"]["kmp_np2/single"]
    return [
        [
            "state averaging costs no scaling efficiency beyond noise",
            f"BatchNorm statistics averaged every step: {st['ratio_step_over_epoch']:.3f}"
            f" of the once-per-epoch throughput "
            f"({signed(st['extra_ms_per_step'], '{:+.2f}')} ms per step)",
            "met; see [Replica state cost](#replica-state-cost)",
        ],
        [
            "IMDB job at np=2 ≤ 0.9× the unmodified single process (validation ≤ 0.6×)",
            f"whole job {job['whole_job']:.2f}, validation {job['validation']:.2f}",
            f"whole job {'met' if job['whole_job'] <= 0.9 else 'not met'}, validation "
            f"{'met' if job['validation'] <= 0.6 else 'not met'}; see "
            "[A whole script](#a-whole-script-kerasios-imdb-job-at-np2)",
        ],
    ]


def summary_cluster(folder):
    main = load(folder, "cluster_main.json")
    dense1 = [j for j in main["jobs"] if j["name"] == "dense" and j["rate"] == "1gbit"]

    def per_n(key):
        return [j["ratios"][key] for j in dense1], ", ".join(
            f"{j['ratios'][key]:.2f} (N={j['nodes']})" for j in dense1
        )

    comm16, comm16_txt = per_n("f16/f32 comm")
    step16, step16_txt = per_n("f16/f32 step")
    commb, commb_txt = per_n("bf16/f32 comm")
    stepb, stepb_txt = per_n("bf16/f32 step")
    ov = load(folder, "cluster_overlap.json")["jobs"]
    ov_txt = ", ".join(
        f"{j['ratios']['f32/max(compute,comm)']:.2f} ({j['rate']}, {j['name']})"
        for j in ov
    )
    sp = load(folder, "cluster_sparse.json")["jobs"]
    sp_vals = [j["ratios"]["dense/sparse step"] for j in sp]
    sp_txt = ", ".join(
        f"{j['ratios']['dense/sparse step']:.2f} (N={j['nodes']})" for j in sp
    )

    def under(vals, target):
        return (
            "met"
            if all(v <= target for v in vals)
            else ("met at N=2 only" if vals[0] <= target else "not met")
        )

    return [
        [
            "emulated cluster, 1 Gbit/s, 25M-parameter model: 16-bit wire comm ≤ 0.6× float32",
            f"float16 {comm16_txt}; bfloat16 {commb_txt}",
            under(comm16 + commb, 0.6)
            + "; see [Multi-node](#multi-node-emulated-cluster)",
        ],
        [
            "… and step ≤ 0.65× float32",
            f"float16 {step16_txt}; bfloat16 {stepb_txt}",
            under(step16 + stepb, 0.65),
        ],
        [
            "overlap: step ≤ 1.15 × max(compute, comm)",
            ov_txt,
            "met only where comm dwarfs compute; no overlap on one core per rank, "
            "see [Overlap](#overlap)",
        ],
        [
            "sparse Embedding gradients at 1 Gbit/s: step ≥ 1.5× faster than dense",
            sp_txt,
            (
                "met"
                if all(v >= 1.5 for v in sp_vals)
                else "met at N=2 only"
                if sp_vals[0] >= 1.5
                else "not met"
            )
            + "; see [Sparse gradients](#sparse-gradients-embedding)",
        ],
    ]


@table("summary")
def summary(folder):
    d = load(folder, "peers.json")["policies"]
    pol = [p for p in PEER_POLICIES if p in d]

    def each(key, f="{:.2f}"):
        return [d[p]["median_ratios"][key] for p in pol], ", ".join(
            f"{f.format(d[p]['median_ratios'][key])} ({p})" for p in pol
        )

    like, like_txt = each("ours2_over_mwms2_bound")
    tfdef, tfdef_txt = each("ours2_tfdef_over_mwms2")
    own, own_txt = each("ours2_over_mwms2")
    eff, eff_txt = each(EFFICIENCY)
    _, plain_txt = each("ours2_over_plain")
    over = overhead_rows(folder)
    over_txt = ", ".join(f"{o['ratio_ours_over_plain']:.2f} ({p})" for p, o in over)
    ours, graph, slow = allreduce_spans(folder)
    np2, ch = comm_heavy_np2(folder)
    rows = [
        [
            "ours at np=2 ≥ 1.9× MWMS (2 workers)",
            f"like for like, both pinned with one thread per worker: {like_txt}; "
            f"both unpinned with TF's default threads: {tfdef_txt}; "
            f"each with its own defaults: {own_txt}",
            "not met; see [Peers](#peers-ours-at-np2-vs-plain-keras-and-multiworkermirroredstrategy)"
            if min(like + tfdef + own) < 1.9
            else "met",
        ],
        [
            "scaling efficiency np=2 ÷ (2 × one pinned core) ≥ 0.95",
            eff_txt,
            met(eff, 0.95),
        ],
        ["ours at np=2 ÷ plain Keras in one process (report)", plain_txt, ""],
        [
            "np=1 overhead ≤ 2% (ratio ≥ 0.98)",
            over_txt,
            met([o["ratio_ours_over_plain"] for _, o in over], 0.98),
        ],
        [
            "fused allreduce ≥ 0.9× raw mpi4py at ≥ 1 MiB",
            span(ours),
            f"{met(ours, 0.9)}; the whole in-step path {span(graph)}, see "
            "[Allreduce](#allreduce-bandwidth-2-ranks)",
        ],
        [
            "16-bit wire halves the bytes; time vs float32",
            f"bytes halved (counted); {span(slow, '{:.2g}')}× slower on shared memory "
            "(the numpy-level path, measured before the in-graph 16-bit wire)",
            "reported",
        ],
        [
            "comm-heavy np=2 step → max(compute, comm)",
            f"≈ compute + comm ({span(np2)} s vs {ch['sum_compute_x2_comm']:.2f} s sum, "
            f"{ch['max_compute_x2_comm']:.2f} s max)",
            "not demonstrated on 2 cores",
        ],
        [
            "allreduce time vs N (np=2, 4, 8)",
            "measured, oversubscribed; algorithm reported",
            "growth is not logarithmic when oversubscribed",
        ],
        *summary_whole_script(folder),
        *summary_cluster(folder),
        [
            "GPU: fp16 vs fp32 step time and memory, ≥ 70M parameters",
            "script ready",
            "not run: no GPU available",
        ],
    ]
    return md(["target (from the issues)", "measured", ""], rows)


# -- docs/benchmarks.md: whole scripts (issues 11 and 12) ---------------------------


@table("state_sync")
def state_sync(folder):
    d = load(folder, "state_sync.json")
    sps = d["samples_per_s"]
    rows = [[mode, fmt_list(xs)] for mode, xs in sps.items()]
    return (
        f"*{d['date']}, np={d['size']}, batch {d['batch_per_rank']} per rank, "
        f"{len(sps['step'])} interleaved rounds*\n\n"
        + md(["non_trainable_sync", "samples/s per round"], rows)
        + f"\n\nstep / epoch throughput (median of per-round ratios): "
        f"{d['ratio_step_over_epoch']:.3f}; extra time per step: "
        f"{signed(d['extra_ms_per_step'], '{:+.2f}')} ms; averaged: "
        f"{d['averaged_values']} values, {d['averaged_bytes_per_step']:,} bytes "
        "per step."
    )


@table("sync_batch_norm")
def sync_batch_norm(folder):
    d = load(folder, "sync_batch_norm.json")
    rows = []
    for name, m in d["models"].items():
        t = m["seconds_per_step"]
        rows.append(
            [
                name,
                ", ".join(str(f) for f in m["batch_norm_features"]),
                fmt_list([1e3 * x for x in t["plain"]], "{:.1f}"),
                fmt_list([1e3 * x for x in t["sync"]], "{:.1f}"),
                f"**{m['ratio_sync_over_plain']:.3f}**",
                signed(m["extra_ms_per_step"], "{:+.2f}"),
            ]
        )
    first = next(iter(d["models"].values()))
    return (
        f"*{d['date']}, np={d['size']}, batch {d['batch_per_rank']} per rank, "
        f"{len(first['seconds_per_step']['plain'])} interleaved rounds of "
        f"{d['steps_per_measurement']} steps; `{d['command']}`*\n\n"
        + md(
            [
                "model",
                "BatchNorm features",
                "plain ms/step per round",
                "sync ms/step per round",
                "sync / plain (median)",
                "extra ms/step (median)",
            ],
            rows,
        )
    )


@table("before_after")
def before_after(folder):
    d = load(folder, "before_after.json")
    rows = []
    for pol in d["policies"]:
        sps = d["samples_per_s"][pol]
        share = d["others_cpu_share"][pol]
        worst = [
            max(a, b) for a, b in zip(share["before"], share["after"]) if a is not None
        ]
        rows.append(
            [
                pol,
                fmt_list(sps["before"]),
                fmt_list(sps["after"]),
                f"**{d['after_over_before'][pol]:.3f}**",
                fmt_list([100 * x for x in worst], "{:.0f}%"),
            ]
        )
    return (
        f"*{d['when']}, np=2, before = commit {d['before_commit']}, after = "
        f"commit {d['after_commit']}, {d['args']['rounds']} interleaved rounds*\n\n"
        + md(
            [
                "policy",
                "before samples/s",
                "after samples/s",
                "after / before (median of per-round ratios)",
                "others' CPU share per round",
            ],
            rows,
        )
    )


IMDB_CONFIGS = {
    "single": "keras.io's script, unmodified, one process",
    "kmp_np1": "with the three lines, one process",
    "kmp_np2": "with the three lines, `mpirun -np 2 --bind-to core`",
}


def imdb_ratio(folder, config, key):
    return load(folder, "imdb_job.json")["ratios"][f"{config}/single"][key]


@table("imdb_job")
def imdb_job(folder):
    d = load(folder, "imdb_job.json")
    rows = []
    for name, runs in d["runs"].items():
        ph = [r["phases"] for r in runs]
        rows.append(
            [
                f"{name} ({IMDB_CONFIGS.get(name, '')})",
                fmt_list([r["wall_s"] for r in runs], "{:.1f}"),
                fmt_list([p["train_s"] for p in ph], "{:.1f}"),
                fmt_list([p["validation_s"] for p in ph], "{:.1f}"),
                fmt_list([p["to_epoch_end_s"] + p["teardown_s"] for p in ph], "{:.1f}"),
                fmt_list([r["val_accuracy"] for r in runs], "{:.3f}"),
            ]
        )
    ratio_rows = [
        [
            key,
            f"**{r['whole_job']:.2f}**",
            f"{r['train']:.2f}",
            f"**{r['validation']:.2f}**",
        ]
        for key, r in d["ratios"].items()
    ]
    return (
        f"*{d['date']}, {d['rounds']} interleaved rounds; seconds per round*\n\n"
        + md(
            [
                "configuration",
                "whole job s",
                "training s",
                "validation s",
                "after validation until fit returns s",
                "val_accuracy",
            ],
            rows,
        )
        + "\n\nMedian of per-round ratios:\n\n"
        + md(["ratio", "whole job", "training", "validation"], ratio_rows)
    )


# -- docs/benchmarks.md: multi-node (emulated cluster, issue 15) --------------------
# The tables come from cluster_report.py (also runnable on its own).

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_report  # noqa: E402


def cluster_header(d) -> str:
    return f"*{d['when']}, {d['cores']} cores, {d['args'].get('rounds', '–')} rounds*"


@table("cluster_link")
def cluster_link(folder):
    d = load(folder, "cluster_link.json")
    return f"*{d['when']}, {d['cores']} cores*\n\n" + cluster_report.link_table(d)


def cluster_model(folder, model):
    d = load(folder, "cluster_main.json")
    t = cluster_report.main_tables(d)
    return (
        cluster_header(d)
        + "\n\n"
        + t[f"{model}_times"]
        + "\n\nRatios (medians of per-round ratios):\n\n"
        + t[f"{model}_ratios"]
    )


@table("cluster_facts")
def cluster_facts(folder):
    return cluster_model(folder, "facts")


@table("cluster_dense")
def cluster_dense(folder):
    return cluster_model(folder, "dense")


@table("cluster_overlap")
def cluster_overlap(folder):
    d = load(folder, "cluster_overlap.json")
    return cluster_header(d) + "\n\n" + cluster_report.overlap_table(d)


@table("cluster_sparse")
def cluster_sparse(folder):
    d = load(folder, "cluster_sparse.json")
    return cluster_header(d) + "\n\n" + cluster_report.sparse_table(d)


@table("cluster_faults")
def cluster_faults(folder):
    d = load(folder, "cluster_faults.json")
    return (
        f"*{d['when']}, heartbeat timeout {d['heartbeat_timeout_s']}*\n\n"
        + cluster_report.faults_table(d)
    )


@table("cluster_restart")
def cluster_restart(folder):
    d = load(folder, "cluster_restart.json")
    keys = [
        ("detected", "detected"),
        ("killed", "launcher ended"),
        ("relaunch", "relaunched"),
        ("ready", "imports done"),
        ("restored", "restored"),
        ("first_step", "first step"),
        ("job_ended", "job ended"),
    ]
    rows = []
    for i, run in enumerate(d["runs"]):
        t = run["timeline_s"]
        before = run["last_step_before_cut"]
        after = run["first_step_after"]
        rows.append(
            [
                i + 1,
                *(f"{t[k]:.1f}" if t[k] is not None else "–" for k, _ in keys),
                f"{run['status']}",
                f"{before[1] + 1}",
                f"{after[1]}",
                f"{run['redone_samples']} ({run['redone_samples'] / run['global_batch_before']:g})",
            ]
        )
    return (
        f"*{d['when']}, {d['cores']} cores, {d['nodes']} nodes at {d['rate']}, "
        f"heartbeat timeout {d['heartbeat_timeout_s']}; seconds after the cut*\n\n"
        + md(
            [
                "run",
                *(name for _, name in keys),
                "exit",
                "cut after step (of 40, 3 ranks)",
                "resumed after step (of 60, 2 ranks)",
                "samples redone (3-rank steps)",
            ],
            rows,
        )
    )


SCALING_ALGORITHMS = ("ring", "recursive doubling", "tree", "rabenseifner")


@table("cluster_scaling")
def cluster_scaling(folder):
    d = load(folder, "cluster_scaling.json")
    check = [
        [
            c["model"],
            c["rate"],
            c["nodes"],
            f"{c['measured_compute_s'] * 1e3:.0f}",
            f"{c['measured_comm_s'] * 1e3:.0f}",
            f"{c['measured_step_s'] * 1e3:.0f}",
            f"{c['predicted_step_s'] * 1e3:.0f}",
            f"{c['ratio_predicted_over_measured']:.2f}",
        ]
        for c in d["check_step"]
        if c["algorithm"] == "ring"
    ]
    proj = {}
    for r in d["projections"]:
        key = (r["model"], r["gbit"], r["fabric"])
        proj.setdefault(key, {}).setdefault(r["algorithm"], {})[r["nodes"]] = r[
            "efficiency"
        ]
    rows = []
    for (model, gbit, fabric), by in proj.items():
        rows.append(
            [
                model,
                f"{gbit} Gbit/s",
                fabric,
                *(
                    " / ".join(f"{by[a][n]:.2f}" for n in (16, 128, 1024))
                    for a in SCALING_ALGORITHMS
                ),
            ]
        )
    cross = [
        [
            c["model"],
            f"{c['gbit']} Gbit/s",
            c["fabric"],
            f"{c['ring_latency_equals_bandwidth_at_nodes']:,.0f}",
        ]
        for c in d["crossovers"]
    ]
    return (
        f"*{d['when']}; inputs measured: alpha {d['inputs']['alpha_tcp_s'] * 1e6:.1f} µs "
        f"(TCP) / {d['inputs']['alpha_rdma_s'] * 1e6:.1f} µs (RDMA, assumed), TCP "
        "efficiency "
        + ", ".join(f"{v:.2f} at {k}" for k, v in d["inputs"]["tcp_efficiency"].items())
        + "*\n\nThe model against the measured float32 steps (ring):\n\n"
        + md(
            [
                "model",
                "link",
                "nodes",
                "compute ms",
                "comm ms (measured)",
                "step ms (measured)",
                "step ms (model)",
                "model / measured",
            ],
            check,
        )
        + "\n\nProjected efficiency (compute / step) at 16 / 128 / 1,024 nodes:\n\n"
        + md(["model", "link", "fabric", *SCALING_ALGORITHMS], rows)
        + "\n\nNodes at which the ring's latency term equals its bandwidth term:\n\n"
        + md(["model", "link", "fabric", "nodes"], cross)
    )


# -- docs/layers.md -------------------------------------------------------------


def pct(x) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1%}" if x >= 0.1 else f"{x:.3%}"


def drift_rows(folder):
    d = load(folder, "layers_numerics.json")
    idx = {}
    for r in d["rows"]:
        idx[(r["layer"], r["T"], r["gate_bias"], r["policy"], r["impl"])] = r
    return d, idx


def err_cell(r):
    """Error vs float32, with the float64 figure where it differs at this precision."""
    a, b = pct(r["err_vs_f32"]), pct(r["err_vs_f64"])
    return a if a == b else f"{a} ({b} vs float64)"


DEFAULT_OURS = "ours:in=float32,rec=float32"


def drift_table(folder, layer):
    d, idx = drift_rows(folder)
    a = d["args"]
    rows = []
    for T in a["lengths"]:
        for bias in a["gate_biases"]:
            ref = idx[(layer, T, bias, "float32", "keras")]
            for policy in ("mixed_float16", "mixed_bfloat16"):
                k = idx[(layer, T, bias, policy, "keras")]
                o = idx[(layer, T, bias, policy, DEFAULT_OURS)]
                f1 = idx[(layer, T, bias, policy, "floor:output-rounded")]
                f2 = idx[(layer, T, bias, policy, "floor:input+output-rounded")]
                rows.append(
                    [
                        T,
                        f"{bias:g}",
                        policy,
                        err_cell(k),
                        err_cell(o),
                        f"{o['err_vs_f32'] / k['err_vs_f32']:.3f}",
                        err_cell(f1),
                        err_cell(f2),
                        pct(ref["err_vs_f64"]),
                    ]
                )
    return md(
        [
            "T",
            "bias",
            "policy",
            "Keras",
            "ours",
            "ours / Keras",
            "floor: outputs rounded",
            "floor: input + outputs rounded",
            "float32 vs float64",
        ],
        rows,
    )


@table("layers_drift_lstm")
def layers_drift_lstm(folder):
    d, _ = drift_rows(folder)
    return (
        f"*{d['date']}, {d['seconds']:.0f} s*\n\nLSTM (forget-gate bias):\n\n"
        + drift_table(folder, "lstm")
    )


@table("layers_drift_gru")
def layers_drift_gru(folder):
    return "GRU (update-gate bias):\n\n" + drift_table(folder, "gru")


def drift_target(folder):
    """(largest ours/Keras ratio where Keras exceeds 1%, whether <= 0.5 everywhere)."""
    d, _ = drift_rows(folder)
    checks = [
        c for c in d["checks"] if c["impl"] == DEFAULT_OURS and c["target_applies"]
    ]
    return max(c["ratio_vs_keras"] for c in checks), all(
        c["meets_target"] for c in checks
    )


@table("layers_drift_variants")
def layers_drift_variants(folder):
    d, idx = drift_rows(folder)
    a = d["args"]
    variants = [
        (i, r) for i in a["input_precisions"] for r in a["recurrent_precisions"]
    ]
    big = max(a["gate_biases"])
    rows = []
    for layer in a["layers"]:
        for T in a["lengths"]:
            for policy in ("mixed_float16", "mixed_bfloat16"):
                key = (layer, T, big, policy)
                rows.append(
                    [
                        layer.upper(),
                        T,
                        policy,
                        pct(idx[(*key, "keras")]["err_vs_f32"]),
                        *(
                            pct(idx[(*key, f"ours:in={i},rec={r}")]["err_vs_f32"])
                            for i, r in variants
                        ),
                    ]
                )
    return md(
        ["layer", "T", "policy", "Keras", *(f"in={i}, rec={r}" for i, r in variants)],
        rows,
    )


TF32_MODE_NAMES = {
    "none": "off",
    "input": "input projection",
    "recurrent": "recurrent product",
    "both": "both products",
}


@table("layers_tf32")
def layers_tf32(folder):
    """Drift with the layers' float32 products rounded to TF32 (emulated)."""
    d = load(folder, "layers_tf32.json")
    a = d["args"]
    idx = {
        (r["layer"], r["T"], r["tf32"], r["policy"], r["impl"]): r for r in d["rows"]
    }
    policy = a["policies"][0]
    bias = a["gate_biases"][0]
    precisions = a["recurrent_precisions"]
    both_tf32x3 = "tf32x3" in a["input_precisions"] and "tf32x3" in precisions
    rows = []
    for layer in a["layers"]:
        for T in a["lengths"]:
            for mode in a["tf32"]:
                keras16 = idx[(layer, T, mode, policy, "keras")]["err_vs_f32"]
                ours = {
                    r: idx[(layer, T, mode, policy, f"ours:in=float32,rec={r}")][
                        "err_vs_f32"
                    ]
                    for r in precisions
                }
                extra = []
                if both_tf32x3:
                    key = (layer, T, mode, policy, "ours:in=tf32x3,rec=tf32x3")
                    three = idx[key]["err_vs_f32"]
                    extra = [pct(three), f"{three / keras16:.3f}"]
                rows.append(
                    [
                        layer.upper(),
                        T,
                        TF32_MODE_NAMES[mode],
                        pct(keras16),
                        pct(idx[(layer, T, mode, "float32", "keras")]["err_vs_f32"]),
                        *(pct(ours[r]) for r in precisions),
                        f"{ours['float32'] / keras16:.3f}",
                        *extra,
                    ]
                )
    return (
        f"*{d['date']}, {d['seconds']:.0f} s; {policy}, gate bias {bias:g}, "
        f"batch {a['batch']}, {a['units']} units, {a['features']} features, "
        f"last {a['tail']} outputs*\n\n"
        + md(
            [
                "layer",
                "T",
                "TF32 on",
                f"Keras {policy}",
                "Keras float32",
                *(
                    f"ours rec={r}" + (" (default)" if r == "float32" else "")
                    for r in precisions
                ),
                "ours default / Keras " + policy,
                *(
                    ["ours in=tf32x3, rec=tf32x3", "tf32x3 / Keras " + policy]
                    if both_tf32x3
                    else []
                ),
            ],
            rows,
        )
    )


@table("layers_xla")
def layers_xla(folder):
    """XLA vs no XLA, ours vs Keras's layer, CPU train steps."""
    d = load(folder, "layers_xla.json")
    a = d["args"]
    labels = [
        "ours+xla / ours",
        "ours+xla / keras+xla",
        "ours+xla / keras",
        "keras+xla / keras",
    ]
    rows = []
    for r in d["results"]:
        kept = r["xla_kept"]
        diff = r["max_abs_diff_xla_vs_not"]
        rows.append(
            [
                r["layer"].upper(),
                r["policy"],
                "yes" if kept["ours+xla"] and kept["keras+xla"] else "NO",
                f"{diff['ours']:.1e}",
                f"{diff['keras']:.1e}",
                *(f"{r['ratios'][k]['median']:.2f}" for k in labels),
            ]
        )
    load_avg = d["load_average_at_end"][0]
    return (
        f"*{d['date']}, {a['rounds']} rounds of {a['steps']} steps, "
        f"{d['seconds']:.0f} s, load average {load_avg:.0f} on "
        f"{d['machine'].split(', ')[1]} at the end; batch {a['batch']}, "
        f"{a['length']} steps, {a['features']} features, {a['units']} units*\n\n"
        + md(
            [
                "layer",
                "policy",
                "XLA kept",
                "max abs diff XLA vs not, ours",
                "same, Keras",
                *(f"median {k}" for k in labels),
            ],
            rows,
        )
    )


def speed(folder, name):
    d = load(folder, name)
    return d, {(r["layer"], r["policy"], r["impl"]): r for r in d["results"]}


def ratios(r):
    return " ".join(f"{x:.2f}" for x in r["ratios"])


def speed_header(d):
    a = d["args"]
    return (
        f"*{d['date']}, {a['rounds']} rounds, {d['seconds']:.0f} s; batch {a['batch']}, "
        f"{a['length']} steps, {a['features']} features, {a['units']} units*\n\n"
    )


@table("layers_speed_default")
def layers_speed_default(folder):
    d, _ = speed(folder, "layers_speed_default.json")
    rows = [
        [r["layer"].upper(), r["policy"], f"{r['median_ratio']:.3f}", ratios(r)]
        for r in d["results"]
    ]
    return speed_header(d) + md(
        ["layer", "policy", "median ours / Keras", "per-round ratios"], rows
    )


def variant_name(impl):
    i, r = (p.split("=")[1] for p in impl.split(":")[1].split(","))
    return i, r


@table("layers_speed_variants")
def layers_speed_variants(folder):
    d, _ = speed(folder, "layers_speed_variants.json")
    rows = []
    for r in d["results"]:
        i, rec = variant_name(r["impl"])
        name = f"{i}, {rec}" + (" (default)" if r["impl"] == DEFAULT_OURS else "")
        rows.append(
            [
                r["layer"].upper(),
                r["policy"],
                name,
                f"{r['median_ratio']:.3f}",
                ratios(r),
            ]
        )
    return speed_header(d) + md(
        [
            "layer",
            "policy",
            "input, recurrent",
            "median ours / Keras",
            "per-round ratios",
        ],
        rows,
    )


@table("layers_speed_256units")
def layers_speed_256units(folder):
    d, _ = speed(folder, "layers_speed_256units.json")
    rows = []
    for r in d["results"]:
        _, rec = variant_name(r["impl"])
        name = rec + (" (default)" if r["impl"] == DEFAULT_OURS else "")
        rows.append(
            [
                r["layer"].upper(),
                r["policy"],
                name,
                f"{r['median_ratio']:.3f}",
                ratios(r),
            ]
        )
    return speed_header(d) + md(
        ["layer", "policy", "recurrent", "median ours / Keras", "per-round ratios"],
        rows,
    )


EEG_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def eeg_runs(folder):
    d = load(folder, "layers_eeg.json")
    by = {(r["policy"], r["seed"]): r for r in d["runs"]}
    return d, by


def epoch_jumps(runs, key="test_accuracy_per_epoch"):
    """Absolute change of a per-epoch value from one epoch to the next, all runs."""
    return [abs(b - a) for r in runs for a, b in zip(r[key], r[key][1:])]


@table("layers_eeg")
def layers_eeg(folder):
    d, by = eeg_runs(folder)
    seeds = d["args"]["seeds"]
    rows = []
    for s in seeds:
        rows.append(
            [s]
            + [
                f"{by[(p, s)]['test_accuracy']:.3f} ({by[(p, s)]['test_accuracy_last5_mean']:.3f})"
                for p in EEG_POLICIES
            ]
        )
    for key, label in (
        ("test_accuracy", "last epoch"),
        ("test_accuracy_last5_mean", "last-5 mean"),
    ):
        rows.append(
            [f"mean ± std, {label}"]
            + [
                pm(*mean_std([by[(p, s)][key] for s in seeds]), "{:.3f}")
                for p in EEG_POLICIES
            ]
        )
        rows.append(
            ["paired by seed vs float32", ""]
            + [
                minus(
                    pm(
                        *mean_std(
                            [by[(p, s)][key] - by[("float32", s)][key] for s in seeds]
                        ),
                        "{:+.3f}",
                    ).replace("± +", "± ")
                )
                for p in EEG_POLICIES[1:]
            ]
        )
    return f"*{d['date']}*\n\n" + md(["seed", *EEG_POLICIES], rows)


# -- docs/convergence.md ---------------------------------------------------------

PRECISION_CONFIGS = {
    "float32": "float32",
    "mixed_float16:kmp": "mixed_float16, kmp LSTM",
    "mixed_float16:keras": "mixed_float16, Keras LSTM",
    "mixed_bfloat16:kmp": "mixed_bfloat16, kmp LSTM",
    "mixed_bfloat16:keras": "mixed_bfloat16, Keras LSTM",
}
PRECISION_METRICS = {
    "accuracy, last epoch": lambda r: r["test_accuracy"],
    "AUC, last epoch": lambda r: r["test_auc"],
    "accuracy, mean of last 5 epochs": lambda r: statistics.fmean(
        r["test_accuracy_per_epoch"][-5:]
    ),
    "AUC, mean of last 5 epochs": lambda r: statistics.fmean(
        r["test_auc_per_epoch"][-5:]
    ),
}


def precision(folder):
    d = load(folder, "convergence_precision.json")
    by = {(r["config"], r["seed"]): r for r in d["runs"]}
    return d, by, d["args"]["seeds"]


def paired(by, seeds, config, value):
    diffs = [100 * (value(by[(config, s)]) - value(by[("float32", s)])) for s in seeds]
    m, sd = mean_std(diffs)
    return m, sd, sd / math.sqrt(len(diffs))


@table("conv_precision_mean")
def conv_precision_mean(folder):
    d, by, seeds = precision(folder)
    rows = [
        [label]
        + [
            pm(*mean_std([100 * f(by[(c, s)]) for s in seeds]), "{:.1f}")
            for f in PRECISION_METRICS.values()
        ]
        for c, label in PRECISION_CONFIGS.items()
    ]
    return f"*{d['date']}, seeds {seeds[0]}–{seeds[-1]}*\n\n" + md(
        ["configuration", *PRECISION_METRICS], rows
    )


@table("conv_precision_paired")
def conv_precision_paired(folder):
    _, by, seeds = precision(folder)
    rows = []
    for c, label in list(PRECISION_CONFIGS.items())[1:]:
        cells = []
        for f in PRECISION_METRICS.values():
            m, sd, se = paired(by, seeds, c, f)
            cells.append(f"{signed(m)} ± {sd:.1f} (SE {se:.1f})")
        rows.append([label, *cells])
    return md(["configuration", *PRECISION_METRICS], rows)


@table("conv_precision_runs")
def conv_precision_runs(folder):
    _, by, seeds = precision(folder)
    rows = [
        [s]
        + [
            f"{100 * by[(c, s)]['test_accuracy']:.1f} / {100 * by[(c, s)]['test_auc']:.1f}"
            for c in PRECISION_CONFIGS
        ]
        for s in seeds
    ]
    header = [
        "seed",
        *(
            lab.replace(" LSTM", "").replace("kmp", "kmp")
            for lab in PRECISION_CONFIGS.values()
        ),
    ]
    return md(header, rows)


def sci(x) -> str:
    if x == 0:
        return "0"
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant}e{int(exp)}"


@table("conv_equivalence")
def conv_equivalence(folder):
    d = load(folder, "convergence_equivalence.json")
    rows = [
        [
            r["workers"],
            r["steps"],
            sci(r["max_weight_rel_diff"]),
            sci(r["max_loss_abs_diff"]),
            sci(r["max_rate_abs_diff"]),
        ]
        for r in d["results"]
    ]
    return md(
        [
            "N",
            "steps",
            "max relative weight difference",
            "max loss difference",
            "max learning-rate difference",
        ],
        rows,
    )


def scaling(folder):
    d = load(folder, "convergence_scaling.json")
    by = {(r["workers"], r["rule"], r["seed"]): r for r in d["runs"]}
    return d, by


def run_of(n, rule):
    return "none" if n == 1 and not rule.startswith("paper") else rule


def scaling_cell(d, by, rule, n):
    vals = [100 * by[(n, run_of(n, rule), s)]["test_auc"] for s in d["args"]["seeds"]]
    return mean_std(vals)


def scaling_paired(d, by, rule, n):
    seeds = d["args"]["seeds"]
    diffs = [
        100 * (by[(n, rule, s)]["test_auc"] - by[(1, run_of(1, rule), s)]["test_auc"])
        for s in seeds
    ]
    return mean_std(diffs)


RATE_RULES = {
    "linear": lambda n: n,
    "sqrt": lambda n: math.sqrt(n),
    "paper": lambda n: n / (1 + n / 100),
}


def scaling_table(d, by, rules, rate_rows):
    workers = sorted(d["args"]["workers"])
    lr0 = d["args"]["learning_rate"]
    rows = [
        [rule] + [pm(*scaling_cell(d, by, rule, n)) for n in workers] for rule in rules
    ]
    for i, (rule, f) in enumerate(RATE_RULES.items() if rate_rows else []):
        label = f"rate at N (lr0 = {lr0:g}): {rule}" if i == 0 else f"rate at N: {rule}"
        rows.append([label] + [f"{lr0 * f(n):.3g}" for n in workers])
    return md(["rule", *(f"N = {n}" for n in workers)], rows)


STUDY_RULES = ["none", "linear", "linear+warmup", "sqrt", "paper"]
ADDED_RULES = ["sqrt+warmup", "paper+warmup"]


def paired_table(d, by, rules, ns=(32, 64, 128)):
    rows = [
        [rule] + [minus(pm(*scaling_paired(d, by, rule, n), "{:.2f}")) for n in ns]
        for rule in rules
    ]
    return md(["rule", *(f"N = {n}" for n in ns)], rows)


@table("conv_scaling")
def conv_scaling(folder):
    d, by = scaling(folder)
    return f"*{d['date']}*\n\n" + scaling_table(d, by, STUDY_RULES, rate_rows=True)


@table("conv_scaling_paired")
def conv_scaling_paired(folder):
    d, by = scaling(folder)
    return paired_table(d, by, STUDY_RULES)


@table("conv_scaling_warmup")
def conv_scaling_warmup(folder):
    d, by = scaling(folder)
    return (
        scaling_table(d, by, ADDED_RULES, rate_rows=False)
        + "\n\nPaired by seed, difference to N = 1 (points):\n\n"
        + paired_table(d, by, ADDED_RULES)
    )


@table("conv_pilots")
def conv_pilots(folder):
    d = load(folder, "convergence_pilots.json")
    at_1 = {r["learning_rate"]: 100 * r["auc"] for r in d["sweep"]}
    rows = []
    for p in d["pilots"]:
        cells = {rule: 100 * p["auc"][rule] for rule in STUDY_RULES}
        best = max(cells.values())
        n1 = at_1.get(p["learning_rate"])
        rows.append(
            [
                f"{p['learning_rate']:g}",
                f"{p['warmup_epochs']:g} epoch",
                "" if n1 is None else f"{n1:.2f}",
                *(f"**{v:.2f}**" if v == best else f"{v:.2f}" for v in cells.values()),
            ]
        )
    n = d["pilots"][0]["workers"]
    sweep = ", ".join(f"lr0 = {lr:g} → {auc:.2f}" for lr, auc in sorted(at_1.items()))
    return (
        f"*{d['date']}; seed {d['seed']}, {d['epochs']} epochs; final test AUC, points*\n\n"
        + md(["lr0", "warmup", "N = 1", *(f"N = {n}: {r}" for r in STUDY_RULES)], rows)
        + f"\n\nAt N = 1: {sweep}."
    )


# -- docs/reliability.md -------------------------------------------------------

FAULTS = {
    "exception-layer": "exception in a layer",
    "exception-callback": "exception in a callback",
    "exception-input": "exception in the input pipeline",
    "sigkill": "SIGKILL",
    "exit": "`sys.exit(3)`",
}


@table("fault_exit_times")
def fault_exit_times(folder):
    d = load(folder, "fault_exit_times.json")
    n = max(len(v) for v in d.values())
    rows = [[FAULTS.get(k, k), *(f"{t:.2f}" for t in v)] for k, v in d.items()]
    return md(["fault", *(f"run {i + 1}" for i in range(n))], rows)


@table("wire_auto_refit")
def wire_auto_refit(folder):
    d = load(folder, "wire_auto_refit.json")
    rounds = d["per_round"]
    configs = list(rounds[0])
    rows = []
    for c in configs:
        runs = [r[c] for r in rounds]
        timed = [x["fits"][-1] for x in runs]
        ratio = statistics.median(
            r[c]["samples_per_s"] / r["float16"]["samples_per_s"] for r in rounds
        )
        rows.append(
            [
                f"`{c}`",
                fmt_list([x["samples_per_s"] for x in runs], "{:.1f}"),
                fmt_list([x["fit_samples_per_s"] for x in runs], "{:.1f}"),
                ", ".join(x["effective"] for x in runs),
                ", ".join(
                    f"{t.get('traces', 0)}/{t.get('measurements', 0)}/"
                    f"{t.get('confirmations', 0)}"
                    for t in timed
                ),
                f"{ratio:.2f}",
            ]
        )
    loads = [x["load"][i] for r in rounds for x in r.values() for i in (0, 1)]
    trial = ", reductions' timings forced to favour float16" if d["force_trial"] else ""
    return (
        f"*np={d['np']} on one box, model `{d['model']}`, warm-up fit of "
        f"{d['warmup']} steps then a timed fit of {d['steps']}{trial}; "
        f"{len(rounds)} interleaved rounds; loaded machine, load average "
        f"{min(loads):.0f}-{max(loads):.0f}*\n\n"
        + md(
            [
                "configuration",
                "timed fit, samples/s after its first step (per round)",
                "whole timed fit, samples/s",
                "wire it ran",
                "second fit: traces / measurements / trials",
                "/ float16 (median of per-round ratios)",
            ],
            rows,
        )
    )


@table("collective_cost")
def collective_cost(folder):
    d = load(folder, "collective_cost.json")
    res = d["results"]
    versions = res if d.get("before") else {"now": res}
    ranks = list(next(iter(versions.values())))
    header = ["layer"] + [f"N={n} {v}" for n in ranks for v in versions]
    layers = list(next(iter(versions.values()))[ranks[0]][0]["layers"])
    rows = []
    for layer in layers:
        row = [f"`{layer}`"]
        for n in ranks:
            for v in versions.values():
                row.append(
                    fmt_list([job["layers"][layer]["median_us"] for job in v[n]])
                )
        rows.append(row)
    loads = [
        x
        for v in versions.values()
        for jobs in v.values()
        for j in jobs
        for x in j["load"]
    ]
    return (
        f"*{d['elements']} float32 values per call, {d['calls']} calls x "
        f"{d['reps']} repetitions per job (median, slowest rank), {d['cores']} "
        f"cores; loaded machine, load average {min(loads):.0f}-{max(loads):.0f}; "
        "microseconds per call*\n\n" + md(header, rows)
    )


def _layer_medians(jobs) -> dict:
    """{layer: median over the jobs of each job's median us per call}."""
    layers = jobs[0]["layers"]
    return {
        k: statistics.median(j["layers"][k]["median_us"] for j in jobs) for k in layers
    }


def _split_row(m: dict) -> list:
    """One collective's cost, split (us): what each layer adds to the one below."""

    def us(x):
        return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"

    return [
        us(m["graph_call"]),
        us(m["crossing_numpy"] - m["graph_call"]),
        us(m["crossing_py"] - m["graph_call"]),
        us(m["float32_local"] - m["crossing_numpy"]),
        us(m["float16_local"] - m["crossing_py"]),
        us(m["mpi"]),
        us(m["mpi_x2"]),
        us(m["collectives"] - m["mpi"]),
        us(m["float32_wire"] - m["float32_local"] - m["mpi"]),
        us(m["float32_wire"]),
        us(m["float16_wire"]),
    ]


SPLIT_HEADER = [
    "compiled-function call (once per step)",
    "crossing: `numpy_function`",
    "crossing: `py_function`",
    "copies and graph work, float32 wire",
    "copies, codec and graph work, 16-bit wire",
    "MPI `Allreduce`, 4 KiB",
    "MPI `Alltoall` + `Allgather`",
    "library observers",
    "waiting for the other ranks (float32)",
    "float32 wire, whole",
    "16-bit wire, whole",
]


def _split_table(folder, *names: str, only: str | None = None) -> str:
    """The split of one collective's cost, a row per N (and version), from
    collective_cost.py's JSON files (`only`: that version of each)."""
    rows, loads, settings = [], [], []
    for name in names:
        d = load(folder, name)
        res = d["results"]
        versions = res if d.get("before") else {"now": res}
        if only:
            versions = {only: versions[only]}
        for v, per_n in versions.items():
            for n, jobs in per_n.items():
                if not jobs:
                    continue
                loads += [x for j in jobs for x in j["load"]]
                label = f"{n}" if len(versions) == 1 else f"{n}, {v}"
                rows.append([label, len(jobs), *_split_row(_layer_medians(jobs))])
        settings.append(
            f"N = {', '.join(res_ns(d))}: {d['calls']} calls x {d['reps']} "
            "repetitions per job"
        )
    where = d.get("where", "one box")
    return (
        f"*{where}; {d['elements']} float32 values per call; "
        f"{'; '.join(settings)} (median, slowest rank; the median over jobs); "
        f"{d['cores']} cores; loaded machine (two other engineers' jobs), load "
        f"average {min(loads):.0f}-{max(loads):.0f}; microseconds per call*\n\n"
        + md(["N", "jobs", *SPLIT_HEADER], rows)
    )


def res_ns(d: dict) -> list[str]:
    res = d["results"]
    per_n = res["now"] if d.get("before") else res
    return [n for n, jobs in per_n.items() if jobs]


@table("collective_split_box")
def collective_split_box(folder):
    return _split_table(
        folder, "collective_cost_cut.json", "collective_cost_box.json", only="now"
    )


@table("collective_split_nodes")
def collective_split_nodes(folder):
    return _split_table(folder, "collective_cost_nodes.json")


@table("collective_split_nodes_10gbit")
def collective_split_nodes_10gbit(folder):
    return _split_table(folder, "collective_cost_nodes_10gbit.json")


@table("collective_cut")
def collective_cut(folder):
    d = load(folder, "collective_cost_cut.json")
    res = d["results"]
    before = next(v for v in res if v.startswith("before"))
    rows, loads = [], []
    for n in res["now"]:
        for layer in (
            "float32_local",
            "float16_local",
            "float32_wire",
            "float16_wire",
            "graph_call",
            "mpi",
        ):
            b = [j["layers"][layer]["median_us"] for j in res[before][n]]
            a = [j["layers"][layer]["median_us"] for j in res["now"][n]]
            ratios = [x / y for x, y in zip(a, b)]
            rows.append(
                [
                    n,
                    f"`{layer}`",
                    fmt_list(b),
                    fmt_list(a),
                    fmt_list(ratios, "{:.2f}"),
                    f"{statistics.median(ratios):.2f}",
                ]
            )
        loads += [x for v in (before, "now") for j in res[v][n] for x in j["load"]]
    return (
        f"*one box, {d['rounds']} interleaved rounds (one job per version per "
        f"round, the order alternating), {d['calls']} calls x {d['reps']} "
        "repetitions per job (median, slowest rank); loaded machine (two other "
        f"engineers' jobs), load average {min(loads):.0f}-{max(loads):.0f}; "
        "microseconds per call*\n\n"
        + md(
            [
                "N",
                "layer",
                f"{before} (per round)",
                "now (per round)",
                "now / before (per round)",
                "median ratio",
            ],
            rows,
        )
    )


@table("scaling_model_fit")
def scaling_model_fit(folder):
    d = load(folder, "scaling_model.json")
    rows = []
    for rate, f in sorted(d["fit"].items(), key=lambda kv: -int(kv[0][:-4])):
        o, L = f["overhead_o_s"], f["latency_L_s_per_doubling"]
        B = f["bandwidth_B_bytes_per_s"]
        rows.append(
            [
                rate.replace("gbit", " Gbit/s"),
                f"{o['f32'] * 1e3:.2f} / {o['16'] * 1e3:.2f} ms",
                f"{L['f32'] * 1e3:.2f} / {L['16'] * 1e3:.2f} ms",
                f"{B / 1e6:.0f} MB/s ({B * 8 / 1e9:.2f} Gbit/s)",
                f"{f['codec_g_s_per_param'] * 1e9:.1f} ns/param",
            ]
        )
    h = d["held_out_summary"]
    return (
        f"*o and L measured ({d['inputs']['per_collective']}: float32 / 16-bit "
        f"wire), B and g fitted on N = "
        f"{', '.join(str(n) for n in d['inputs']['fit_nodes'])}; held out "
        f"(N = 4, {h['points']} points): predicted / measured step time "
        f"{h['step_ratio_min']:.2f}-{h['step_ratio_max']:.2f}*\n\n"
        + md(
            ["link", "o (per step)", "L (per doubling)", "B", "g (16-bit codec)"],
            rows,
        )
    )


@table("scaling_model_predictions")
def scaling_model_predictions(folder):
    d = load(folder, "scaling_model.json")
    rows = []
    short = {
        "this CPU, scaled by parameters": "CPU",
        "10x faster (assumed GPU)": "GPU?",
    }
    order = {"measured L": 0, "link L": 1}
    preds = sorted(
        d["predictions_100gbit"],
        key=lambda r: (r["params"], order.get(r["latency"], 2), r["compute_s"] < 1),
    )
    for r in preds:
        if r["compute"].startswith("this CPU") and r["params"] > 10_000_000:
            continue  # >= 0.99 whatever L: in the JSON
        rows.append(
            [
                r["model"] if r["params"] < 10_000_000 else "70M parameters",
                r["wire"],
                f"{short[r['compute']]} {r['compute_s']:.3g} s",
                r["latency"].replace(" L", ""),
                *(f"{r['efficiency'][n]:.3f}" for n in ("4", "20", "100")),
                f"{r['seed_form_c']:.2g}",
            ]
        )
    return "*100 Gbit/s, predicted; parallel efficiency compute / T(N)*\n\n" + md(
        ["model", "wire", "compute", "L", "N = 4", "N = 20", "N = 100", "seed form c"],
        rows,
    )


@table("owner_sum_cost")
def owner_sum_cost(folder):
    d = load(folder, "owner_sum_cost.json")
    rows = [
        [
            r["ranks"],
            f"{r['values']:,}",
            fmt_list(r["us"]["tensorflow"]),
            fmt_list(r["us"]["numpy"]),
            f"{r['median_us']['tensorflow'] / r['median_us']['numpy']:.1f}",
            "yes" if r["same_bits"] else "**no**",
        ]
        for r in d["rows"]
    ]
    return (
        f"*one process, {d['calls']} calls per round, {d['rounds']} interleaved "
        f"rounds; loaded machine, load average {d['load'][0]:.0f}-"
        f"{d['load'][1]:.0f}; microseconds per call*\n\n"
        + md(
            [
                "N rows",
                "values per row",
                "TensorFlow (XLA-fused), per round",
                "numpy, per round",
                "TensorFlow / numpy (medians)",
                "same bits",
            ],
            rows,
        )
    )


# -- figures quoted in prose --------------------------------------------------------
# (page, function of the JSON folder returning a phrase the page must contain)


def _peer(policy, key, f="{:.2f}"):
    return lambda folder: f.format(peer_ratio(folder, policy, key))


def _pinned_samples(folder):
    d = load(folder, "peers.json")["policies"]
    med = {p: statistics.median(d[p]["samples_per_s"]["pinned"]) for p in PEER_POLICIES}
    return (
        f"{med['float32']:.0f} samples/s in float32, {med['mixed_bfloat16']:.0f} in "
        f"`mixed_bfloat16` and {med['mixed_float16']:.0f} in `mixed_float16`"
    )


def _eeg_noise(folder):
    d, _ = eeg_runs(folder)
    jumps = [100 * j for j in epoch_jumps(d["runs"])]
    return (
        f"by up to {max(jumps):.0f} points from one epoch to the next "
        f"({sum(j > 10 for j in jumps)} of the {len(jumps)} epoch-to-epoch changes "
        f"exceed 10 points, median {statistics.median(jumps):.1f}"
    )


def _precision_range(folder):
    d, by, seeds = precision(folder)
    vals = [
        a
        for r in d["runs"]
        if r["config"] == "float32"
        for a in r["test_accuracy_per_epoch"]
    ]
    jumps = epoch_jumps([r for r in d["runs"] if r["config"] == "float32"])
    return (
        f"test accuracy of the float32 runs ranges over {min(vals):.2f}–{max(vals):.2f} "
        f"across epochs, and moves by up to {100 * max(jumps):.0f} points from one epoch to the next"
    )


def _loss_scale_prose(folder):
    d = load(folder, "loss_scale.json")
    skips = loss_scale_events(d)
    first = [k for k, s in skips if k < 100]
    settle = skips[len(first) - 1][1]
    return (
        f"skipped steps {', '.join(map(str, first[:-1]))} and {first[-1]}, halving "
        f"the scale each time: 2^{math.log2(settle):.0f} after {len(first)} skips"
    )


def _scaling_runs(folder):
    d, _ = scaling(folder)
    added = sum(r["rule"] in ADDED_RULES for r in d["runs"])
    return f"{added} more runs"


def _allreduce_phrases(folder):
    ours, graph, slow = allreduce_spans(folder)
    return f"{span(slow, '{:.2g}')}× slower here"


def _threads_gain(folder):
    d = load(folder, "threads.json")["samples_per_s"]
    gains = [
        100 * (statistics.median(x / y for x, y in zip(d[a], d[b])) - 1)
        for a, b in (("bound", "bound_1,2"), ("1,1", "1,2"))
    ]
    return span(gains, "{:.0f}")


def _autogroup(folder):
    r = load(folder, "autogroup.json")["relative_to_quiet"]
    return (
        f"halves the pinned run ({r['nice19']:.2f}: the same 2× as the 753 / 376 streaks); "
        f"lowering its autogroup gives the core back ({r['autogroup19']:.2f})"
    )


def _comm_heavy(folder):
    np2, d = comm_heavy_np2(folder)
    return (
        f"{span(np2)} s per step for every bucketing, against compute_x2 + comm = "
        f"{d['sum_compute_x2_comm']:.2f} s and max = {d['max_compute_x2_comm']:.2f} s"
    )


def _small_messages(folder):
    _, by = allreduce_by_size(folder)
    small = [
        v["raw_mpi4py"]["seconds"] / v["ours_float32"]["seconds"]
        for size, v in by.items()
        if size < 1 << 20
    ]
    graph = allreduce_spans(folder)[1]
    return (
        f"Below 1 MiB ours is {span(small, '{:.1f}')}× raw",
        f"The full in-step path is {span(graph, '{:.1f}')}× raw at ≥ 1 MiB",
    )


def _overhead(folder):
    (_, f32), (_, bf16) = overhead_rows(folder)[:2]
    return (
        f"{100 * (f32['ratio_ours_over_plain'] - 1):.0f}% in float32 (the same in an "
        f"earlier run, 1.07–1.15) and {100 * (bf16['ratio_ours_over_plain'] - 1):.1f}% "
        "in bfloat16"
    )


def _drift_target(folder):
    largest, ok = drift_target(folder)
    verdict = "met in every case" if ok else "NOT met everywhere"
    return f"{verdict} (largest ratio where it applies: {largest:.3f})"


def _eeg_times(folder):
    d, _ = eeg_runs(folder)
    t = {
        p: statistics.fmean(r["train_seconds"] for r in d["runs"] if r["policy"] == p)
        for p in EEG_POLICIES
    }
    return ", ".join(f"{p} {t[p]:.0f} s" for p in EEG_POLICIES)


def _np8_growth(folder):
    d = load(folder, "allreduce_scaling.json")["runs"]
    g = [b["raw_mpi4py"] / a["raw_mpi4py"] for a, b in zip(d["2"], d["8"])]
    return f"grows {span(g, '{:.2g}')}× (17× at 1 KiB, {g[-1]:.2g}× at 16 MiB)"


def _wide(folder):
    """Phrases about the 256-unit speed run and the matching drift figures."""
    _, r = speed(folder, "layers_speed_256units.json")
    comp = "ours:in=float32,rec=compute"

    def m(layer, policy, impl):
        return r[(layer, policy, impl)]["median_ratio"]

    _, drift = drift_rows(folder)
    key = ("lstm", 4096, 8.0, "mixed_bfloat16")
    return [
        f"(ours / Keras {m('lstm', 'mixed_bfloat16', DEFAULT_OURS):.2f})",
        f"faster than Keras ({m('lstm', 'mixed_bfloat16', comp):.2f}x)",
        f"forget bias 8: {pct(drift[(*key, comp)]['err_vs_f32'])} instead of "
        f"{pct(drift[(*key, DEFAULT_OURS)]['err_vs_f32'])}; Keras "
        f"{pct(drift[(*key, 'keras')]['err_vs_f32'])}",
        f'{m("gru", "mixed_bfloat16", comp):.2f} with `"compute"` against '
        f"{m('gru', 'mixed_bfloat16', DEFAULT_OURS):.2f} with float32",
        f"LSTM {m('lstm', 'mixed_float16', DEFAULT_OURS):.2f} against "
        f'{m("lstm", "mixed_float16", comp):.2f} with `"compute"`, GRU '
        f"{m('gru', 'mixed_float16', DEFAULT_OURS):.2f} against "
        f"{m('gru', 'mixed_float16', comp):.2f}",
    ]


def _variants(folder):
    d, r = speed(folder, "layers_speed_variants.json")
    a = d["args"]
    split_costliest = all(
        max(
            (r[(layer, pol, f"ours:in={i},rec={rec}")]["median_ratio"], rec)
            for rec in a["recurrent_precisions"]
        )[1]
        == "split"
        for layer in a["layers"]
        for pol in a["policies"]
        for i in a["input_precisions"]
    )
    every = [x for row in d["results"] for x in row["ratios"]]
    _, default = speed(folder, "layers_speed_default.json")
    key = ("lstm", "mixed_float16", DEFAULT_OURS)
    return [
        "`split` is the costliest option in every group"
        if split_costliest
        else "`split` is not the costliest option in every group",
        f"spread widely (from {min(every):.2f} to {max(every):.2f})",
        f"measured {default[key]['median_ratio']:.3f} in the run above and "
        f"{r[key]['median_ratio']:.3f} here",
    ]


def _eeg_seeds_1_3(folder):
    _, by = eeg_runs(folder)
    m = statistics.fmean(by[("float32", s)]["test_accuracy"] for s in (1, 2, 3))
    return f"here seeds 1-3 give {m:.3f} with block averaging"


def _seed1_both(folder):
    _, eeg = eeg_runs(folder)
    _, prec, _ = precision(folder)
    a, b = eeg[("float32", 1)]["test_accuracy"], prec[("float32", 1)]["test_accuracy"]
    same = f"{a:.5f}" == f"{b:.5f}"
    return f"Seed 1's value ({b:.5f}) is the one" if same else "seed 1 differs"


def _peers_prose(folder):
    d = load(folder, "peers.json")["policies"]
    pol = [p for p in PEER_POLICIES if p in d]

    def three(key):
        m = [d[p]["median_ratios"][key] for p in pol]
        return f"{m[0]:.2f} (float32), {m[1]:.2f} (bfloat16) and {m[2]:.2f} (float16)"

    f32 = d["float32"]["samples_per_s"]
    pinned2 = 2 * statistics.median(f32["pinned"])
    return [
        f"{three('ours2_over_mwms2_bound')} with both pinned to one core and one "
        "thread per worker",
        f"{three('ours2_tfdef_over_mwms2')} with both unpinned on TensorFlow's "
        "default threads",
        f"each with its own defaults, {three('ours2_over_mwms2')}",
        f"Scaling efficiency** is {three(EFFICIENCY)}",
        f"unpinned MWMS ran at {span(f32['mwms2'], '{:.0f}')} samples/s in float32 "
        f"and pinned MWMS at {span(f32['mwms2_bound'], '{:.0f}')}; 1.9× the faster "
        f"of those is above what two cores can do at all (2 × pinned ≈ {pinned2:.0f})",
    ]


def _wire_prose(folder):
    slower, faster = wire_spans(folder)
    d = load(folder, "wire_ingraph.json")
    q = wire_quiet(d)
    loud = [x for x in d["others_cpu_share"]["before"] if x >= 0.15] + [
        x for x in d["others_cpu_share"]["after"] if x >= 0.15
    ]
    n = len(d["others_cpu_share"]["before"])
    return [
        f"are still {span(slower, '{:.1f}')}× slower than float32, and "
        f"{span(faster, '{:.1f}')}× faster than the",
        f"{n - len(q['after'])} of the {n} rounds ran while other processes took "
        f"{span([100 * x for x in loud], '{:.0f}')}% of the CPU",
    ]


# -- README.md: the short table of headline figures ----------------------------------


# Quiet-machine runs of ours (with wire_dtype="auto") against Horovod.
HOROVOD_QUIET = ("cluster_horovod_quiet.json", "cluster_horovod_imdb_quiet.json")
# The same at 4 emulated nodes (two ranks per core), where Horovod wins:
# (file, link) pairs, each link from the run that could be read on it (the
# 10 Gbit/s pairs of the first file ran while the machine's speed swung).
HOROVOD_4NODES = (
    ("cluster_horovod_4nodes_codec.json", "1gbit"),
    ("cluster_horovod_4nodes_codec_10gbit.json", "10gbit"),
)
# The same with two ranks on each of the 4 nodes (8 ranks).
HOROVOD_4X2 = "cluster_horovod_4x2.json"
# 4 nodes at 1 Gbit/s on a quiet machine with the pipelined 16-bit wire.
HOROVOD_4NODES_PIPELINE = "cluster_horovod_4nodes_pipeline.json"
# The 2- and 4-node rows again on a 4x slower CPU (AVX2, no AVX-512), with
# each side's bare step and CPU seconds per step (issue 40, 2026-12-06).
HOROVOD_SLOW_CPU = (
    "cluster_horovod_2nodes_cpu.json",
    "cluster_horovod_4nodes_cpu.json",
)


@table("readme")
def readme(folder):
    """The README's benchmark table: a few headline ratios, each with its N."""
    p = load(folder, "peers.json")
    d = p["policies"]
    pol = [q for q in PEER_POLICIES if q in d]

    def peer(key):
        return span([d[q]["median_ratios"][key] for q in pol])

    over = overhead_rows(folder)
    ours, _, _ = allreduce_spans(folder)
    ar = load(folder, "allreduce_np2.json")
    job = load(folder, "imdb_job.json")
    main = load(folder, "cluster_main.json")
    # Every node count measured, not the best one: {nodes: [ratios]}.
    wire16 = {
        j["nodes"]: [j["ratios"][k] for k in ("f16/f32 step", "bf16/f32 step")]
        for j in main["jobs"]
        if j["name"] == "dense" and j["rate"] == "1gbit"
    }
    sparse = load(folder, "cluster_sparse.json")
    sparse_by_n = {
        j["nodes"]: [j["ratios"]["dense/sparse step"]] for j in sparse["jobs"]
    }
    np2 = load(folder, "horovod.json")  # each side at np=2
    (one,) = load(folder, "horovod_np1.json")["median_ratios"].values()  # np=1

    def by_nodes(ratios: dict, f: str) -> tuple[str, str]:
        """(the range over every node count, "N nodes: x" for each)."""
        every = [r for n in sorted(ratios) for r in ratios[n]]
        each = ", ".join(f"{n} nodes {span(ratios[n], f)}×" for n in sorted(ratios))
        return f"{span(every, f)}×", each

    def nodes(ratios: dict) -> str:
        ns = sorted(ratios)
        return " and ".join(map(str, ns)) if len(ns) == 2 else f"{ns[0]}–{ns[-1]}"

    def auto_vs_horovod(*runs) -> list[float]:
        """Every job's Horovod-best ÷ ours-with-auto ratio in `runs`."""
        return [
            ratio
            for d in runs
            for j in d["jobs"]
            for key, ratio in j["speedup_ours_over_horovod"].items()
            if "auto / horovod best" in key
        ]

    hvd = [load(folder, f) for f in HOROVOD_QUIET]
    auto_vs_hvd = auto_vs_horovod(*hvd)
    hvd4 = [(load(folder, f), rate) for f, rate in HOROVOD_4NODES]
    auto_vs_hvd4 = auto_vs_horovod(
        *({"jobs": [j for j in d["jobs"] if j["rate"] == rate]} for d, rate in hvd4)
    )
    hvd4x2 = load(folder, HOROVOD_4X2)
    auto_vs_hvd4x2 = auto_vs_horovod(hvd4x2)

    slow = [load(folder, f) for f in HOROVOD_SLOW_CPU]
    slow_each = "; ".join(
        f"{j['nodes']} nodes at {j['rate'].replace('gbit', ' Gbit/s')} "
        + "{:.2f}×".format(auto_vs_horovod({"jobs": [j]})[0])
        for d in slow
        for j in d["jobs"]
    )

    hvd4p = load(folder, HOROVOD_4NODES_PIPELINE)
    (pipe_vs_hvd4,) = [
        ratio
        for j in hvd4p["jobs"]
        for key, ratio in j["speedup_ours_over_horovod"].items()
        if "@" in key and "/ horovod best" in key
    ]
    (pipe_segment,) = {
        key.split("@")[1].split()[0]
        for j in hvd4p["jobs"]
        for key in j["speedup_ours_over_horovod"]
        if "@" in key
    }

    def n(data):
        return str(recorded_settings(data)["rounds"])

    rows = [
        [
            "scaling efficiency: np=2 ÷ two single-core processes",
            peer(EFFICIENCY),
            n(p),
        ],
        [
            "np=2 ÷ `tf_keras` + MultiWorkerMirroredStrategy, both pinned, "
            "one thread per worker",
            f"{peer('ours2_over_mwms2_bound')}×",
            n(p),
        ],
        [
            "np=2 ÷ MultiWorkerMirroredStrategy, both on TensorFlow's default threads",
            f"{peer('ours2_tfdef_over_mwms2')}×",
            n(p),
        ],
        [
            "one process: ours ÷ the bare optimizer (samples/s)",
            span([o["ratio_ours_over_plain"] for _, o in over]),
            n(over[0][1]),
        ],
        ["fused allreduce ÷ raw mpi4py at ≥ 1 MiB", f"{span(ours)}×", n(ar)],
        [
            "keras.io's IMDB job at np=2 ÷ the unmodified single process (wall time)",
            f"{job['ratios']['kmp_np2/single']['whole_job']:.2f}×",
            n(job),
        ],
        [
            f"emulated {nodes(wire16)} nodes at 1 Gbit/s: 16-bit wire step ÷ "
            "float32 wire step "
            f"(float16 and bfloat16; {by_nodes(wire16, '{:.2f}')[1]})",
            by_nodes(wire16, "{:.2f}")[0],
            n(main),
        ],
        [
            f"emulated {nodes(sparse_by_n)} nodes at 1 Gbit/s: IMDB-shaped step, "
            "dense ÷ gathered "
            f"Embedding rows ({by_nodes(sparse_by_n, '{:.2f}')[1]})",
            by_nodes(sparse_by_n, "{:.2f}")[0],
            n(sparse),
        ],
        [
            "np=2, benchmark model: ours ÷ Horovod 0.28.1 in samples/s, float32 "
            "wire vs no compression and float16 wire vs `Compression.fp16` "
            f"({one:.2f}× of it is the single process: Keras 3 on TensorFlow 2.21 "
            "vs Keras 2 on 2.15)",
            f"{span(list(np2['median_ratios'].values()))}×",
            n(np2),
        ],
        [
            "emulated 2 nodes, 10 and 1 Gbit/s, dense and IMDB-shaped models: "
            "Horovod 0.28.1's step (its faster setting) ÷ ours with "
            '`wire_dtype="auto"`',
            f"{span(auto_vs_hvd)}×",
            n(hvd[0]),
        ],
        [
            "the same at 4 emulated nodes (two ranks per core), dense model, "
            "10 and 1 Gbit/s: Horovod wins (what bounds it: docs/benchmarks.md)",
            f"{span(auto_vs_hvd4)}×",
            n(hvd4[0][0]),
        ],
        [
            "the same, 1 Gbit/s, quiet machine, ours with the pipelined float16 "
            f"wire (`WIRE_PIPELINE_SEGMENT={pipe_segment}`, opt-in): Horovod "
            "still wins",
            f"{pipe_vs_hvd4:.2f}×",
            n(hvd4p),
        ],
        [
            "4 emulated nodes with two ranks on each (8 ranks, four per core), "
            "dense model, 10 and 1 Gbit/s: Horovod's faster ÷ ours with `auto`",
            f"{span(auto_vs_hvd4x2)}×",
            n(hvd4x2),
        ],
        [
            "emulated 2 and 4 nodes again on a 4× slower CPU (AVX2, no AVX-512), "
            "dense model: Horovod's faster ÷ ours with `auto` "
            f"({slow_each})",
            f"{span(auto_vs_horovod(*slow))}×",
            n(slow[0]),
        ],
    ]
    return (
        f"*Measured on a {p['cpus']}-core CPU at np=2 (the cluster rows: emulated "
        "nodes on that machine); each figure is the median of N interleaved rounds (a range: over precision policies, "
        "message sizes or node counts, never the best of them). Every table, plot and command: "
        "[docs/benchmarks.md](docs/benchmarks.md).*\n\n"
        + md(["measure", "ratio", "N"], rows)
    )


PROSE: list[tuple[str, Callable[[Path], str]]] = [
    *(("benchmarks.md", lambda f, i=i: _wire_prose(f)[i]) for i in range(2)),
    *(("benchmarks.md", lambda f, i=i: _peers_prose(f)[i]) for i in range(5)),
    ("layers.md", _eeg_seeds_1_3),
    ("convergence.md", _seed1_both),
    *(("layers.md", lambda f, i=i: _variants(f)[i]) for i in range(3)),
    *(("layers.md", lambda f, i=i: _wide(f)[i]) for i in range(5)),
    ("benchmarks.md", _np8_growth),
    (
        "benchmarks.md",
        lambda f: f"one inter-op thread is {_threads_gain(f)}% faster than two",
    ),
    ("launching.md", lambda f: f"({_threads_gain(f)}% faster at np=2 on 2 cores"),
    ("benchmarks.md", _autogroup),
    ("benchmarks.md", _comm_heavy),
    ("benchmarks.md", lambda f: _small_messages(f)[0]),
    ("benchmarks.md", lambda f: _small_messages(f)[1]),
    ("benchmarks.md", _overhead),
    ("layers.md", _drift_target),
    ("layers.md", _eeg_times),
    ("benchmarks.md", _allreduce_phrases),
    (
        "benchmarks.md",
        lambda f: f"raw mpi4py at ≥ 1 MiB: {span(allreduce_spans(f)[0])}×",
    ),
    ("benchmarks.md", _loss_scale_prose),
    ("layers.md", _eeg_noise),
    ("convergence.md", _precision_range),
    ("convergence.md", _scaling_runs),
    ("faq.md", _pinned_samples),
]


# -- the commands that write the JSON ------------------------------------------------
# Every JSON file must be written by a command shown in the docs, that command
# must carry the settings the file records, and every line of run_all.sh
# must be a command the docs show.

COMMAND = re.compile(
    r"(?:mpirun|python)[^`\n]*?--out docs/benchmarks/(?P<name>[\w.-]+\.json)"
)


def documented_commands(docs: Path) -> dict[str, list[str]]:
    """{JSON file name: [commands shown in the docs that write it]}."""
    found: dict[str, list[str]] = {}
    for page in sorted(docs.rglob("*.md")):
        # Commands continued over lines with a backslash are joined first.
        text = re.sub(r"\\\n\s*", " ", page.read_text())
        for m in COMMAND.finditer(text):
            found.setdefault(m.group("name"), []).append(norm(m.group(0)))
    return found


def recorded_settings(d: dict) -> dict:
    """The settings a JSON file records, by command-line flag name."""
    if "args" in d:
        rec = dict(d["args"])
    elif "settings" in d:
        rec = dict(d["settings"])
    else:
        rec = {}
    for k in ("rounds", "steps", "max_others", "retries"):
        if k in d and k not in rec:
            rec[k] = d[k]
    lists = (
        d.get("samples_per_s")
        or d.get("raw")
        or ({"p": d["plain_samples_per_s"]} if "plain_samples_per_s" in d else None)
    )
    if "rounds" not in rec and isinstance(lists, dict):
        rec["rounds"] = len(next(iter(lists.values())))
    if "records" in d and "rounds" not in rec:
        rec["rounds"] = len(d["records"][0]["seconds_all"])
    if "runs" in d and isinstance(d["runs"], dict):  # allreduce_scaling
        first = next(iter(d["runs"].values()))
        if isinstance(first, list) and first and "bytes" in first[0]:
            rec["sizes"] = ",".join(str(r["bytes"]) for r in first)
    if d and all(isinstance(v, list) for v in d.values()):  # fault_exit_times
        rec["repeat"] = len(next(iter(d.values())))
    return rec


def flags(command: str) -> dict[str, list[str]]:
    words = command.split()
    out, key = {}, None
    for w in words:
        if w.startswith("--"):
            key = w[2:].replace("-", "_")
            out[key] = []
        elif key is not None:
            out[key].append(w)
    return out


def same(values: list[str], recorded) -> bool:
    def conv(v, like):
        if isinstance(like, bool):
            return like
        if isinstance(like, int):
            return int(v)
        if isinstance(like, float):
            return float(v)
        return v

    if isinstance(recorded, list):
        return (
            all(conv(v, recorded[0]) in recorded for v in values) if recorded else False
        )
    if not values:
        return bool(recorded)
    return len(values) == 1 and conv(values[0], recorded) == recorded


# Flags that do not change what the file holds.
NOT_SETTINGS = {"out", "data"}


def command_problems(folder: Path, docs: Path, run_all: Path | None) -> list[str]:
    problems = []
    commands = documented_commands(docs)
    for path in sorted(folder.glob("*.json")):
        if path.name not in commands:
            problems.append(
                f"{path.name}: no page shows a command that writes it "
                f"(--out docs/benchmarks/{path.name})"
            )
            continue
        rec = recorded_settings(json.loads(path.read_text()))
        for cmd in commands[path.name]:
            for key, values in flags(cmd).items():
                if key in NOT_SETTINGS or key not in rec:
                    continue
                if not same(values, rec[key]):
                    problems.append(
                        f"{path.name}: the command `{cmd}` says --{key} "
                        f"{' '.join(values)}, the file records {rec[key]!r}"
                    )
    if run_all is not None and run_all.exists():
        shown = {c for cmds in commands.values() for c in cmds}
        for line in run_all.read_text().splitlines():
            if '--out "$OUT/' not in line:
                continue
            cmd = norm(
                line.replace('"$OUT/', "docs/benchmarks/")
                .replace('.json"', ".json")
                .replace('.png"', ".png")
            )
            if cmd not in shown:
                problems.append(f"run_all.sh runs `{cmd}`, which no page shows")
    return problems


# -- driver -------------------------------------------------------------------------


def norm(text: str) -> str:
    return " ".join(text.split())


def render(folder: Path, name: str) -> str:
    if name not in TABLES:
        raise KeyError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}")
    return TABLES[name](folder)


PM = re.compile(r"[+−-]?\d+\.\d+ ± \d+\.\d+")


def convergence_pm_figures(folder) -> set[str]:
    """Every "mean ± std" the convergence JSON files support, as printed."""
    out = set()
    d, by = scaling(folder)
    rules = [r for r in (*STUDY_RULES, *ADDED_RULES) if r in d["args"]["rules"]]
    for rule in rules:
        for n in d["args"]["workers"]:
            cell = scaling_cell(d, by, rule, n)
            out |= {pm(*cell), pm(*cell, "{:.1f}")}
            if n > 1:
                diff = scaling_paired(d, by, rule, n)
                out |= {minus(pm(*diff)), minus(pm(*diff, "{:.1f}"))}
    _, prec, seeds = precision(folder)
    for c in PRECISION_CONFIGS:
        for f in PRECISION_METRICS.values():
            out.add(pm(*mean_std([100 * f(prec[(c, s)]) for s in seeds]), "{:.1f}"))
            if c != "float32":
                m, sd, _ = paired(prec, seeds, c, f)
                out.add(f"{signed(m)} ± {sd:.1f}")
    return out


def pm_problems(folder: Path, docs: Path) -> list[str]:
    """ "mean ± std" figures in convergence.md's prose that no JSON supports."""
    page = docs / "convergence.md"
    if not page.exists():
        return []
    text = re.sub(r"<!-- table:.*?<!-- /table -->", "", page.read_text(), flags=re.S)
    known = convergence_pm_figures(folder)
    return [
        f"convergence.md: {m.group(0)!r} in the prose is not a figure of the JSON"
        for m in PM.finditer(text)
        if m.group(0) not in known
    ]


def process(folder: Path, docs: Path, write: bool) -> list[str]:
    """Rewrites (or checks) every marked table; returns the problems found."""
    problems, seen = [], set()
    for page, rel in pages(docs):
        text = page.read_text()

        def replace(m, rel=rel):
            name, body = m.group("name"), m.group("body")
            seen.add(name)
            try:
                new = "\n" + render(folder, name) + "\n"
            except (FileNotFoundError, KeyError) as e:
                problems.append(f"{rel}: table {name}: {e}")
                return m.group(0)
            if new != body:
                diff = "\n".join(
                    difflib.unified_diff(
                        body.splitlines(),
                        new.splitlines(),
                        "page",
                        "JSON",
                        lineterm="",
                        n=0,
                    )
                )
                problems.append(f"{rel}: table {name} differs from its JSON:\n{diff}")
            return m.group(1) + new + m.group(4)

        new_text = MARKER.sub(replace, text)
        if write and new_text != text:
            page.write_text(new_text)
            print(f"rewrote tables in {rel}")
    for name in sorted(set(TABLES) - seen):
        problems.append(f"table {name} is not placed in any page")
    problems += command_problems(folder, docs, RUN_ALL)
    problems += pm_problems(folder, docs)
    for page, phrase in PROSE:
        try:
            want = phrase(folder)
        except (FileNotFoundError, KeyError) as e:
            problems.append(f"{page}: {e}")
            continue
        if norm(want) not in norm((docs / page).read_text()):
            problems.append(f"{page}: the prose should say {want!r} (from the JSON)")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "folder", nargs="?", default="docs/benchmarks", help="the JSON results"
    )
    p.add_argument("--docs", help="the Markdown pages (default: the folder's parent)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="compare only; exit 1 on a difference"
    )
    mode.add_argument("--print", action="store_true", help="print every table")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    docs = Path(args.docs) if args.docs else folder.parent
    if args.print:
        for name in TABLES:
            print(
                f"<!-- table:{name} -->\n\n{render(folder, name)}\n\n<!-- /table -->\n"
            )
        return 0
    problems = process(folder, docs, write=not args.check)
    if args.check:
        for pr in problems:
            print(pr)
        print(
            f"{len(problems)} difference(s) between the docs and the JSON in {folder}"
        )
        return 1 if problems else 0
    # Written: only what could not be regenerated is left to report.
    left = [pr for pr in problems if "differs from its JSON" not in pr]
    for pr in left:
        print(pr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
