"""What one collective costs beyond its bytes, layer by layer (issue 40, item 3).

    python examples/benchmarks/collective_cost.py --ranks 2,4,8 --rounds 3 \\
        --out docs/benchmarks/collective_cost.json

For a small bucket (`--elements`, 1,024 float32 by default: latency, not
bandwidth), each job (`mpirun -np N --oversubscribe` on this machine) times
one collective through each layer the train step stacks on it, interleaved
in one process (the order rotates every repetition):

  mpi            mpi4py `Allreduce` of two numpy arrays: the floor
  collectives    `collectives.allreduce_sum_into`, the library's call (its
                 observers: the stall inspector, the trace recorder's check)
  numpy_function the same Allreduce inside a `tf.function` through one
                 `tf.numpy_function` (the crossing, no library code)
  py_function    the same through one `tf.py_function` (what the 16-bit
                 wire crosses)
  float32_wire   the train step's float32 path for one bucket
                 (`allreduce_gradients`, `wire_dtype="float32"`)
  float16_wire   its 16-bit path (encode, py_function, Alltoall, the
                 owner's float32 sum, Allgather, decode)
  mpi_x2         two mpi4py collectives back to back (Alltoall + Allgather
                 of the 16-bit rows): the 16-bit wire's own floor
  graph_call     a `tf.function` that only hands its input back (the cost
                 of calling a compiled function from Python: once per train
                 step, not per collective)
  crossing_numpy one `tf.numpy_function` that only hands its input back
                 (the crossing alone: no MPI, no wait for another rank)
  crossing_py    the same through one `tf.py_function`
  float32_local  the float32 wire's train-step path with the library's
                 MPI call replaced by a copy into the output (the crossing,
                 the concat/split, the host copies and finite check:
                 everything but the MPI call, its observers and the wait)
  float16_local  the 16-bit path likewise (Alltoall and Allgather replaced
                 by the copies one rank would receive from itself)

So, per collective: crossing = crossing_numpy - graph_call; copies and
graph work = float32_local - crossing_numpy; the MPI call for a tiny
message = mpi; observers = collectives - mpi; what is left of float32_wire
(float32_wire - float32_local - mpi) is waiting for the other ranks to
reach the call (scheduling, skew), and the observers.

With `--hosts` (and `--mpirun-flags`), each job runs on those hosts, one
rank per host (netns-cluster's emulated nodes; docs/scaling.md, "What one
collective costs", has the commands).

With `--before C`, every job runs twice per round, interleaved (the order
alternates): the package at commit C (exported with `git archive`, first on
PYTHONPATH) and the working tree, for a before/after of a change.

Each layer runs `--calls` calls per repetition after a warm-up (the trace);
a repetition's time per call is the slowest rank's (every rank's mean, max
over ranks); `--reps` repetitions per job, the median kept. Printed: the raw
microseconds per call; saved with `--out` as JSON, with the load average
around each job. The machine is shared and 2-core: at N > 2 the ranks are
oversubscribed, so the numbers hold the scheduler's cost too (say so).
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
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))

LAYERS = (
    "mpi",
    "collectives",
    "numpy_function",
    "py_function",
    "float32_wire",
    "float16_wire",
    "mpi_x2",
    "graph_call",
    "crossing_numpy",
    "crossing_py",
    "float32_local",
    "float16_local",
)


def worker(args) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    import keras_mpfp16 as kmp
    from keras_mpfp16.backend.tf_gradients import allreduce_gradients
    from keras_mpfp16.runtime.mpi import collectives, wire

    comm = MPI.COMM_WORLD
    n, e = kmp.size(), args.elements
    send = np.random.default_rng(kmp.rank()).normal(size=e).astype(np.float32)
    recv = np.empty_like(send)
    chunk = wire.chunk_length(e, n)
    rows = np.zeros((n, wire.HEADER_WORDS + chunk), np.uint16)
    rows_recv = np.empty_like(rows)
    gathered = np.empty_like(rows)
    flat = tf.constant(send)

    def raw(buf):
        out = np.empty_like(buf)
        comm.Allreduce(buf, out, op=MPI.SUM)
        return out

    @tf.function(autograph=False)
    def through_numpy(t):
        return tf.numpy_function(raw, [t], tf.float32, stateful=True)

    def raw_eager(t):
        return tf.constant(raw(t.numpy()))

    @tf.function(autograph=False)
    def through_py(t):
        return tf.py_function(raw_eager, [t], tf.float32)

    def wire_fn(w):
        @tf.function(autograph=False)
        def call(t):
            reduced, _ = allreduce_gradients(
                [t], shapes=[(e,)], op="sum", wire_dtype=w, bucket_bytes=4 * e + 1
            )
            return reduced[0]

        return call

    f32, f16 = wire_fn("float32"), wire_fn("float16")
    f32_local, f16_local = wire_fn("float32"), wire_fn("float16")

    @tf.function(autograph=False)
    def graph_call(t):
        return tf.identity(t)

    @tf.function(autograph=False)
    def cross_numpy(t):
        return tf.numpy_function(lambda a: a, [t], tf.float32, stateful=True)

    @tf.function(autograph=False)
    def cross_py(t):
        return tf.py_function(lambda a: a, [t], tf.float32)

    def arr(b):  # a numpy array or the library's DLPack view of a tensor
        return b if isinstance(b, np.ndarray) else np.from_dlpack(b)

    def local_copy(send, recv, name):  # what MPI would do at N = 1
        np.copyto(arr(recv), arr(send))

    def local_alltoall(send, recv, name, block_bytes=None, ring_min_bytes=None):
        # this rank's own block, n times
        arr(recv)[...] = arr(send)[kmp.rank() : kmp.rank() + 1]

    def local_allgather(send, recv, name, block_bytes=None, ring_min_bytes=None):
        arr(recv)[...] = arr(send)

    real = (
        collectives.allreduce_sum_into,
        collectives.alltoall_into,
        collectives.allgather_into,
    )

    def without_mpi(fn):
        def call():
            (
                collectives.allreduce_sum_into,
                collectives.alltoall_into,
                collectives.allgather_into,
            ) = (local_copy, local_alltoall, local_allgather)
            try:
                return fn(flat).numpy()
            finally:
                (
                    collectives.allreduce_sum_into,
                    collectives.alltoall_into,
                    collectives.allgather_into,
                ) = real

        return call

    def x2():
        comm.Alltoall(rows, rows_recv)
        comm.Allgather(rows[:1], gathered)

    calls = {
        "mpi": lambda: comm.Allreduce(send, recv, op=MPI.SUM),
        "collectives": lambda: collectives.allreduce_sum_into(send, recv, "bench"),
        "numpy_function": lambda: through_numpy(flat).numpy(),
        "py_function": lambda: through_py(flat).numpy(),
        "float32_wire": lambda: f32(flat).numpy(),
        "float16_wire": lambda: f16(flat).numpy(),
        "mpi_x2": x2,
        "graph_call": lambda: graph_call(flat).numpy(),
        "crossing_numpy": lambda: cross_numpy(flat).numpy(),
        "crossing_py": lambda: cross_py(flat).numpy(),
        "float32_local": without_mpi(f32_local),
        "float16_local": without_mpi(f16_local),
    }
    layers = [layer for layer in args.layers.split(",")]
    for layer in layers:
        for _ in range(3):  # trace and warm
            calls[layer]()
    per = {layer: [] for layer in layers}
    for rep in range(args.reps):
        order = layers[rep % len(layers) :] + layers[: rep % len(layers)]
        for layer in order:
            call = calls[layer]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            mine = (time.perf_counter() - t0) / args.calls
            per[layer].append(comm.allreduce(mine, op=MPI.MAX) * 1e6)
    if kmp.rank() == 0:
        out = {
            layer: {"us_per_call": v, "median_us": statistics.median(v)}
            for layer, v in per.items()
        }
        print("RESULT " + json.dumps(out), flush=True)


def run_job(ranks: int, args, pythonpath: str = str(ROOT)) -> dict:
    from mpi_launch import mpi_env, mpirun_path

    env = mpi_env({"PYTHONPATH": pythonpath})
    if args.hosts:  # emulated nodes: their first `ranks` hosts, one rank each
        hosts = ",".join(args.hosts.split(",")[:ranks])
        place = ["--host", hosts, *args.mpirun_flags.split()]
        place += [w for k in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL") for w in ("-x", k)]
    else:
        place = ["--oversubscribe"]
    cmd = [
        mpirun_path(),
        "-np",
        str(ranks),
        *place,
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--elements",
        str(args.elements),
        "--calls",
        str(args.calls),
        "--reps",
        str(args.reps),
        "--layers",
        args.layers,
    ]
    load0 = os.getloadavg()[0]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    load1 = os.getloadavg()[0]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(
            f"np={ranks} failed ({res.returncode}):\n{res.stderr[-4000:]}"
        )
    return {"layers": json.loads(lines[-1][len("RESULT ") :]), "load": [load0, load1]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--elements", type=int, default=1024)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="jobs per N, interleaved")
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--before", help="also run the package at this commit")
    p.add_argument(
        "--hosts",
        help="run on these hosts (e.g. node1:1,...,node4:1 of netns-cluster), "
        "the first N for N ranks, instead of --oversubscribe on this machine",
    )
    p.add_argument(
        "--mpirun-flags",
        default="",
        help="more mpirun flags with --hosts (e.g. $(netns-cluster flags))",
    )
    p.add_argument("--where", default="one box", help="where it ran, for the JSON")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    ranks = [int(r) for r in args.ranks.split(",")]
    versions = {"now": str(ROOT)}
    tmp = None
    if args.before:
        import tempfile

        sys.path.insert(0, str(HERE))
        from interleave import export_commit

        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # Not under /tmp: emulated nodes with a private /tmp must see it.
        tmp = tempfile.TemporaryDirectory(prefix="kmp-before-", dir="/var/tmp")
        export_commit(commit, Path(tmp.name))
        versions = {f"before {commit}": tmp.name, "now": str(ROOT)}
    results = {v: {str(r): [] for r in ranks} for v in versions}
    load_at_start = os.getloadavg()[0]
    for rnd in range(args.rounds):
        for r in ranks:
            order = list(versions)
            if rnd % 2:
                order.reverse()
            for version in order:
                job = run_job(r, args, versions[version])
                results[version][str(r)].append(job)
                row = ", ".join(
                    f"{layer} {v['median_us']:.0f}"
                    for layer, v in job["layers"].items()
                )
                print(
                    f"round {rnd + 1} np={r} {version} (load {job['load'][0]:.1f}-"
                    f"{job['load'][1]:.1f}): us per call, median of {args.reps}: "
                    f"{row}",
                    flush=True,
                )
    if tmp is not None:
        tmp.cleanup()
    if len(versions) == 1:
        results = results["now"]
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": " ".join(["python", *sys.argv]),
                    "elements": args.elements,
                    "calls": args.calls,
                    "reps": args.reps,
                    "rounds": args.rounds,
                    "before": args.before,
                    "where": args.where,
                    "hosts": args.hosts,
                    # Each job records the load average before and after it
                    # (`load`); this is the machine's before the first job.
                    "load_average_at_start": load_at_start,
                    "cores": os.cpu_count(),
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
