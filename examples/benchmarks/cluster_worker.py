"""One mpirun job of the cluster benchmark: several configurations of one
model, measured in interleaved rounds inside the job (run by cluster_bench.py
on emulated nodes; it also runs under a plain `mpirun` anywhere).

    mpirun -np N ... python examples/benchmarks/cluster_worker.py \
        --model dense --configs compute,f32,f16,comm_f32 --rounds 5 --out r.json

Models (per-rank batch):
  facts  Input(128, 16) -> LSTM(128, seq) -> LSTM(128) -> Dense(1), Adam, 64
  dense  Input(2048) -> Dense(4096) -> Dense(4096) -> Dense(1), SGD, 32
         (25,178,113 parameters: communication-heavy)
  imdb   Embedding(20000, 128) -> LSTM(32) -> Dense(1), Adam, 32 x 200 tokens

Configurations:
  compute        the bare optimizer: every rank trains its own replica, no
                 gradient communication (all ranks compute at once, as in
                 the distributed step)
  f32 f16 bf16   DistributedOptimizer with that wire, 25 MB buckets
  auto           wire_dtype="auto" (decided in the warm-up fit; the JSON
                 records the decision)
  f32_1b         float32 wire, one bucket (reduction after the whole backward)
  CONFIG+ovl     CONFIG with the communication thread (KERAS_MPFP16_OVERLAP)
  f32_4mb        float32 wire, 4 MB buckets
  dense sparse   (imdb) Embedding gradients densified / gathered as rows
                 (KERAS_MPFP16_SPARSE_GRADIENTS when the step is traced)
  sparse_f16 sparse_auto
                 (imdb) gathered as rows (sparse="auto"), the dense
                 gradients on the float16 wire / on wire_dtype="auto"
  comm_<x>       the in-step reduction path alone, on this model's gradient
                 shapes (`bridge.allreduce_gradients` in a tf.function): the
                 communication-only time of configuration <x>
  <x>@<S>        configuration <x> (a 16-bit wire) on the pipelined schedule,
                 `WIRE_PIPELINE_SEGMENT=S` while it is traced and measured
                 (e.g. f16@32768, comm_f16@32768 beside f16, comm_f16)

Every figure is seconds per step (the slowest rank's), one per round; rank 0
prints each round and writes JSON with --out. Training configurations also
record, from the trace recorder (`keras_mpfp16.runtime.trace`, in memory),
the seconds per step spent inside gradient collectives (`in_collectives`),
and every configuration the CPU seconds per step summed over the ranks
(`cpu_seconds_per_step`: `time.process_time()`, every thread of a rank's
process), what the job asked of the machine's cores.
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from cluster_models import DEFAULT_STEPS, MODELS, build, data  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16 import runtime  # noqa: E402
from keras_mpfp16.backend import bridge  # noqa: E402
from keras_mpfp16.runtime import trace  # noqa: E402

SPARSE_ENV = "KERAS_MPFP16_SPARSE_GRADIENTS"
WIRES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
BUCKET_MB = 25.0


class Timer(keras.callbacks.Callback):
    """Step end times, and the recorder's steps (its MPI calls are recorded
    inside a step)."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder
        self.stamps = []
        self.cpu = []  # this process's CPU seconds (all its threads) at each stamp

    def on_train_batch_begin(self, batch, logs=None):
        self.recorder.begin_step(batch, 0)

    def on_train_batch_end(self, batch, logs=None):
        self.recorder.end_step()
        self.stamps.append(time.perf_counter())
        self.cpu.append(time.process_time())


@contextlib.contextmanager
def pipeline_setting(config: str):
    """`WIRE_PIPELINE_SEGMENT` as `config`'s `@S` suffix says (0 without one)
    for the block: it is read when a step is traced."""
    segment = int(config.partition("@")[2] or 0)
    kmp.config.set("WIRE_PIPELINE_SEGMENT", segment)
    try:
        yield config.partition("@")[0]
    finally:
        kmp.config.set("WIRE_PIPELINE_SEGMENT", 0)


def slowest(seconds: float) -> float:
    return float(runtime.allreduce(np.float64(seconds), op="max"))


