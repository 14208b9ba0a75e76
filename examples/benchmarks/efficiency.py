"""Where np=2 scaling efficiency goes on this machine: the hardware's share and ours.

    python examples/benchmarks/efficiency.py --horovod-venv .venv-horovod \\
        --rounds 3 --out docs/benchmarks/efficiency.json

Scaling efficiency is np=2 samples/s over twice one pinned process. Two
ranks on a 2-core machine lose some of it to the hardware alone (shared
caches, memory bandwidth, clock boost with both cores busy) and the rest to
the data-parallel machinery. This separates the two. Per round, interleaved,
on the benchmark model (peer_worker.py: 2 x LSTM(128), T=128, F=16, Adam,
batch 64 per process, float32), every process with one intra- and one
inter-op thread:

  solo        plain Keras 3, one process on core 0 (`taskset -c 0`)
  pair        two independent plain Keras 3 processes at once, on cores 0 and 1:
              no communication at all, the hardware's own 2-process figure
  ours_np1    keras_mpfp16 under `mpirun -np 1 --bind-to core`
  ours_np2    keras_mpfp16 under `mpirun -np 2 --bind-to core --map-by core`
  hvd_np1, hvd_np2   the same for Horovod 0.28.1 (--horovod-venv)
  hvd_np2_unbound    Horovod at np=2 with `--bind-to none`: its background
              thread may run on the other core (tests whether it competes
              with the rank's compute thread for its one core)

Printed and saved: samples/s per round and the medians of per-round ratios:
the hardware bound pair / (2 solo), ours_np2 / pair (what the machinery
costs beyond it), the efficiencies ours_np2 / (2 ours_np1) and Horovod's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
sys.path.insert(0, str(HERE))

from interleave import run_rounds  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402
from peers import ONE_CORE_THREADS, _last_json, _run  # noqa: E402

WORKER = str(HERE / "peer_worker.py")
CONFIGS = [
    "solo",
    "pair",
    "ours_np1",
    "ours_np2",
    "hvd_np1",
    "hvd_np2",
    "hvd_np2_unbound",
]


def _plain(core: int, steps: int) -> list[str]:
    return ["taskset", "-c", str(core), sys.executable, WORKER, "--impl", "keras",
            "--steps", str(steps)]  # fmt: skip


def _pair(steps: int) -> float:
    env = {**os.environ, **ONE_CORE_THREADS}
    procs = [
        subprocess.Popen(_plain(c, steps), stdout=subprocess.PIPE, text=True, env=env)
        for c in (0, 1)
    ]
    total = 0.0
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"pair process failed ({p.returncode})")
        total += _last_json(out)["samples_per_s"]
    return total


def _mpi(python, mpirun, impl, ranks, steps, bind="core") -> float:
    cmd = [mpirun, "-np", str(ranks), "--bind-to", bind]
    if bind == "core":
        cmd += ["--map-by", "core"]
    for k in ONE_CORE_THREADS:
        cmd += ["-x", k]
    cmd += [python, WORKER, "--impl", impl, "--steps", str(steps)]
    return _run(cmd, env=mpi_env(ONE_CORE_THREADS))["samples_per_s"]


def measure(name: str, args) -> float:
    hvd = Path(args.horovod_venv).resolve() / "bin"
    if name == "solo":
        env = {**os.environ, **ONE_CORE_THREADS}
        out = subprocess.run(
            _plain(0, args.steps), capture_output=True, text=True, env=env, timeout=900
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
        return _last_json(out.stdout)["samples_per_s"]
    if name == "pair":
        return _pair(args.steps)
    if name.startswith("ours"):
        return _mpi(sys.executable, mpirun_path(), "ours", int(name[-1]), args.steps)
    bind = "none" if name.endswith("unbound") else "core"
    ranks = 1 if "np1" in name else 2
    return _mpi(str(hvd / "python"), str(hvd / "mpirun"), "horovod", ranks,
                args.steps, bind)  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--horovod-venv", default=".venv-horovod")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--max-others", type=float, default=None)
    p.add_argument("--out")
    args = p.parse_args()
    configs = args.configs.split(",")
    contention = {}
    raw = run_rounds(
        configs,
        lambda c: measure(c, args),
        args.rounds,
        max_others=args.max_others,
        retries=1,
        contention=contention,
    )

    def ratio(a, b, k=1.0):
        if a not in raw or b not in raw:
            return None
        return statistics.median(x / (k * y) for x, y in zip(raw[a], raw[b]))

    medians = {
        "hardware_bound_pair_over_2solo": ratio("pair", "solo", 2),
        "ours_np2_over_pair": ratio("ours_np2", "pair"),
        "ours_np2_over_2solo": ratio("ours_np2", "solo", 2),
        "ours_efficiency_np2_over_2np1": ratio("ours_np2", "ours_np1", 2),
        "ours_np1_over_solo": ratio("ours_np1", "solo"),
        "hvd_efficiency_np2_over_2np1": ratio("hvd_np2", "hvd_np1", 2),
        "hvd_unbound_efficiency": ratio("hvd_np2_unbound", "hvd_np1", 2),
    }
    medians = {k: v for k, v in medians.items() if v is not None}
    print("== " + "  ".join(f"{k}={v:.3f}" for k, v in medians.items()), flush=True)
    if args.out:
        report = {
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "command": "python examples/benchmarks/efficiency.py "
            + " ".join(sys.argv[1:]),
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
            "steps": args.steps,
            "samples_per_s": raw,
            "median_ratios": medians,
            "others_cpu_share": {c: contention.get(c) for c in configs},
            "repeated_rounds": contention.get("repeated_rounds"),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
