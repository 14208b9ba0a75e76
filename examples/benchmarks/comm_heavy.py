"""Communication-heavy regime: a ~31M-parameter LSTM where the allreduce is a
large share of the step. Does the np=2 step approach max(compute, comm)?

    python examples/benchmarks/comm_heavy.py --rounds 3 --out docs/benchmarks/comm_heavy.json

Interleaved per round:
  compute      one process pinned to one core, bare Keras optimizer (no comm)
  compute_x2   np=2, each rank training its own model with the bare optimizer
               (no gradient communication): the compute time when both cores
               compute at once and share the memory bandwidth, as they do in
               the np=2 runs below
  comm         np=2: the in-step reduction path (tf.function over the fused
               gradients, one bucket) on the same number of bytes
  np2_25mb     np=2 training, 25 MB buckets (reductions can start while the
               backward pass still runs)
  np2_1bucket  np=2 training, one bucket (reduction only after all gradients)
  np2_25mb_inter2  np2_25mb with 2 inter-op threads per rank
               (KERAS_MPFP16_THREADS=1,2), so a second thread can run the
               reduction while the first keeps computing
Each np=2 run binds one core per rank.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from interleave import run_rounds  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402

MODEL = [
    "--units",
    "1536",
    "--layers",
    "2",
    "--timesteps",
    "8",
    "--features",
    "512",
    "--batch",
    "8",
]


def run(cmd, out_path, env=None):
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=mpi_env(env or {}), timeout=1200
    )
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{res.stderr[-3000:]}")
    return json.loads(Path(out_path).read_text())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out")
    args = p.parse_args()
    py, mpirun = sys.executable, mpirun_path()
    tmp = Path("/tmp/kmp_comm_heavy.json")
    train = [
        py,
        "-m",
        "keras_mpfp16.benchmark",
        "train",
        *MODEL,
        "--steps",
        str(args.steps),
        "--rounds",
        "2",
        "--out",
        str(tmp),
    ]
    np2 = [mpirun, "-np", "2", "--bind-to", "core", "--map-by", "core"]
    # name -> (command, extra environment) of each training measurement
    training = {
        "compute": (["taskset", "-c", "0", *train, "--plain"], None),
        "compute_x2": ([*np2, *train, "--plain"], None),
        "np2_25mb": ([*np2, *train, "--bucket-mb", "25"], None),
        "np2_1bucket": ([*np2, *train, "--bucket-mb", "4096"], None),
        "np2_25mb_inter2": (
            [*np2, *train, "--bucket-mb", "25"],
            {"KERAS_MPFP16_THREADS": "1,2"},
        ),
    }
    params = None

    def measure(name):
        nonlocal params
        if name == "comm":  # the in-step reduction of this model's gradients
            allreduce = [py, "-m", "keras_mpfp16.benchmark", "allreduce"]
            allreduce += ["--sizes", str(params * 4), "--rounds", "2"]
            records = run([*np2, *allreduce, "--out", str(tmp)], tmp)["records"]
            return next(
                x["seconds"] for x in records if x["variant"] == "ours_graph_float32"
            )
        cmd, env = training[name]
        res = run(cmd, tmp, env=env)
        params = res["params"]
        return min(res["seconds_per_step_all"])

    # "compute" goes first: "comm" needs the parameter count it reports.
    names = ["compute", "compute_x2", "comm", *list(training)[2:]]
    raw = run_rounds(names, measure, args.rounds, fmt=lambda s: f"{s * 1e3:.0f}ms")
    med = {k: statistics.median(v) for k, v in raw.items()}
    summary = {
        "params": params,
        "gradient_MB": params * 4 / 2**20,
        "median_seconds": med,
        "sum_compute_comm": med["compute"] + med["comm"],
        "max_compute_comm": max(med["compute"], med["comm"]),
        "sum_compute_x2_comm": med["compute_x2"] + med["comm"],
        "max_compute_x2_comm": max(med["compute_x2"], med["comm"]),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {"when": time.strftime("%Y-%m-%d %H:%M"), "raw": raw, **summary},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
