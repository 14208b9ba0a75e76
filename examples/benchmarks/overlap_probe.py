"""Does a bucket's allreduce start while backprop is still running?

    mpirun -np 2 --bind-to none python examples/benchmarks/overlap_probe.py \\
        --out docs/benchmarks/overlap_probe.json

Trains a deep MLP (8 x Dense(1024), 4 MB of gradients per layer, 4 MB
buckets: about one bucket per layer) with Keras `fit` and the DistributedOptimizer,
and timestamps, on every rank and every step (monotonic clock, relative to
the step's first event):

* `grad_ready[i]`: when gradient i existed -- a stateless probe
  (`tf.numpy_function` whose zero result is added to the gradient: no automatic
  control dependency, so it runs as soon as its one-element input slice is
  computed) on each gradient;
* `bucket_start[b]`, `bucket_end[b]`: entry and exit of bucket b's MPI call.

Backprop produces the last layer's gradient first; bucket 1 holds it. If the
executor starts bucket 1 as soon as its gradients exist, bucket 1 starts
before the first layer's gradient (the last one backprop produces) is ready:
`first_bucket_start < last_grad_ready`. Runs with 1 and 2 inter-op threads
per rank (KERAS_MPFP16_THREADS=1,1 / 1,2), interleaved across steps of one
job is not possible (thread pools are fixed per process), so each setting is
its own job; the figures are per-step medians.
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


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_mpfp16 as kmp
    from keras_mpfp16.backend import tensorflow as bridge
    from keras_mpfp16.backend import tf_gradients
    from keras_mpfp16.runtime.mpi import collectives

    events = []  # (kind, index, time)

    def stamp(kind, index):
        def f(x):
            events.append((kind, index, time.perf_counter()))
            return np.float32(0)

        return f

    original = tf_gradients.allreduce_gradients

    def probed(grads, **kwargs):
        # Each gradient passes through "+ probe()" (a zero): the probe runs as
        # soon as its one-element slice of the gradient exists and cannot be
        # pruned; it is stateless, so no automatic control dependency orders
        # it after (or before) the buckets.
        stamped = []
        for i, g in enumerate(grads):
            if g is None:
                stamped.append(g)
                continue
            g = tf.convert_to_tensor(g)
            zero = tf.numpy_function(
                stamp("grad_ready", i),
                [tf.reshape(g, [-1])[:1]],
                tf.float32,
                stateful=False,
            )
            stamped.append(g + tf.cast(tf.reshape(zero, []), g.dtype))
        return original(stamped, **kwargs)

    bridge.allreduce_gradients = probed
    inner = collectives.allreduce_sum_into

    def timed(send, recv, name):
        events.append(("bucket_start", name, time.perf_counter()))
        inner(send, recv, name)
        events.append(("bucket_end", name, time.perf_counter()))

    collectives.allreduce_sum_into = timed

    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.width,))]
    layers += [keras.layers.Dense(args.width, activation="relu") for _ in range(8)]
    layers += [keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(
        optimizer=kmp.DistributedOptimizer("sgd", bucket_size_mb=args.bucket_mb),
        loss="mse",
    )
    rng = np.random.default_rng(kmp.rank())
    x = rng.normal(size=(args.batch * args.steps, args.width)).astype("float32")
    y = rng.normal(size=(args.batch * args.steps, 1)).astype("float32")
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0)  # trace + warm
    events.clear()
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0)
    per_step = (time.perf_counter() - t0) / args.steps
    # Cut the event stream into steps: each step has one event per gradient.
    from keras_mpfp16.backend.buckets import plan_buckets

    n_grads = len(model.trainable_variables)
    sizes = [int(np.prod(v.shape)) * 4 for v in model.trainable_variables]
    n_buckets = len(plan_buckets(sizes, int(args.bucket_mb * 2**20)))
    steps, current = [], []
    for kind, index, t in events:
        current.append((kind, index, t))
        if (
            sum(k == "bucket_end" for k, _, _ in current) == n_buckets
            and sum(k == "grad_ready" for k, _, _ in current) == n_grads
        ):
            steps.append(current)
            current = []
    summary = []
    for ev in steps:
        start = min(t for _, _, t in ev)
        grads = {i: t - start for k, i, t in ev if k == "grad_ready"}
        starts = [t - start for k, _, t in ev if k == "bucket_start"]
        ends = [t - start for k, _, t in ev if k == "bucket_end"]
        summary.append(
            {
                "first_grad_ready": min(grads.values()),
                "last_grad_ready": max(grads.values()),
                "first_layer_kernel_grad_ready": grads[0],
                "first_bucket_start": starts[0],
                "first_bucket_end": ends[0],
                "last_bucket_end": ends[-1],
                "buckets_started_before_last_grad": sum(
                    s < max(grads.values()) for s in starts
                ),
            }
        )
    rec = {
        "event_counts": {
            k: sum(e[0] == k for e in events)
            for k in ("grad_ready", "bucket_start", "bucket_end")
        },
        "rank": kmp.rank(),
        "threads": os.environ.get("KERAS_MPFP16_THREADS"),
        "seconds_per_step": per_step,
        "buckets": n_buckets,
        "steps_parsed": len(summary),
        "per_step": summary,
    }
    print(json.dumps(rec), flush=True)


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--out")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from mpi_launch import mpi_env, mpirun_path

    results = {}
    for threads in ("1,1", "1,2"):
        cmd = [
            mpirun_path(),
            "-np",
            "2",
            "--bind-to",
            "none",
            sys.executable,
            __file__,
            "--worker",
            *sum(
                (
                    [f"--{k}", str(getattr(args, k.replace("-", "_")))]
                    for k in ("width", "batch", "steps", "bucket-mb")
                ),
                [],
            ),
        ]
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=mpi_env({"KERAS_MPFP16_THREADS": threads}),
            timeout=900,
        )
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-4000:])
        recs = [
            json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")
        ]
        results[threads] = recs
        for r in recs:
            rows = r["per_step"]

            def med(key, rows=rows):
                return statistics.median(s[key] for s in rows) * 1e3

            print(
                f"threads {threads} rank {r['rank']}: {r['seconds_per_step'] * 1e3:.0f} "
                f"ms/step; median over {len(rows)} steps: last gradient ready at "
                f"{med('last_grad_ready'):.1f} ms, first bucket "
                f"{med('first_bucket_start'):.1f}-{med('first_bucket_end'):.1f} ms, "
                f"last bucket ends {med('last_bucket_end'):.1f} ms; buckets started "
                "before the last gradient: "
                + ",".join(str(s["buckets_started_before_last_grad"]) for s in rows),
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": "python examples/benchmarks/overlap_probe.py "
                    + " ".join(sys.argv[1:]),
                    "when": time.strftime("%Y-%m-%d %H:%M"),
                    "results": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
