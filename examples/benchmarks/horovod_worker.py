"""One mpirun job of the cluster benchmark's models, trained with Horovod 0.28.1.

The Horovod side of the cluster rows: the models of cluster_models.py (the
ones cluster_worker.py measures for keras_mpfp16), Horovod's documented Keras
adoption, configurations measured in interleaved rounds inside the job. Runs
in the Horovod venv (horovod_setup.sh: TF 2.15, its Keras 2):

    mpirun -np N ... .venv-horovod/bin/python \\
        examples/benchmarks/horovod_worker.py --model dense --configs none,fp16

Configurations:
  compute the bare optimizer: every rank trains its own replica, no Horovod
          (cluster_worker.py's `compute`, on Keras 2)
  none    hvd.DistributedOptimizer, no compression (float32 on the wire)
  fp16    hvd.Compression.fp16 (cast to float16 before the allreduce)
  sparse  (imdb) Horovod's default for Embedding gradients: IndexedSlices
          allgathered as rows
  dense   (imdb) sparse_as_dense=True: Embedding gradients densified

Every figure is seconds per step (the slowest rank's), one per round, with
the CPU seconds per step summed over the ranks (`cpu_seconds_per_step`); rank
0 prints each round and writes JSON with --out, in cluster_worker.py's layout.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from cluster_models import DEFAULT_STEPS, MODELS, build, data  # noqa: E402

keras = tf.keras

CONFIGS = ("compute", "none", "fp16", "sparse", "dense")


class Timer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.stamps = []
        self.cpu = []  # this process's CPU seconds (all its threads) at each stamp

    def on_train_batch_end(self, batch, logs=None):
        self.stamps.append(time.perf_counter())
        self.cpu.append(time.process_time())


def slowest(seconds: float) -> float:
    return float(np.max(hvd.allgather(np.array([seconds], np.float64))))


def all_ranks(seconds: float) -> float:
    """The sum over ranks (CPU seconds: what the job asked of the machine)."""
    return float(np.sum(hvd.allgather(np.array([seconds], np.float64))))


class Training:
    def __init__(self, model, config, x, y, steps):
        if config not in CONFIGS:
            raise ValueError(f"unknown configuration {config!r}; allowed: {CONFIGS}")
        self.x, self.y, self.steps = x, y, steps
        net, opt, self.batch = build(keras, model)
        if config != "compute":
            opt = hvd.DistributedOptimizer(
                opt,
                compression=hvd.Compression.fp16
                if config == "fp16"
                else hvd.Compression.none,
                sparse_as_dense=config == "dense",
            )
        net.compile(optimizer=opt, loss="binary_crossentropy")
        self.net = net
        self.params = int(sum(np.prod(w.shape) for w in net.trainable_weights))
        self.run(2, broadcast=True)  # trace, warm up, rank 0's weights

    def run(self, steps, broadcast=False):
        timer = Timer()
        callbacks = [timer]
        if broadcast:
            callbacks.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
        n = self.batch * steps
        self.net.fit(
            self.x[:n],
            self.y[:n],
            batch_size=self.batch,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
        return timer

    def measure(self):
        timer = self.run(self.steps)
        stamps = timer.stamps
        per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        cpu = (timer.cpu[-1] - timer.cpu[0]) / (len(stamps) - 1)
        return slowest(per_step), all_ranks(cpu)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--configs", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=None, help="timed steps per fit")
    p.add_argument("--label", default="")
    p.add_argument("--out")
    args = p.parse_args()
    hvd.init()
    configs = args.configs.split(",")
    steps = args.steps or DEFAULT_STEPS[args.model]
    rank, n = hvd.rank(), hvd.size()
    _, _, batch = build(keras, args.model)
    x, y = data(args.model, batch * (steps + 1), seed=rank)
    runners = {c: Training(args.model, c, x, y, steps + 1) for c in configs}
    raw = {c: [] for c in configs}
    cpu = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else configs[::-1]  # A B C, C B A, ...
        for c in order:
            seconds, cpu_seconds = runners[c].measure()
            raw[c].append(seconds)
            cpu[c].append(cpu_seconds)
        if rank == 0:
            print(
                f"{args.label} round {r + 1}: "
                + "  ".join(f"{c}={raw[c][-1] * 1e3:.0f}ms" for c in configs),
                flush=True,
            )
    hosts = [str(h) for h in hvd_tf.allgather_object(platform.node())]
    if rank == 0:
        result = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "label": args.label,
            "impl": f"horovod {importlib.metadata.version('horovod')}",
            "model": args.model,
            "params": next(iter(runners.values())).params,
            "ranks": n,
            "hosts": hosts,
            "rounds": args.rounds,
            "steps": steps,
            "seconds_per_step": raw,
            "median": {c: statistics.median(v) for c, v in raw.items()},
            "cpu_seconds_per_step": cpu,
        }
        print(json.dumps(result["median"]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
