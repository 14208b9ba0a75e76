"""Multi-node benchmarks on an emulated cluster (root; Linux network namespaces).

    python examples/benchmarks/cluster_bench.py --suite main \
        --out docs/benchmarks/cluster_main.json

Suites (each runs cluster_worker.py jobs, one rank per emulated node; every
job measures its configurations in interleaved rounds and reports medians;
ratios are medians of per-round ratios):

  link     cluster_linkprobe.py at every node count and rate: alpha, beta and
           Open MPI's allreduce times (input of cluster_scaling.py)
  main     FACTS model and the 25M-parameter dense model at 2, 3, 4 nodes and
           10 / 1 Gbit/s: compute-only, communication-only and step time for
           float32 / float16 / bfloat16 wires and bucket sizes
  overlap  dense model, 2 nodes, both rates: one vs two inter-op threads per
           rank, and two with Open MPI yielding while it waits
  commthread  dense model, 2 nodes, both rates: 25 MB buckets reduced by the
           step's thread vs by the communication thread (KERAS_MPFP16_OVERLAP,
           "+ovl"), float32 and float16 wires, one and two inter-op threads
  sparse   IMDB-shaped model, 1 Gbit/s, 2 and 4 nodes: Embedding gradients
           densified vs gathered as rows
  auto     wire_dtype="auto" against the fixed wires, 2 nodes (--nodes),
           both rates: the dense model (f32, f16, auto) and the IMDB-shaped
           model with gathered rows (sparse, sparse_f16, sparse_auto);
           ratios auto / best fixed per round
  horovod  ours vs Horovod 0.28.1 (--horovod-venv, horovod_setup.sh), 2 nodes,
           both rates: the dense model (float32 wire vs no compression, 16-bit
           wire vs Compression.fp16) and the IMDB-shaped model (gathered rows
           vs Horovod's default sparse path, densified vs sparse_as_dense),
           plus our wire_dtype="auto" (sparse_auto for imdb) in the same
           job as our fixed wires, against Horovod's faster setting.
           Each side is its own mpirun job (one venv can't hold both Keras
           versions), so the interleaving is by job: ours, Horovod, ours, ...
           one round each, --rounds pairs; ratios are medians of per-pair
           ratios of seconds per step

Node K is pinned to core (K-1) % cores; with 3 or 4 nodes on a 2-core machine
two nodes share a core, so compute-bound figures at N > cores are
oversubscribed (the JSON records the core count). `--ranks-per-node R`
(default 1) puts R ranks on each node (R x nodes ranks; they share their
node's core). `--private-tmp` gives every node its own /tmp (as on a real
cluster); the jobs' JSON then goes through a directory every node sees.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from cluster import Cluster  # noqa: E402  (examples/benchmarks/cluster.py)
from mpi_launch import mpi_env  # noqa: E402

WORKER = HERE / "cluster_worker.py"
HVD_WORKER = HERE / "horovod_worker.py"
# Horovod's configuration that each of ours is compared with.
HVD_PAIRS = {
    "dense": {"f32": "none", "f16": "fp16"},
    "imdb": {"sparse": "sparse", "dense": "dense"},
}
# Our wire_dtype="auto" beside the fixed pairs in the horovod suite: issue
# 33's goal is auto >= 1.0x Horovod's best setting on every row.
HVD_AUTO = {"dense": "auto", "imdb": "sparse_auto"}
PROBE = HERE / "cluster_linkprobe.py"
AUTO_CONFIGS = {"dense": "f32,f16,auto", "imdb": "sparse,sparse_f16,sparse_auto"}
MAIN_CONFIGS = {
    "facts": "compute,f32,f16,bf16,comm_f32,comm_f16,comm_bf16",
    "dense": "compute,f32,f16,bf16,f32_1b,f32_4mb,comm_f32,comm_f16,comm_bf16",
}


# Open MPI's own choice of allreduce algorithm at 3 and 4 nodes moved 64 MB
# 1.7-3.2x slower than its ring over these links (the link suite measures
# both); the training suites use the ring, as docs/launching.md advises for
# large gradients over TCP.
RING = [
    "--mca",
    "coll_tuned_use_dynamic_rules",
    "1",
    "--mca",
    "coll_tuned_allreduce_algorithm",
    "4",
]


def run_job(
    cluster,
    nodes,
    argv,
    env=None,
    timeout=3600,
    extra=(),
    python=None,
    out=None,
    ranks_per_node=1,
):
    # `out`: where rank 0 writes its JSON (a path every node sees, e.g. in
    # `cluster.shared_dir()`, when the nodes have their own /tmp; the
    # default is one when they do).
    if out is None and getattr(cluster, "private_tmp", False):
        out = cluster.shared_dir("job") / "job.json"
    tmp = Path(out or f"/tmp/kmp_cluster_job_{os.getpid()}.json")
    tmp.unlink(missing_ok=True)
    cmd = cluster.mpirun_command(
        [python or sys.executable, *map(str, argv), "--out", str(tmp)],
        nodes=nodes,
        extra=list(extra),
        ranks_per_node=ranks_per_node,
    )
    t0 = time.time()
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=mpi_env(env or {}), timeout=timeout
    )
    lines = [x for x in res.stdout.splitlines() if "round" in x or x.startswith(" ")]
    print("\n".join(lines[-12:]), flush=True)
    if res.returncode != 0 or not tmp.exists():
        raise RuntimeError(
            f"job failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-4000:]}"
        )
    out = json.loads(tmp.read_text())
    out["job_seconds"] = time.time() - t0
    return out


def ratios(raw, num, den):
    return statistics.median(a / b for a, b in zip(raw[num], raw[den]))


def summarize(job):
    """Per-round ratios of one worker job (medians)."""
    raw = job["seconds_per_step"]
    s = {}
    for c in raw:
        if c in ("compute",) or c.startswith("comm_"):
            continue
        if "compute" in raw:
            s[f"{c}/compute"] = ratios(raw, c, "compute")
        comm = f"comm_{c}" if f"comm_{c}" in raw else "comm_f32"
        if comm in raw and "compute" in raw:
            rounds = zip(raw[c], raw["compute"], raw[comm])
            s[f"{c}/max(compute,comm)"] = statistics.median(
                t / max(a, b) for t, a, b in rounds
            )
            rounds = zip(raw[c], raw["compute"], raw[comm])
            s[f"{c}/(compute+comm)"] = statistics.median(
                t / (a + b) for t, a, b in rounds
            )
    for w in ("f16", "bf16"):
        if w in raw and "f32" in raw:
            s[f"{w}/f32 step"] = ratios(raw, w, "f32")
        if f"comm_{w}" in raw and "comm_f32" in raw:
            s[f"{w}/f32 comm"] = ratios(raw, f"comm_{w}", "comm_f32")
    for auto, fixed in (
        ("auto", ("f32", "f16")),
        ("sparse_auto", ("sparse", "sparse_f16")),
    ):
        if auto in raw and all(f in raw for f in fixed):
            rounds = zip(raw[auto], *(raw[f] for f in fixed))
            s[f"{auto}/best fixed"] = statistics.median(
                a / min(rest) for a, *rest in rounds
            )
    if "sparse" in raw and "dense" in raw:
        s["dense/sparse step"] = ratios(raw, "dense", "sparse")
    if "comm_sparse" in raw and "comm_dense" in raw:
        s["dense/sparse comm"] = ratios(raw, "comm_dense", "comm_sparse")
    return s


def horovod_rows(
    cluster,
    n,
    rate,
    rounds,
    horovod_python,
    models=tuple(HVD_PAIRS),
    ranks_per_node=1,
    extra=(),
    hvd_extra=(),
):
    """Ours vs Horovod on one node count and rate: jobs interleaved by pair.
    `extra`: more of our configurations (e.g. `f16@262144`, the pipelined
    wire; `f16+ovl`, the communication thread), run in our job of each pair
    and compared, like `auto`, with Horovod's faster setting of the pair
    (`compute` is recorded, not compared). `hvd_extra`: more of Horovod's
    (`compute`: Keras 2's bare step), recorded beside the pairs."""
    rows = []
    for model, pairs in HVD_PAIRS.items():
        if model not in models:
            continue
        auto = HVD_AUTO[model]
        ours = {c: [] for c in [*pairs, auto, *extra]}
        hvd = {c: [] for c in [*pairs.values(), *hvd_extra]}
        cpu = {"ours": {c: [] for c in ours}, "horovod": {c: [] for c in hvd}}
        decisions, hosts = [], None
        for r in range(rounds):
            label = f"{model} {n} nodes {rate} pair {r + 1}"
            print(f"== {label}", flush=True)
            common = ["--model", model, "--rounds", "1", "--label", label]
            job = run_job(
                cluster,
                n,
                [WORKER, *common, "--configs", ",".join(ours)],
                extra=RING,
                ranks_per_node=ranks_per_node,
            )
            for c in ours:
                ours[c] += job["seconds_per_step"][c]
                cpu["ours"][c] += job.get("cpu_seconds_per_step", {}).get(c, [])
            decisions.append(job.get("wire_auto", {}))
            hosts = hosts or job.get("hosts")  # where our ranks ran, in rank order
            job = run_job(
                cluster,
                n,
                [HVD_WORKER, *common, "--configs", ",".join(hvd)],
                extra=RING,
                python=horovod_python,
                ranks_per_node=ranks_per_node,
            )
            for c in hvd:
                hvd[c] += job["seconds_per_step"][c]
                cpu["horovod"][c] += job.get("cpu_seconds_per_step", {}).get(c, [])
        speedups = {
            f"ours {c} / horovod {h}": statistics.median(
                b / a for a, b in zip(ours[c], hvd[h])
            )
            for c, h in pairs.items()
        }
        # Per pair: Horovod's faster setting of that pair over our auto (and
        # over each extra configuration).
        for c in (auto, *(e for e in extra if e != "compute")):
            speedups[f"ours {c} / horovod best"] = statistics.median(
                min(times) / a
                for a, times in zip(ours[c], zip(*(hvd[h] for h in pairs.values())))
            )
        print(json.dumps(speedups, indent=1), flush=True)
        rows.append(
            {
                "name": f"horovod_{model}",
                "model": model,
                "nodes": n,
                "ranks_per_node": ranks_per_node,
                "hosts": hosts,
                "rate": rate,
                "allreduce_algorithm": "ring",
                "seconds_per_step": {"ours": ours, "horovod": hvd},
                # CPU seconds per step summed over the ranks, per pair.
                "cpu_seconds_per_step": cpu,
                "wire_auto": decisions,
                "speedup_ours_over_horovod": speedups,
            }
        )
    return rows


def ranks_per_node(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--ranks-per-node must be >= 1; received {value}."
        )
    return value


def main():
    p = argparse.ArgumentParser()
    p.add_argument(
        "--suite",
        required=True,
        choices=["link", "main", "overlap", "commthread", "sparse", "auto", "horovod"],
    )
    p.add_argument("--horovod-venv", default=".venv-horovod")
    p.add_argument(
        "--ranks-per-node", type=ranks_per_node, default=1, help="ranks on each node"
    )
    p.add_argument(
        "--hvd-models", default="dense,imdb", help="horovod suite: models to run"
    )
    p.add_argument(
        "--ours-extra",
        default="",
        help="horovod suite: more of our configurations in each of our jobs "
        "(comma-separated cluster_worker.py names, e.g. f16@262144,f16+ovl)",
    )
    p.add_argument(
        "--hvd-extra",
        default="",
        help="horovod suite: more of Horovod's configurations in each of its "
        "jobs (comma-separated horovod_worker.py names, e.g. compute)",
    )
    p.add_argument("--nodes", default=None, help="comma-separated node counts")
    p.add_argument("--rates", default="10gbit,1gbit")
    p.add_argument("--models", default="facts,dense")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--private-tmp", action="store_true", help="each node its own /tmp")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    default_nodes = {
        "link": "2,3,4",
        "main": "2,3,4",
        "overlap": "2",
        "commthread": "2",
        "sparse": "2,4",
        "auto": "2",
        "horovod": "2",
    }
    horovod_python = str(Path(args.horovod_venv).resolve() / "bin" / "python")
    if args.suite == "horovod" and not Path(horovod_python).exists():
        sys.exit(f"--horovod-venv {args.horovod_venv!r}: run horovod_setup.sh first")
    nodes = [int(k) for k in (args.nodes or default_nodes[args.suite]).split(",")]
    rates = args.rates.split(",") if args.suite != "sparse" else ["1gbit"]
    cluster = Cluster(max(nodes), rates[0], private_tmp=args.private_tmp)
    cluster.up()
    results = {
        "suite": args.suite,
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "cores": os.cpu_count(),
        "command": "python " + " ".join(sys.argv),
        "args": {
            "suite": args.suite,
            "nodes": ",".join(map(str, nodes)),
            "rates": ",".join(rates),
            "models": args.models,
            "hvd_models": args.hvd_models,
            "rounds": args.rounds,
            "ranks_per_node": args.ranks_per_node,
            "ours_extra": args.ours_extra,
            "hvd_extra": args.hvd_extra,
        },
        "jobs": [],
    }
    out = Path(args.out)

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))

    try:
        for rate in rates:
            cluster.set_rate(rate)
            for n in nodes:
                jobs = []
                if args.suite == "horovod":
                    results["jobs"] += horovod_rows(
                        cluster,
                        n,
                        rate,
                        args.rounds,
                        horovod_python,
                        models=args.hvd_models.split(","),
                        ranks_per_node=args.ranks_per_node,
                        extra=[c for c in args.ours_extra.split(",") if c],
                        hvd_extra=[c for c in args.hvd_extra.split(",") if c],
                    )
                    save()
                    continue
                if args.suite == "link":
                    jobs.append(({}, [PROBE], "default"))
                    jobs.append(({}, [PROBE], "ring"))
                elif args.suite == "main":
                    for model in args.models.split(","):
                        argv = [
                            WORKER,
                            "--model",
                            model,
                            "--configs",
                            MAIN_CONFIGS[model],
                        ]
                        jobs.append(({}, argv, model))
                elif args.suite == "overlap":
                    argv = [
                        WORKER,
                        "--model",
                        "dense",
                        "--configs",
                        "compute,f32,f32_1b,comm_f32",
                    ]
                    jobs.append(({"KERAS_MPFP16_THREADS": "1,1"}, argv, "inter1"))
                    jobs.append(({"KERAS_MPFP16_THREADS": "1,2"}, argv, "inter2"))
                    jobs.append(
                        (
                            {
                                "KERAS_MPFP16_THREADS": "1,2",
                                "OMPI_MCA_mpi_yield_when_idle": "1",
                            },
                            argv,
                            "inter2_yield",
                        )
                    )
                elif args.suite == "commthread":
                    argv = [
                        WORKER,
                        "--model",
                        "dense",
                        "--configs",
                        "compute,f32,f32+ovl,f16,f16+ovl",
                    ]
                    jobs.append(({"KERAS_MPFP16_THREADS": "1,1"}, argv, "inter1"))
                    jobs.append(({"KERAS_MPFP16_THREADS": "1,2"}, argv, "inter2"))
                elif args.suite == "auto":
                    for model, configs in AUTO_CONFIGS.items():
                        if model in args.models.split(","):
                            jobs.append(
                                (
                                    {},
                                    [WORKER, "--model", model, "--configs", configs],
                                    model,
                                )
                            )
                else:
                    argv = [
                        WORKER,
                        "--model",
                        "imdb",
                        "--configs",
                        "compute,dense,sparse,comm_dense,comm_sparse",
                    ]
                    jobs.append(({}, argv, "imdb"))
                for env, argv, name in jobs:
                    label = f"{name} {n} nodes {rate}"
                    print(f"== {label}", flush=True)
                    extra = (
                        [] if args.suite == "link" else ["--rounds", str(args.rounds)]
                    )
                    extra += [] if args.suite == "link" else ["--label", label]
                    ring = args.suite != "link" or name == "ring"
                    job = run_job(
                        cluster,
                        n,
                        [*argv, *extra],
                        env=env,
                        extra=RING if ring else (),
                        ranks_per_node=args.ranks_per_node,
                    )
                    job["allreduce_algorithm"] = "ring" if ring else "Open MPI default"
                    job.update(
                        name=name,
                        nodes=n,
                        rate=rate,
                        ranks_per_node=args.ranks_per_node,
                    )
                    if args.suite != "link":
                        job["ratios"] = summarize(job)
                        print(json.dumps(job["ratios"], indent=1), flush=True)
                    results["jobs"].append(job)
                    save()
    finally:
        cluster.down()
    save()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
