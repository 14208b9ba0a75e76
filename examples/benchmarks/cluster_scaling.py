"""Scaling model: step time and efficiency projected to 16..1024 nodes.

    python examples/benchmarks/cluster_scaling.py \
        --link docs/benchmarks/cluster_link.json \
        --main docs/benchmarks/cluster_main.json \
        --out docs/benchmarks/cluster_scaling.json \
        --plot docs/benchmarks/cluster_scaling.png

The alpha-beta(-gamma) model of an allreduce of M bytes over N nodes, with
alpha the one-way latency of a message, beta the link's bandwidth (bytes/s)
and gamma the time to add one byte of float32 data (memory bound):

  ring                  2(N-1) alpha + 2 (N-1)/N M/beta + (N-1)/N M gamma
  recursive doubling    log2(N) (alpha + M/beta + M gamma)
  tree (binomial reduce + broadcast, not pipelined)
                        2 log2(N) (alpha + M/beta) + log2(N) M gamma
  rabenseifner (halving reduce-scatter + doubling allgather)
                        2 log2(N) alpha + 2 (N-1)/N M/beta + (N-1)/N M gamma

(log2 rounded up for N not a power of two). The weak-scaling step time is
compute + allreduce (no overlap: measured on the emulated cluster, see
docs/benchmarks.md) and the efficiency is compute / step.

Inputs, all measured: alpha and beta from cluster_linkprobe.py (ping-pong
between two emulated nodes at each link rate), gamma from a numpy float32 add
on this machine, the compute time per step from cluster_worker.py's
`compute` configuration at 2 nodes (one core each, not oversubscribed). The
model is first checked against Open MPI's measured allreduce times at 2-4
nodes and against the measured step times; then projected to 16..1024 nodes
at 10/100/200 Gbit/s, where beta = line rate x the TCP efficiency measured on
the emulated 1 Gbit/s link and alpha is the measured emulated latency
(a TCP-like alpha; an RDMA fabric has alpha of a few microseconds, given as a
second projection).
"""

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

ALGORITHMS = ("ring", "recursive doubling", "tree", "rabenseifner")
PROJECT_NODES = [16, 32, 64, 128, 256, 512, 1024]
PROJECT_GBIT = [10, 100, 200]
RDMA_ALPHA = 2e-6


def allreduce_seconds(
    alg: str, n: int, m: float, alpha: float, beta: float, gamma: float
):
    if n <= 1:
        return 0.0
    lg = math.ceil(math.log2(n))
    frac = (n - 1) / n
    if alg == "ring":
        return 2 * (n - 1) * alpha + 2 * frac * m / beta + frac * m * gamma
    if alg == "recursive doubling":
        return lg * (alpha + m / beta + m * gamma)
    if alg == "tree":
        return 2 * lg * (alpha + m / beta) + lg * m * gamma
    if alg == "rabenseifner":
        return 2 * lg * alpha + 2 * frac * m / beta + frac * m * gamma
    raise ValueError(f"unknown algorithm {alg!r}; allowed: {', '.join(ALGORITHMS)}")


