"""One rank of `scale_guarantees.py` (run under mpirun, not by hand).

    mpirun -np N python examples/benchmarks/scale_worker.py MODE OUT_DIR

MODE:

- `fit`: the healthy run. A small LSTM, every rank seeded differently (rank
  0's model wins the initial broadcast), `fit` on `kmp.shard`ed data with
  validation data of fewer batches than ranks (some ranks evaluate nothing),
  then `evaluate`. Writes OUT_DIR/rank<r>.json: a digest of every model and
  optimizer variable, the history, the evaluation, and the costs measured on
  the way (start-up, broadcast, the same-data check of `kmp.shard`, the
  per-step control reduction, the stall inspector's messages, the timeline's
  merge, resident memory). Rank 0 then trains the same initial model alone
  (plain Keras, batch N*b: the same global batches) and evaluates the
  distributed model alone, for the comparison.
- `preempt`: the same fit, longer, each step slowed after epoch 1 step 3;
  every rank writes OUT_DIR/ready.<r> there. The driver sends SIGUSR1 to
  mpirun; each rank writes OUT_DIR/rank<r>.json with the `Preempted` fields.
- `fault`: the last rank raises at epoch 0 step 3 (writes OUT_DIR/raise.json
  with the time first).

Times are `time.time()` (one clock: all ranks on one machine; on the emulated
cluster the namespaces share the host clock too).
"""

import hashlib
import json
import os
import resource
import socket
import statistics
import sys
import time

T_START = time.time()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.runtime.supervision import preemption, stall  # noqa: E402

mode, out_dir = sys.argv[1], sys.argv[2]
T_IMPORTED = time.time()
rank, n = kmp.rank(), kmp.size()
T_INIT = time.time()
B, STEPS, EPOCHS = 4, 6, 2
if mode == "preempt":
    STEPS, EPOCHS = 12, 3
T, F = 8, 4


def write(name: str, record: dict) -> None:
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


rng = np.random.default_rng(5)
x = rng.normal(size=(n * B * STEPS, T, F)).astype("float32")
y = (x[:, :, 0].mean(axis=1, keepdims=True) > 0).astype("float32")
# Fewer validation batches than ranks (at N >= 4): ranks n//2+1.. get none.
val_rows = B * (n // 2) + 3
xv = rng.normal(size=(val_rows, T, F)).astype("float32")
yv = (xv[:, :, 0].mean(axis=1, keepdims=True) > 0).astype("float32")


def build(seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((T, F)), keras.layers.LSTM(16), keras.layers.Dense(1)]
    )


model = build(100 + rank)
initial = [np.array(w) for w in model.get_weights()]
model.compile(
    optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.05)),
    loss="mse",
    metrics=["mae"],
)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        kmp.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    # Every rank's time, the slowest counts (the collective ends everywhere).
    return float(statistics.median(times))


