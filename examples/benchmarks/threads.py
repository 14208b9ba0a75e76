"""Which per-rank thread settings to default to: np=2 on one node, interleaved.

    python examples/benchmarks/threads.py --rounds 5 --out docs/benchmarks/threads.json

Each round runs the benchmark LSTM (peer_worker.py --impl ours) at np=2 with
  off       KERAS_MPFP16_THREADS=off: TensorFlow's own defaults, unbound
  1,1 1,2 2,2   KERAS_MPFP16_THREADS=INTRA,INTER, unbound (--bind-to none)
  bound     the library defaults with one core per rank (--bind-to core)
  bound_1,2 one core per rank, one intra- and two inter-op threads (the default before 0.1.0)
  bound_yield   the library defaults, one core per rank, with OMPI_MCA_mpi_yield_when_idle=1 (MPI yields the
            core while it waits instead of spinning)
and prints the median over rounds of each setting's throughput relative to
`off`, with all raw figures.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from interleave import median_ratios, run_rounds  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402

SETTINGS = {
    "off": ({"KERAS_MPFP16_THREADS": "off"}, "none"),
    "1,1": ({"KERAS_MPFP16_THREADS": "1,1"}, "none"),
    "1,2": ({"KERAS_MPFP16_THREADS": "1,2"}, "none"),
    "2,2": ({"KERAS_MPFP16_THREADS": "2,2"}, "none"),
    "bound": ({}, "core"),
    "bound_1,2": ({"KERAS_MPFP16_THREADS": "1,2"}, "core"),
    "bound_yield": ({"OMPI_MCA_mpi_yield_when_idle": "1"}, "core"),
}


def run(setting, policy, steps):
    extra, bind = SETTINGS[setting]
    env = mpi_env(extra)
    cmd = [
        mpirun_path(),
        "-np",
        "2",
        "--bind-to",
        bind,
        sys.executable,
        str(HERE / "peer_worker.py"),
        "--impl",
        "ours",
        "--policy",
        policy,
        "--steps",
        str(steps),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])[
        "samples_per_s"
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--policy", default="float32")
    p.add_argument("--out")
    args = p.parse_args()
    raw = run_rounds(
        list(SETTINGS), lambda s: run(s, args.policy, args.steps), args.rounds
    )
    rel = median_ratios(raw, "off")
    print(
        "median throughput relative to TF defaults: "
        + "  ".join(f"{s}={v:.3f}" for s, v in rel.items())
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%d %H:%M"),
                    "policy": args.policy,
                    "samples_per_s": raw,
                    "relative_to_off": rel,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