def measure_gamma() -> float:
    """Seconds per byte of a float32 in-place add (memory bound), best of 5."""
    a = np.ones(16 << 20, np.float32)  # 64 MiB
    b = np.ones_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    return best / a.nbytes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--link", required=True)
    p.add_argument("--main", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--plot")
    args = p.parse_args()
    link = json.loads(Path(args.link).read_text())
    main_ = json.loads(Path(args.main).read_text())
    gamma = measure_gamma()

    # -- link figures per emulated rate (2-node ping-pong) -----------------------
    rates = {}
    for job in link["jobs"]:
        if job["nodes"] == 2:
            rates[job["rate"]] = {
                "alpha": job["alpha_s"],
                "beta": job["beta_bytes_per_s"],
            }
    line = {r: float(r.removesuffix("gbit")) * 1e9 / 8 for r in rates}
    efficiency = {r: rates[r]["beta"] / line[r] for r in rates}

    # -- check 1: Open MPI's allreduce at 2-4 nodes vs the model -----------------
    check_allreduce = []
    for job in link["jobs"]:
        lf = rates[job["rate"]]
        for size, times in job["allreduce_s"].items():
            m = float(size)
            measured = min(times)
            pred = {
                a: allreduce_seconds(a, job["nodes"], m, lf["alpha"], lf["beta"], gamma)
                for a in ALGORITHMS
            }
            best = min(pred, key=lambda a: abs(math.log(pred[a] / measured)))
            check_allreduce.append(
                {
                    "open_mpi_algorithm": job.get("allreduce_algorithm", "default"),
                    "rate": job["rate"],
                    "nodes": job["nodes"],
                    "bytes": int(m),
                    "measured_s": measured,
                    "predicted_s": pred,
                    "closest": best,
                    "closest_ratio": pred[best] / measured,
                }
            )

    # -- check 2: measured float32 step times vs compute + model comm ------------
    compute2, params = {}, {}
    check_step = []
    for job in main_["jobs"]:
        med = job["median"]
        params[job["model"]] = job["params"]
        if job["nodes"] == 2:
            compute2.setdefault(job["model"], []).append(med["compute"])
    for job in main_["jobs"]:
        if "f32" not in job["median"]:
            continue
        lf = rates[job["rate"]]
        m = params[job["model"]] * 4
        med = job["median"]
        for a in ("ring", "rabenseifner"):
            pred = med["compute"] + allreduce_seconds(
                a, job["nodes"], m, lf["alpha"], lf["beta"], gamma
            )
            check_step.append(
                {
                    "model": job["model"],
                    "rate": job["rate"],
                    "nodes": job["nodes"],
                    "algorithm": a,
                    "measured_step_s": med["f32"],
                    "measured_compute_s": med["compute"],
                    "measured_comm_s": med.get("comm_f32"),
                    "predicted_step_s": pred,
                    "ratio_predicted_over_measured": pred / med["f32"],
                }
            )

    # -- projections ---------------------------------------------------------------
    eff_tcp = statistics.median(efficiency.values())
    alpha_tcp = statistics.median(v["alpha"] for v in rates.values())
    projections = []
    for model, comp in compute2.items():
        compute = statistics.median(comp)
        m = params[model] * 4
        for gbit in PROJECT_GBIT:
            beta = gbit * 1e9 / 8 * eff_tcp
            for fabric, alpha in (("tcp", alpha_tcp), ("rdma", RDMA_ALPHA)):
                for a in ALGORITHMS:
                    for n in PROJECT_NODES:
                        comm = allreduce_seconds(a, n, m, alpha, beta, gamma)
                        projections.append(
                            {
                                "model": model,
                                "gbit": gbit,
                                "fabric": fabric,
                                "alpha_s": alpha,
                                "algorithm": a,
                                "nodes": n,
                                "compute_s": compute,
                                "comm_s": comm,
                                "latency_part_s": allreduce_seconds(
                                    a, n, 0.0, alpha, beta, gamma
                                ),
                                "step_s": compute + comm,
                                "efficiency": compute / (compute + comm),
                            }
                        )

    # -- when is communication logarithmic? -----------------------------------------
    # Ring: the bandwidth term 2(N-1)/N M/beta is flat in N, the latency term
    # 2(N-1) alpha linear; the latency term overtakes the bandwidth term at
    # N* = M/(beta alpha) + 1. Below N*, ring time is ~constant (better than
    # log); above, linear. Tree/recursive doubling are log2(N) x (alpha + M/beta):
    # logarithmic always, but each step moves all M bytes, so for large M they
    # cost log2(N)/2 times the ring's bandwidth term.
    crossovers = []
    for model in compute2:
        m = params[model] * 4
        for gbit in PROJECT_GBIT:
            beta = gbit * 1e9 / 8 * eff_tcp
            for fabric, alpha in (("tcp", alpha_tcp), ("rdma", RDMA_ALPHA)):
                crossovers.append(
                    {
                        "model": model,
                        "gbit": gbit,
                        "fabric": fabric,
                        "ring_latency_equals_bandwidth_at_nodes": m / (beta * alpha)
                        + 1,
                        "message_bytes": m,
                        "bandwidth_term_s": 2 * m / beta,
                        "latency_per_hop_s": alpha,
                    }
                )

    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "inputs": {
            "link": args.link,
            "main": args.main,
            "gamma_s_per_byte": gamma,
            "rates": rates,
            "tcp_efficiency": efficiency,
            "alpha_tcp_s": alpha_tcp,
            "alpha_rdma_s": RDMA_ALPHA,
            "compute_2_nodes_s": {k: statistics.median(v) for k, v in compute2.items()},
            "params": params,
        },
        "check_allreduce": check_allreduce,
        "check_step": check_step,
        "projections": projections,
        "crossovers": crossovers,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))

    print(f"gamma {gamma * 1e9:.3f} ns/byte ({1 / gamma / 1e9:.2f} GB/s add)")
    for r, v in rates.items():
        print(
            f"{r}: alpha {v['alpha'] * 1e6:.1f} us, beta {v['beta'] * 8 / 1e9:.3f} Gbit/s "
            f"({efficiency[r]:.2f} of line rate)"
        )
    print("\nOpen MPI allreduce at 2-4 nodes: measured vs model (closest algorithm)")
    for c in check_allreduce:
        print(
            f"  {c['open_mpi_algorithm']:>16} {c['rate']:>6} N={c['nodes']} {c['bytes']:>9} B: measured "
            f"{c['measured_s'] * 1e3:9.3f} ms, {c['closest']} {c['closest_ratio']:.2f}x"
        )
    print("\nfloat32 step: measured vs compute + model allreduce")
    for c in check_step:
        print(
            f"  {c['model']:>5} {c['rate']:>6} N={c['nodes']} {c['algorithm']:>12}: "
            f"measured {c['measured_step_s']:.3f} s, predicted {c['predicted_step_s']:.3f} s "
            f"({c['ratio_predicted_over_measured']:.2f}x)"
        )
    print("\nprojected efficiency (compute / step)")
    for model in compute2:
        for gbit in PROJECT_GBIT:
            for fabric in ("tcp", "rdma"):
                rows = [
                    x
                    for x in projections
                    if x["model"] == model
                    and x["gbit"] == gbit
                    and x["fabric"] == fabric
                ]
                cells = "; ".join(
                    f"{a}: "
                    + " ".join(
                        f"{x['efficiency']:.2f}"
                        for x in rows
                        if x["algorithm"] == a and x["nodes"] in (16, 128, 1024)
                    )
                    for a in ALGORITHMS
                )
                print(f"  {model} {gbit} Gbit/s {fabric} (N=16,128,1024): {cells}")
    if args.plot:
        plot(result, args.plot)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({x["model"] for x in result["projections"]})
    fig, axes = plt.subplots(
        len(models),
        len(PROJECT_GBIT),
        figsize=(4 * len(PROJECT_GBIT), 3.2 * len(models)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    styles = {"tcp": "-", "rdma": ":"}
    colors = dict(zip(ALGORITHMS, ["C0", "C1", "C2", "C3"]))
    for i, model in enumerate(models):
        for j, gbit in enumerate(PROJECT_GBIT):
            ax = axes[i][j]
            for fabric in ("tcp", "rdma"):
                for a in ALGORITHMS:
                    rows = [
                        x
                        for x in result["projections"]
                        if x["model"] == model
                        and x["gbit"] == gbit
                        and x["fabric"] == fabric
                        and x["algorithm"] == a
                    ]
                    ax.plot(
                        [x["nodes"] for x in rows],
                        [x["efficiency"] for x in rows],
                        styles[fabric],
                        color=colors[a],
                        label=f"{a} ({fabric})" if i == 0 and j == 0 else None,
                    )
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{model}, {gbit} Gbit/s", fontsize=10)
            if i == len(models) - 1:
                ax.set_xlabel("nodes")
            if j == 0:
                ax.set_ylabel("efficiency (compute / step)")
    fig.legend(loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
