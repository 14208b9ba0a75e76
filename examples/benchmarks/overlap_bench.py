"""Step time with and without the communication thread (KERAS_MPFP16_OVERLAP),
interleaved, on one box.

    python examples/benchmarks/overlap_bench.py --rounds 3 --bucket-mb 0.1 \\
        --out docs/benchmarks/overlap_bench.json

Each round runs `mpirun -np 2 --bind-to core --map-by core python -m
keras_mpfp16.benchmark train` (the benchmark model, 30 timed steps) once per
configuration, in alternating order: OVERLAP off/on, with one inter-op
thread per rank (the library's default for a one-core rank) and with two.
Records each job's samples/s (the job's median over its rounds).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CONFIGS = [
    ("sync, inter1", {"KERAS_MPFP16_OVERLAP": "0", "KERAS_MPFP16_THREADS": "1,1"}),
    ("overlap, inter1", {"KERAS_MPFP16_OVERLAP": "1", "KERAS_MPFP16_THREADS": "1,1"}),
    ("sync, inter2", {"KERAS_MPFP16_OVERLAP": "0", "KERAS_MPFP16_THREADS": "1,2"}),
    ("overlap, inter2", {"KERAS_MPFP16_OVERLAP": "1", "KERAS_MPFP16_THREADS": "1,2"}),
]


def run(env_extra, args):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [
            "mpirun", "-np", "2", "--bind-to", "core", "--map-by", "core",
            sys.executable, "-m", "keras_mpfp16.benchmark", "train",
            "--rounds", "1", "--steps", str(args.steps),
            "--bucket-mb", str(args.bucket_mb), "--wire-dtype", args.wire_dtype,
            "--out", out,
        ]  # fmt: skip
        env = dict(os.environ, **env_extra)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900)
        with open(out) as f:
            return json.load(f)["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--bucket-mb", type=float, default=0.1)
    p.add_argument("--wire-dtype", default="float32")
    p.add_argument(
        "--configs", default="all", help="'inter1' / 'inter2': that pair only"
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()
    configs = {"inter1": CONFIGS[:2], "inter2": CONFIGS[2:]}.get(args.configs, CONFIGS)
    results = {name: [] for name, _ in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        for name, env in order:
            sps = run(env, args)
            results[name].append(sps)
            print(f"round {r + 1} {name}: {sps:.1f} samples/s", flush=True)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "args": vars(args),
        "samples_per_s": results,
        "load": os.getloadavg(),
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