costs: dict = {}
if mode == "fit":
    # kmp.shard's same-data check: with and without it (one allgather).
    costs["shard_checked_s"] = median_time(
        lambda: kmp.shard(x, y, batch_size=B, check=True), 5
    )
    costs["shard_unchecked_s"] = median_time(
        lambda: kmp.shard(x, y, batch_size=B, check=False), 5
    )
    # The initial broadcast: every model and optimizer variable's bytes from
    # rank 0 (what fit's first step broadcasts), as one buffer; and 4 MiB.
    nbytes = sum(w.nbytes for w in initial)
    buf = np.zeros(nbytes // 4, np.float32)
    costs["model_bytes"] = int(nbytes)
    costs["broadcast_model_s"] = median_time(lambda: kmp.broadcast(buf), 7)
    big = np.zeros(1 << 20, np.float32)
    costs["broadcast_4MiB_s"] = median_time(lambda: kmp.broadcast(big), 5)
    # The per-step control reduction (metric state + the learning-rate slots
    # + the "still evaluating" and preemption flags: float64, sum), at the
    # size this model's train step sends: 4 metric values (loss and mae:
    # total, count) + 2 slots per rank + 2.
    control = np.zeros(4 + 2 * n + 1, np.float64)
    costs["control_values"] = int(control.size + 1)
    costs["control_allreduce_s"] = (
        median_time(
            lambda: [preemption.allreduce_carrying(control) for _ in range(20)], 5
        )
        / 20
    )

xs, ys = kmp.shard(x, y, batch_size=B)


class Probe(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.first_step_t = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step_t is None:
            self.first_step_t = time.time()
        if mode == "fault" and rank == n - 1 and (self.epoch, batch) == (0, 3):
            write("raise.json", {"rank": rank, "t_raise": time.time()})
            raise RuntimeError(f"injected failure on rank {rank} of {n}")

    def on_train_batch_end(self, batch, logs=None):
        if mode != "preempt" or self.epoch < 1:
            return
        if (self.epoch, batch) == (1, 3):
            write(f"ready.{rank}", {"pid": os.getpid()})
        if (self.epoch, batch) >= (1, 3):
            time.sleep(0.3)  # a long step: the signal lands mid-epoch


class TimedTimeline(kmp.callbacks.Timeline):
    """The timeline callback, its end-of-fit merge timed."""

    merge_s = None

    def on_train_end(self, logs=None):
        t0 = time.perf_counter()
        super().on_train_end(logs)
        TimedTimeline.merge_s = time.perf_counter() - t0


probe = Probe()
callbacks = [probe]
if mode == "fit":
    callbacks.append(TimedTimeline(os.path.join(out_dir, "timeline.json")))
inspector = stall.inspector()


def inspector_counts():
    if inspector is None:
        return None
    return {"sent": dict(inspector.sent), "received": dict(inspector.received)}


counts_before, t_fit = inspector_counts(), time.time()
try:
    hist = model.fit(
        xs,
        ys,
        batch_size=B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=(xv, yv),
        callbacks=callbacks,
    )
except kmp.Preempted as exc:
    write(
        f"rank{rank}.json",
        {
            "rank": rank,
            "host": socket.gethostname(),
            "preempted": True,
            "signal": exc.signal,
            "epoch": exc.epoch,
            "steps_done": exc.steps_done,
            "backup_dir": exc.backup_dir,
            "t_exit": time.time(),
        },
    )
    raise
t_fit_end = time.time()
counts_after = inspector_counts()
evaluation = model.evaluate(xv, yv, batch_size=B, verbose=0, return_dict=True)

h = hashlib.sha256()
for v in list(model.variables) + list(model.optimizer.variables):
    h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
status = open("/proc/self/status").read()
rss_kb = int(status.split("VmRSS:")[1].split()[0])
record = {
    "rank": rank,
    "host": socket.gethostname(),
    "size": n,
    "digest": h.hexdigest(),
    "history": hist.history,
    "evaluate": evaluation,
    "t_start": T_START,
    "t_imported": T_IMPORTED,
    "t_init": T_INIT,
    "t_fit": t_fit,
    "t_first_step": probe.first_step_t,
    "t_fit_end": t_fit_end,
    "rss_mb": rss_kb / 1024,
    "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "inspector": {"before": counts_before, "after": counts_after},
    "timeline_merge_s": TimedTimeline.merge_s,
    "costs": costs,
}

if rank == 0:
    # One process, plain Keras, the same initial model (rank 0's, which the
    # broadcast gave every rank) on the same global batches of N*B rows.
    ref = build(100)
    ref.set_weights(initial)
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    ref_hist = ref.fit(
        x,
        y,
        batch_size=n * B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=(xv, yv),
    )
    record["reference_history"] = ref_hist.history
    # The distributed model's evaluation computed alone, in float64.
    pred = np.asarray(model(xv, training=False), np.float64)
    err = pred - yv.astype(np.float64)
    record["reference_evaluate"] = {
        "loss": float(np.mean(err**2)),
        "mae": float(np.mean(np.abs(err))),
    }
record["t_done"] = time.time()
write(f"rank{rank}.json", record)
