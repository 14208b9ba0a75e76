"""np=2 training throughput, the package at an earlier commit vs now.

    python examples/benchmarks/before_after.py --before c9d30b9^ --rounds 5 \\
        --out docs/benchmarks/before_after.json

What whole-script support (one model's state on every rank, global logs,
split evaluation, the seam, the reduction path's changes) costs the
steady-state train step. "before" runs the package as it was at the
`--before` commit (exported with `git archive` and put first on
PYTHONPATH), "after" the working tree, both with this machine's Keras and
TensorFlow. Each is `mpirun -np 2 --bind-to core python -m
keras_mpfp16.benchmark train --policy P` (the benchmark model, Adam, 64 per
rank, loss only), one job per measurement, alternating which goes first
(A B, B A, ...). Printed and saved: samples/s per round, the median of
per-round ratios after/before per policy, and other processes' share of the
CPU per run.
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

from interleave import OthersCPU, export_commit  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="c9d30b9^", help="commit to compare against")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--policies", default="float32,mixed_bfloat16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out")
    args = p.parse_args(argv)
    policies = args.policies.split(",")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="kmp_before_"))
    export_commit(args.before, tmp)

    def measure(impl: str, policy: str) -> tuple[float, float]:
        out = tmp / "result.json"
        out.unlink(missing_ok=True)
        env = mpi_env()
        env.pop("PYTHONPATH", None)
        if impl == "before":
            env["PYTHONPATH"] = str(tmp)
        cmd = [
            mpirun_path(),
            "-np",
            "2",
            "--bind-to",
            "core",
            sys.executable,
            "-m",
            "keras_mpfp16.benchmark",
            "train",
            "--policy",
            policy,
            "--steps",
            str(args.steps),
            "--rounds",
            "1",
            "--out",
            str(out),
        ]
        with OthersCPU() as others:
            res = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=env,
                # `-m` puts the working directory first on sys.path.
                cwd=tmp if impl == "before" else ROOT,
                timeout=900,
            )
        if res.returncode != 0:
            raise RuntimeError(f"{impl} {policy} failed:\n{res.stderr[-3000:]}")
        return json.loads(out.read_text())["samples_per_s"], others.share

    raw = {pol: {"before": [], "after": []} for pol in policies}
    shares = {pol: {"before": [], "after": []} for pol in policies}
    for i in range(args.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for pol in policies:
            for impl in order:
                sps, share = measure(impl, pol)
                raw[pol][impl].append(sps)
                shares[pol][impl].append(share)
            print(
                f"round {i + 1} {pol}: before={raw[pol]['before'][-1]:.0f} "
                f"after={raw[pol]['after'][-1]:.0f} samples/s (others' CPU share, "
                f"max: {100 * max(shares[pol]['before'][-1], shares[pol]['after'][-1]):.0f}%)",
                flush=True,
            )
    ratios = {
        pol: statistics.median(
            a / b for a, b in zip(raw[pol]["after"], raw[pol]["before"])
        )
        for pol in policies
    }
    for pol, r in ratios.items():
        print(f"{pol}: after / before = {r:.3f}")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%d %H:%M"),
                    "cores": os.cpu_count(),
                    "command": "python " + " ".join(sys.argv),
                    "args": {"rounds": args.rounds, "steps": args.steps},
                    "before_commit": commit,
                    "after_commit": head,
                    "policies": policies,
                    "samples_per_s": raw,
                    "others_cpu_share": shares,
                    "after_over_before": ratios,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
