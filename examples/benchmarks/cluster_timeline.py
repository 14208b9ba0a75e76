"""A timeline of the benchmark model on the emulated 2-node cluster (as root).

    python examples/benchmarks/cluster_timeline.py --rate 1gbit \\
        --trace docs/traces/timeline_cluster_1gbit.json \\
        --png docs/benchmarks/timeline_cluster_1gbit.png

Brings up two network-namespace "nodes" joined by links of `--rate`
(`examples/benchmarks/cluster.py`, one core each), runs
`python -m keras_mpfp16.benchmark train` on one rank per node with
`KERAS_MPFP16_TIMELINE` set (window `--window`, report printed), takes the
cluster down, and renders the window with plot_timeline.py. Every gradient
byte crosses the rate-limited link (for this model it still did not
dominate the step at 1 Gbit/s: docs/timeline.md).
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--window", default="10-17")
    p.add_argument("--show", default="12-14", help="steps shown in the PNG")
    p.add_argument("--trace", required=True)
    p.add_argument("--png", required=True)
    args = p.parse_args()
    from cluster import Cluster  # examples/benchmarks/cluster.py, beside this file

    trace = os.path.abspath(args.trace)
    env = dict(
        os.environ,
        KERAS_MPFP16_TIMELINE=trace,
        KERAS_MPFP16_TIMELINE_STEPS=args.window,
        KERAS_MPFP16_TIMELINE_REPORT="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        # The cluster needs root (namespaces, tc); so does mpirun then.
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    passed = [
        "KERAS_MPFP16_TIMELINE",
        "KERAS_MPFP16_TIMELINE_STEPS",
        "KERAS_MPFP16_TIMELINE_REPORT",
        "TF_CPP_MIN_LOG_LEVEL",
    ]
    if "PYTHONPATH" in env:
        passed.append("PYTHONPATH")
    extra = [w for name in passed for w in ("-x", name)]
    # Names of their own, so a cluster another job brought up is not touched.
    with Cluster(
        2, args.rate, prefix="kmptl", subnet="10.79.22", bridge="kmptlbr0"
    ) as cluster:
        cmd = cluster.mpirun_command(
            [sys.executable, "-m", "keras_mpfp16.benchmark", "train",
             "--rounds", "1", "--steps", str(args.steps)],
            extra=extra,
        )  # fmt: skip
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, check=True, timeout=1500)
    subprocess.run(
        [sys.executable, str(HERE / "plot_timeline.py"), trace, args.png,
         "--steps", args.show, "--title",
         f"benchmark model, 2 emulated nodes at {args.rate} (one core each)"],
        check=True,
    )  # fmt: skip


if __name__ == "__main__":
    main()
