"""The pipelined 16-bit reduction in whole train steps on the emulated
cluster: `WIRE_PIPELINE_SEGMENT=0` (off, the default) against segments.

    python examples/benchmarks/cluster_pipeline.py --nodes 4 \\
        --jobs 4:10gbit,2:1gbit,2:10gbit,4:1gbit --segments 262144 --rounds 3 \\
        --out docs/benchmarks/cluster_pipeline.json

Root, under the cluster lock (`flock /work/wt/cluster.lock` on the shared
development machine); every node with its own /tmp (`private_tmp`). Per
job (a number of nodes, one rank each, and a link rate), one
`cluster_worker.py` job on the dense model (~25M parameters, 25 MB buckets)
measures, interleaved round by round inside the job (A B C, C B A,
...): `comm_f16` (the in-step 16-bit reduction alone) and `f16` (the whole
step in `fit`), unpipelined and with each segment size (`comm_f16@S`,
`f16@S`). Prints every round, the medians and the per-round ratios
pipelined / unpipelined.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument(
        "--jobs",
        default="4:1gbit,4:10gbit",
        help="nodes:rate of each job, in order (nodes <= --nodes)",
    )
    p.add_argument("--segments", default="32000,262144")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="dense")
    p.add_argument("--out")
    args = p.parse_args()
    sys.path.insert(0, str(HERE.parent.parent / "tests"))
    sys.path.insert(0, str(HERE))
    from cluster import Cluster
    from cluster_bench import RING, run_job

    segments = [int(s) for s in args.segments.split(",")]
    configs = ["comm_f16", *[f"comm_f16@{s}" for s in segments]]
    configs += ["f16", *[f"f16@{s}" for s in segments]]
    argv = [HERE / "cluster_worker.py", "--model", args.model]
    argv += ["--configs", ",".join(configs), "--rounds", str(args.rounds)]
    results = {"nodes": args.nodes, "model": args.model, "jobs": []}
    jobs = [(int(j.split(":")[0]), j.split(":")[1]) for j in args.jobs.split(",")]
    with Cluster(nodes=args.nodes, rate=jobs[0][1], private_tmp=True) as c:
        for nodes, rate in jobs:
            c.set_rate(rate)
            print(f"== {nodes} nodes, {rate}", flush=True)
            start = time.strftime("%Y-%m-%d %H:%M:%S")
            out = c.shared_dir("pipeline") / "job.json"
            job = run_job(c, nodes, argv, extra=RING, timeout=1800, out=out)
            raw = job["seconds_per_step"]
            ratio = {}
            for base in ("comm_f16", "f16"):
                for s in segments:
                    key = f"{base}@{s}"
                    ratio[f"{key} / {base}"] = statistics.median(
                        a / b for a, b in zip(raw[key], raw[base])
                    )
            load = os.getloadavg()
            print(
                "medians (ms):",
                {k: round(1e3 * v, 1) for k, v in job["median"].items()},
            )
            print("pipelined / unpipelined (median of per-round ratios):", ratio)
            print("load average after the job:", load, flush=True)
            results["jobs"].append(
                {
                    "nodes": nodes,
                    "rate": rate,
                    "start": start,
                    "ms": {k: [1e3 * t for t in v] for k, v in raw.items()},
                    "median_ms": {k: 1e3 * v for k, v in job["median"].items()},
                    "ratio": ratio,
                    "loadavg_after": load,
                }
            )
            if args.out:  # after every job: a later failure keeps the earlier
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
