"""In-step gradient reduction time per wire dtype, before and after a change.

    python examples/benchmarks/wire_ingraph.py --before c9d30b9 --rounds 5 \\
        --out docs/benchmarks/wire_ingraph.json

What is timed: the reduction exactly as the train step runs it -- a
`tf.function` over 8 float32 gradient tensors calling the bridge's
`allreduce_gradients` (default 25 MB buckets, sum), so fusing, the 16-bit
encode/decode, the MPI calls and splitting back are all inside -- on 2 ranks
(`mpirun -np 2 --bind-to core --map-by core`: one core each, shared memory),
for 1, 16, 64 and 120 MB of gradients and the float32, float16 and bfloat16
wires.

"before" runs the package as it was at the `--before` commit (exported with
`git archive` and put first on PYTHONPATH), "after" the working tree. Each
round runs before then after (one mpirun job each; inside a job every size
and wire is measured, a block of calls per wire, size by size), so the
comparisons are medians of per-round ratios:

  lowp_over_f32[impl][size][wire]  16-bit time / float32 time (< 1: the 16-bit
                                   wire is faster), within one job
  after_over_before[size][wire]    after time / before time, same round
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

from interleave import export_commit  # noqa: E402

WIRES = ("float32", "float16", "bfloat16")


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import keras_mpfp16
    from keras_mpfp16 import runtime
    from keras_mpfp16.backend import tensorflow as bridge

    runtime.init()
    rank = runtime.rank()
    results = {}
    for mb in args.sizes_mb:
        elems = int(mb * 2**20) // 4
        rng = np.random.default_rng(rank)
        parts = np.array_split(rng.normal(size=elems).astype(np.float32), 8)
        tensors = [tf.constant(p) for p in parts]
        shapes = [p.shape for p in parts]
        fns = {}
        for wire in args.wires:

            @tf.function
            def reduce(ts, wire=wire, shapes=shapes):
                out, finite = bridge.allreduce_gradients(
                    list(ts),
                    shapes=shapes,
                    op="sum",
                    wire_dtype=wire,
                    bucket_bytes=int(args.bucket_mb * 2**20),
                    step=tf.constant(0, tf.int64),
                )
                return out, finite

            reduce(tensors)  # trace + warm
            fns[wire] = reduce
        times = {w: [] for w in args.wires}
        # One block of calls per wire (a warm-up call first): interleaving
        # call by call let one wire's allocations and caches slow the next.
        for wire in args.wires:
            for i in range(args.calls + 1):
                runtime.barrier()
                t0 = time.perf_counter()
                out, finite = fns[wire](tensors)
                _ = out[0].numpy()  # wait for the whole step's outputs
                if i:
                    times[wire].append(time.perf_counter() - t0)
        for wire in args.wires:
            local = statistics.median(times[wire])
            # A collective ends for everyone together: the slowest rank's view.
            results[f"{mb:g}MB/{wire}"] = float(
                runtime.allreduce(np.float64(local), op="max")
            )
    if rank == 0:
        Path(args.out).write_text(
            json.dumps({"package": keras_mpfp16.__file__, "seconds": results})
        )


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--before", default="c9d30b9", help="commit to compare against")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64, 120])
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--wires", nargs="+", default=list(WIRES), choices=WIRES)
    p.add_argument(
        "--max-others",
        type=float,
        default=0.15,
        help="re-measure a round in which other processes used more CPU than this",
    )
    p.add_argument("--out")
    args = p.parse_args()
    if args.worker:
        return worker(args)

    from interleave import run_rounds
    from mpi_launch import mpi_env, mpirun_path

    tmp = Path(tempfile.mkdtemp(prefix="kmp_wire_"))
    before_tree = tmp / "before"
    before_tree.mkdir()
    export_commit(args.before, before_tree)
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "keras_mpfp16"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    cmd = [
        mpirun_path(),
        "-np",
        "2",
        "--bind-to",
        "core",
        "--map-by",
        "core",
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--calls",
        str(args.calls),
        "--bucket-mb",
        str(args.bucket_mb),
        "--sizes-mb",
        *[f"{s:g}" for s in args.sizes_mb],
        "--wires",
        *args.wires,
    ]
    measured = []  # every job's record; run_rounds keeps an index per round

    def measure(impl):
        out = tmp / f"{impl}.json"
        env = {"PYTHONPATH": str(before_tree)} if impl == "before" else {}
        run_env = mpi_env(env)
        if impl == "after":
            run_env.pop("PYTHONPATH", None)
        res = subprocess.run(
            [*cmd, "--out", str(out)],
            capture_output=True,
            text=True,
            env=run_env,
            timeout=1800,
        )
        if res.returncode != 0:
            raise RuntimeError(f"{impl} failed:\n{res.stderr[-4000:]}")
        rec = json.loads(out.read_text())
        measured.append(rec)
        print(f"  {impl}: {rec['package']}", flush=True)
        for key, s in rec["seconds"].items():
            print(f"    {key:>16s} {s * 1e3:9.1f} ms", flush=True)
        # An index, so a round measured again (other processes busy) keeps
        # exactly the records of its kept attempt.
        return float(len(measured) - 1)

    contention = {}
    kept = run_rounds(
        ["before", "after"],
        measure,
        args.rounds,
        fmt=lambda i: f"{sum(measured[int(i)]['seconds'].values()):.2f}s(all sizes)",
        max_others=args.max_others,
        contention=contention,
    )
    detail = {impl: [measured[int(i)] for i in kept[impl]] for impl in kept}
    sizes = [f"{s:g}MB" for s in args.sizes_mb]

    def per_round(impl, size, wire):
        return [r["seconds"][f"{size}/{wire}"] for r in detail[impl]]

    wires = list(args.wires)
    lowp = [w for w in wires if w != "float32"] if "float32" in wires else []
    lowp_over_f32 = {
        impl: {
            size: {
                wire: statistics.median(
                    a / b
                    for a, b in zip(
                        per_round(impl, size, wire), per_round(impl, size, "float32")
                    )
                )
                for wire in lowp
            }
            for size in sizes
        }
        for impl in detail
    }
    after_over_before = {
        size: {
            wire: statistics.median(
                a / b
                for a, b in zip(
                    per_round("after", size, wire), per_round("before", size, wire)
                )
            )
            for wire in wires
        }
        for size in sizes
    }
    median_ms = {
        impl: {
            size: {
                wire: statistics.median(per_round(impl, size, wire)) * 1e3
                for wire in wires
            }
            for size in sizes
        }
        for impl in detail
    }
    print("\n16-bit time / float32 time (median of per-round ratios):")
    for size in sizes:
        cells = "  ".join(
            f"{impl} {wire}={lowp_over_f32[impl][size][wire]:.2f}"
            for impl in ("before", "after")
            for wire in lowp
        )
        print(f"  {size:>6s}  {cells}")
    print("after / before (same wire):")
    for size in sizes:
        cells = "  ".join(
            f"{wire}={after_over_before[size][wire]:.2f}" for wire in wires
        )
        print(f"  {size:>6s}  {cells}")
    result = {
        "command": "python examples/benchmarks/wire_ingraph.py "
        + " ".join(a for a in sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "before_commit": args.before,
        "after": f"working tree at {rev}" + (" (modified)" if dirty else ""),
        "ranks": 2,
        "binding": "--bind-to core --map-by core (one core per rank, shared memory)",
        "bucket_mb": args.bucket_mb,
        "calls_per_measurement": args.calls,
        "timed": "tf.function over 8 float32 tensors calling "
        "allreduce_gradients(op='sum'); median of calls, slowest rank",
        "others_cpu_share": contention,
        "lowp_over_f32": lowp_over_f32,
        "after_over_before": after_over_before,
        "median_ms": median_ms,
        "raw": detail,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
