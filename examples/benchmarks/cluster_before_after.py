"""The 16-bit wire on the emulated cluster, the package at an earlier commit vs now.

    python examples/benchmarks/cluster_before_after.py --before 5958215 \\
        --rate 1gbit --rounds 3 --out docs/benchmarks/cluster_before_after.json

Two emulated nodes (`--nodes`; root; `flock /tmp/netns-cluster.lock` around it on a
shared machine), the link shaped to --rate. "before" runs the earlier
commit's own cluster_worker.py with its package (exported with `git
archive`, first on PYTHONPATH), "after" the working tree's; each job
measures the dense model's f32 and f16 configurations (interleaved inside
the job). Jobs alternate before/after (A B, B A, ...), --rounds each; the
ratios are medians of per-round ratios after/before of seconds per step.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))

from cluster import Cluster  # noqa: E402
from cluster_bench import RING, run_job  # noqa: E402

CONFIGS = "f32,f16"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="5958215")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # The package and its own benchmark scripts, as they were.
        archive = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "archive",
                args.before,
                "keras_mpfp16",
                "examples",
            ],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp), "after": ROOT}
        cluster = Cluster(args.nodes, args.rate)
        cluster.up()
        seconds = {k: {c: [] for c in CONFIGS.split(",")} for k in trees}
        saved = os.environ.get("PYTHONPATH", "")
        try:
            for r in range(args.rounds):
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                for which in order:
                    tree = trees[which]
                    os.environ["PYTHONPATH"] = str(tree)
                    worker = tree / "examples" / "benchmarks" / "cluster_worker.py"
                    label = f"{which} round {r + 1}"
                    print(f"== {label}", flush=True)
                    job = run_job(
                        cluster,
                        args.nodes,
                        [
                            worker,
                            "--model",
                            "dense",
                            "--configs",
                            CONFIGS,
                            "--rounds",
                            "1",
                            "--steps",
                            str(args.steps),
                            "--label",
                            label,
                        ],
                        extra=RING,
                    )
                    for c, v in job["seconds_per_step"].items():
                        seconds[which][c] += v
        finally:
            os.environ["PYTHONPATH"] = saved
            cluster.down()
    ratios = {
        c: statistics.median(
            a / b for a, b in zip(seconds["after"][c], seconds["before"][c])
        )
        for c in CONFIGS.split(",")
    }
    f16_over_f32 = {
        k: statistics.median(
            a / b for a, b in zip(seconds[k]["f16"], seconds[k]["f32"])
        )
        for k in trees
    }
    result = {
        "command": "python examples/benchmarks/cluster_before_after.py "
        + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "before": args.before,
        "rate": args.rate,
        "nodes": args.nodes,
        "seconds_per_step": seconds,
        "after_over_before": ratios,
        "f16_over_f32": f16_over_f32,
    }
    print(json.dumps({"after_over_before": ratios, "f16_over_f32": f16_over_f32}))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