def all_ranks(seconds: float) -> float:
    """The sum over ranks (CPU seconds: what the job asked of the machine)."""
    return float(runtime.allreduce(np.float64(seconds), op="sum"))


class Training:
    """A compiled model for one configuration; `measure()` = s/step."""

    def __init__(self, model, config, x, y, steps):
        self.x, self.y, self.steps = x, y, steps
        # "+ovl": the same configuration with the communication thread
        # (KERAS_MPFP16_OVERLAP, read when the step is traced).
        self.overlap = config.endswith("+ovl")
        config = config.removesuffix("+ovl")
        net, opt, self.batch = build(keras, model)
        self.sparse = None
        wire = None
        if config != "compute":
            wire, bucket = "float32", BUCKET_MB
            if config in WIRES:
                wire = WIRES[config]
            elif config == "auto":
                wire = "auto"
            elif config in ("sparse_f16", "sparse_auto"):
                self.sparse = "auto"
                wire = "float16" if config == "sparse_f16" else "auto"
            elif config == "f32_1b":
                bucket = 4096.0
            elif config == "f32_4mb":
                bucket = 4.0
            elif config in ("dense", "sparse"):
                self.sparse = "dense" if config == "dense" else "auto"
            else:
                raise ValueError(f"unknown configuration {config!r}")
            opt = kmp.DistributedOptimizer(opt, wire_dtype=wire, bucket_size_mb=bucket)
        net.compile(optimizer=opt, loss="binary_crossentropy", jit_compile=False)
        self.net = net
        self.opt = opt
        self.params = int(sum(np.prod(w.shape) for w in net.trainable_weights))
        if wire == "auto":
            # auto decides in the warm-up: the reductions after step 1, then
            # (when they favour float16) 5 whole steps per wire, steps at an
            # epoch start or after a re-trace not counted: 3 epochs suffice.
            self.run(steps, epochs=3)
        else:
            self.run(2)  # trace and warm up

    def run(self, steps, epochs=1):
        steps = min(steps, len(self.x) // self.batch)
        if self.sparse is not None:
            os.environ[SPARSE_ENV] = self.sparse  # read when the step is traced
        # Every step traced, in memory (no file), on this rank's own clock
        # (offset 0: the same time.perf_counter as the Timer's stamps).
        recorder = trace.Recorder(
            runtime.rank(), runtime.size(), platform.node(), trace.Window(every=1), None
        )
        timer = Timer(recorder)
        n = self.batch * steps
        kmp.config.set("OVERLAP", self.overlap)
        trace.activate(recorder)
        try:
            self.net.fit(
                self.x[:n],
                self.y[:n],
                batch_size=self.batch,
                epochs=epochs,
                shuffle=False,
                verbose=0,
                callbacks=[timer],
            )
        finally:
            trace.activate(None)
            recorder.close()
            kmp.config.set("OVERLAP", False)
        # Each MPI call: (name, start, end) in time.perf_counter() seconds.
        events = [
            (ev["name"], ev["ts"] / 1e6, (ev["ts"] + ev["dur"]) / 1e6)
            for ev in recorder.events
            if ev.get("ph") == "X" and ev.get("cat") in ("mpi", "collective")
        ]
        os.environ.pop(SPARSE_ENV, None)
        return timer, events

    def measure(self):
        timer, events = self.run(self.steps)
        stamps = timer.stamps
        # Skip the first step (input pipeline start-up).
        t0, t1 = stamps[0], stamps[-1]
        per_step = (t1 - t0) / (len(stamps) - 1)
        inside = sum(
            e - s for name, s, e in events if "gradient" in name and s >= t0 and e <= t1
        ) / (len(stamps) - 1)
        cpu = (timer.cpu[-1] - timer.cpu[0]) / (len(stamps) - 1)
        return slowest(per_step), slowest(inside), all_ranks(cpu)


class CommOnly:
    """The reduction path alone on the model's gradient shapes."""

    def __init__(self, model, config, calls):
        net, _, batch = build(keras, model)
        self.calls = calls
        base = config.removeprefix("comm_")
        wire = WIRES.get(base, "float32")
        sparse = {"dense": "dense", "sparse": "auto"}.get(base)
        rng = np.random.default_rng(runtime.rank())
        shapes = [tuple(v.shape) for v in net.trainable_weights]
        grads = []
        for v, shape in zip(net.trainable_weights, shapes):
            if model == "imdb" and "embedding" in v.path:
                idx = rng.integers(0, shape[0], size=batch * 200).astype("int64")
                vals = rng.normal(size=(idx.size, shape[1])).astype("float32")
                grads.append((tf.constant(vals), tf.constant(idx), shape))
            else:
                grads.append(tf.constant(rng.normal(size=shape).astype("float32")))

        br = bridge()

        @tf.function
        def reduce():
            gs = [
                tf.IndexedSlices(g[0], g[1], tf.constant(g[2], tf.int64))
                if isinstance(g, tuple)
                else g
                for g in grads
            ]
            out, finite = br.allreduce_gradients(
                gs,
                shapes=shapes,
                op="average",
                wire_dtype=wire,
                bucket_bytes=int(BUCKET_MB * 2**20),
                step=tf.constant(0, tf.int64),
                sparse=sparse,
            )
            # (a gathered Embedding gradient may come back as IndexedSlices)
            firsts = [
                o.values[:1] if isinstance(o, tf.IndexedSlices) else o[:1] for o in out
            ]
            return tf.add_n([tf.reduce_sum(f) for f in firsts]), finite

        self.fn = reduce
        self.fn()  # trace, connect

    def measure(self):
        runtime.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(self.calls):
            total, _ = self.fn()
            total.numpy()
        cpu = (time.process_time() - c0) / self.calls
        return slowest((time.perf_counter() - t0) / self.calls), None, all_ranks(cpu)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--configs", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=None, help="timed steps per fit")
    p.add_argument("--label", default="")
    p.add_argument("--out")
    args = p.parse_args()
    configs = args.configs.split(",")
    steps = args.steps or DEFAULT_STEPS[args.model]
    rank, n = runtime.rank(), runtime.size()
    _, _, batch = build(keras, args.model)
    x, y = data(args.model, batch * (steps + 1), seed=rank)
    runners = {}
    for c in configs:
        with pipeline_setting(c) as base:
            if c.startswith("comm_"):
                runners[c] = CommOnly(args.model, base, calls=max(3, steps // 2))
            else:
                runners[c] = Training(args.model, base, x, y, steps + 1)
    params = next((r.params for r in runners.values() if isinstance(r, Training)), None)
    raw = {c: [] for c in configs}
    cpu = {c: [] for c in configs}
    inside = {c: [] for c in configs if not c.startswith("comm_") and c != "compute"}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else configs[::-1]  # A B C, C B A, ...
        for c in order:
            with pipeline_setting(c):
                seconds, ins, cpu_seconds = runners[c].measure()
            raw[c].append(seconds)
            cpu[c].append(cpu_seconds)
            if c in inside:
                inside[c].append(ins)
        if rank == 0:
            print(
                f"{args.label} round {r + 1}: "
                + "  ".join(f"{c}={raw[c][-1] * 1e3:.0f}ms" for c in configs),
                flush=True,
            )
    if rank == 0:
        result = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "label": args.label,
            "model": args.model,
            "params": params,
            "ranks": n,
            "hosts": runtime.allgather_object(platform.node()),
            "threads": os.environ.get("KERAS_MPFP16_THREADS", "default"),
            "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle", ""),
            "rounds": args.rounds,
            "steps": steps,
            "seconds_per_step": raw,
            "median": {c: statistics.median(v) for c, v in raw.items()},
            # CPU seconds per step, summed over the ranks (every thread of
            # each rank's process: TensorFlow's, MPI's, the transfer's).
            "cpu_seconds_per_step": cpu,
            "in_collectives_per_step": inside,
            "wire_auto": {
                c: r.opt.wire_decision.as_dict()
                for c, r in runners.items()
                if getattr(getattr(r, "opt", None), "wire_decision", None)
            },
        }
        print(json.dumps(result["median"]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    else:
        runtime.allgather_object(platform.node())


if __name__ == "__main__":
    main()
