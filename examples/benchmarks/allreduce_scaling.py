"""Allreduce time vs message size for np = 2, 4, 8 (oversubscribed on a small
machine: fine for a communication-only measurement), and which algorithm
Open MPI's `tuned` component picked.

    python examples/benchmarks/allreduce_scaling.py --out docs/benchmarks/allreduce_scaling.json

For each np it runs `python -m keras_mpfp16.benchmark allreduce --no-graph`
with the default decision, then raw mpi4py Allreduce with each algorithm
forced (coll_tuned_use_dynamic_rules=1, coll_tuned_allreduce_algorithm=k):
the forced algorithm whose time matches the default best is reported as the
one MPI used.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from mpi_launch import mpi_env, mpirun_path  # noqa: E402

ALGORITHMS = {
    1: "basic linear",
    2: "nonoverlapping (reduce+bcast)",
    3: "recursive doubling",
    4: "ring",
    5: "segmented ring",
    6: "rabenseifner",
}


def bench(np_, sizes, env_extra=None):
    out = Path(f"/tmp/kmp_scaling_{np_}.json")
    cmd = [
        mpirun_path(),
        "-np",
        str(np_),
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        "-m",
        "keras_mpfp16.benchmark",
        "allreduce",
        "--no-graph",
        "--rounds",
        "3",
        "--sizes",
        ",".join(map(str, sizes)),
        "--out",
        str(out),
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=mpi_env(env_extra), timeout=1800
    )
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(out.read_text())["records"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nps", default="2,4,8")
    p.add_argument(
        "--sizes", default=",".join(str(4**k) for k in range(5, 14))
    )  # 1 KiB .. 64 MiB
    p.add_argument("--out")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "runs": {}}
    for np_ in [int(n) for n in args.nps.split(",")]:
        default = bench(np_, sizes)
        forced = {}
        for k in ALGORITHMS:
            recs = bench(
                np_,
                sizes,
                {
                    "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                    "OMPI_MCA_coll_tuned_allreduce_algorithm": str(k),
                },
            )
            forced[k] = {
                r["bytes"]: r["seconds"] for r in recs if r["variant"] == "raw_mpi4py"
            }
        rows = []
        for size in sizes:
            by = {r["variant"]: r["seconds"] for r in default if r["bytes"] == size}
            raw = by["raw_mpi4py"]
            guess = min(ALGORITHMS, key=lambda k: abs(forced[k][size] - raw) / raw)
            rows.append(
                {
                    "bytes": size,
                    **by,
                    "closest_forced_algorithm": ALGORITHMS[guess],
                    "forced": {ALGORITHMS[k]: forced[k][size] for k in ALGORITHMS},
                }
            )
            print(
                f"np={np_} {size:>10} B  raw {raw * 1e6:9.1f} us  ours_f32 {by['ours_float32'] * 1e6:9.1f} us"
                f"  ours_f16 {by['ours_float16'] * 1e6:9.1f} us  ~ {ALGORITHMS[guess]}",
                flush=True,
            )
        report["runs"][np_] = rows
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
