"""The 16-bit wire's two schedules in whole train steps on the emulated
cluster: `WIRE_SCHEDULE=alltoall` (the default) against `=ring`.

    python examples/benchmarks/cluster_schedule.py --nodes 4 --rate 1gbit \\
        --pairs 2 --out docs/benchmarks/cluster_schedule.json

Root, under `flock /tmp/netns-cluster.lock`. Jobs alternate alltoall, ring,
alltoall, ring, ... (`--pairs` of them); each job is `cluster_worker.py`
on the dense model (~25M parameters, 25 MB buckets) timing `comm_f16` (the
in-step 16-bit reduction alone) and `f16` (the whole step in `fit`),
`--rounds` rounds. Prints every round and the medians.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    sys.path.insert(0, str(HERE.parent.parent / "tests"))
    sys.path.insert(0, str(HERE))
    from cluster import Cluster
    from cluster_bench import RING, run_job

    ms = {s: {"comm_f16": [], "f16": []} for s in ("alltoall", "ring")}
    argv = [HERE / "cluster_worker.py", "--model", "dense"]
    argv += ["--configs", "comm_f16,f16", "--rounds", str(args.rounds)]
    with Cluster(nodes=args.nodes, rate=args.rate) as c:
        for _ in range(args.pairs):
            for schedule in ("alltoall", "ring"):
                print(f"== {schedule}", flush=True)
                env = {"KERAS_MPFP16_WIRE_SCHEDULE": schedule}
                job = run_job(c, args.nodes, argv, env=env, extra=RING, timeout=1200)
                for key, seconds in job["seconds_per_step"].items():
                    ms[schedule][key] += [1000 * t for t in seconds]
    medians = {
        s: {k: statistics.median(v) for k, v in d.items()} for s, d in ms.items()
    }
    ratio = {
        k: medians["ring"][k] / medians["alltoall"][k] for k in ("comm_f16", "f16")
    }
    print("medians (ms):", medians, "ring / alltoall:", ratio)
    if args.out:
        result = {"nodes": args.nodes, "rate": args.rate, "ms": ms}
        result.update(medians=medians, ring_over_alltoall=ratio)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
