"""Callbacks on N ranks against one process over the same full data.

One job, several checks (each mpirun costs seconds of TensorFlow import):

1. A distributed `fit` (sharded training data with sample weights, validation
   sharded with `drop_remainder=False` so ranks run *different* numbers of
   validation steps) with `GlobalMetrics` and `LearningRateScaler` listed
   *after* a recording callback. Every rank also trains a reference model in
   one process over the full data with batch N*b (plain SGD, no collectives)
   and reports both; the test compares per-batch and per-epoch logs.
2. Output and files: verbose=2 on every rank (only rank 0 may print), an
   `AtomicModelCheckpoint` counting its writes per rank, a `root_only`
   CSVLogger with a per-rank file name.
3. Resume: load the checkpoint written after epoch 1 on every rank, continue
   with `initial_epoch=1`, report the epochs and final weights.
4. Unequal training steps: `GlobalMetrics` raises before any step.

Usage: cb_exact.py DIR. Prints one JSON line per rank.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import compile_with_auc, fit_in_order  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.callbacks import (  # noqa: E402
    AtomicModelCheckpoint,
    GlobalMetrics,
    LearningRateScaler,
    root_only,
)
from keras_mpfp16.data import shard  # noqa: E402

tf.config.experimental.enable_op_determinism()
out_dir = sys.argv[1]
rank, n = kmp.rank(), kmp.size()
b, steps, epochs = 4, 5, 3
n_train = n * b * steps + (n - 1)  # the n-1 extra rows are dropped by shard
n_val = 2 * n * 8 + 5  # uneven: ranks get different numbers of val batches

rng = np.random.default_rng(3)
x = rng.normal(size=(n_train, 6, 3)).astype("float32")
y = (rng.random(size=(n_train, 1)) < 0.5).astype("float32")
w = rng.uniform(0.2, 2.0, size=(n_train,)).astype("float32")
xv = rng.normal(size=(n_val, 6, 3)).astype("float32")
yv = (rng.random(size=(n_val, 1)) < 0.5).astype("float32")


def build():
    keras.utils.set_random_seed(11)
    return keras.Sequential(
        [
            keras.Input((6, 3)),
            keras.layers.LSTM(5),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


def compile_(model, optimizer):
    compile_with_auc(
        model,
        optimizer,
        weighted_metrics=[keras.metrics.MeanAbsoluteError(name="wmae")],
    )


def scaler(**kw):
    return LearningRateScaler(rule="linear", warmup_epochs=1.5, decay=0.9, **kw)


class Recorder(keras.callbacks.Callback):
    """Listed first: records what it is given (GlobalMetrics comes later)."""

    def __init__(self):
        super().__init__()
        self.batches, self.val_final = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append({k: float(v) for k, v in logs.items()})


class CountingCheckpoint(AtomicModelCheckpoint):
    writes = 0

    def write(self, path):
        CountingCheckpoint.writes += 1
        super().write(path)


def weights(model):
    return [wt.tolist() for wt in model.get_weights()]


# -- 1 + 2: distributed fit ------------------------------------------------------
xs, ys, ws = shard(x, y, w)
val = shard(xv, yv, batch_size=8, drop_remainder=False)
val_steps = kmp.allgather(np.int64(-(-len(val[0]) // 8))).tolist()

model = build()
initial = model.get_weights()
compile_(model, kmp.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))
rec = Recorder()
ckpt = CountingCheckpoint(os.path.join(out_dir, "ck-{epoch:02d}.keras"))
csv = root_only(keras.callbacks.CSVLogger(os.path.join(out_dir, f"log-{rank}.csv")))
# how the fit here and the resumed fit in 3 take this rank's shard
sharded = dict(
    sample_weight=ws,
    batch_size=b,
    epochs=epochs,
    validation_data=val,
    validation_batch_size=8,
)
hist = model.fit(
    xs,
    ys,
    **sharded,
    shuffle=False,
    verbose=2,
    callbacks=[rec, ckpt, csv, GlobalMetrics(), scaler()],
)
dist = {
    "history": hist.history,
    "batches": rec.batches,
    "weights": weights(model),
}
after_fit = model.evaluate(*val, batch_size=8, verbose=0, return_dict=True)
evaluate_global = model.evaluate(
    *val, batch_size=8, verbose=0, return_dict=True, callbacks=[GlobalMetrics()]
)

# -- 1: the one-process reference (every rank runs it: no collectives) ----------
kept = n * b * steps
ref = build()
ref.set_weights(initial)
compile_(ref, keras.optimizers.SGD(0.05, momentum=0.9))
ref_rec = Recorder()
ref_hist = fit_in_order(
    ref,
    x[:kept],
    y[:kept],
    sample_weight=w[:kept],
    batch_size=n * b,
    epochs=epochs,
    validation_data=(xv, yv),
    validation_batch_size=8,
    callbacks=[ref_rec, scaler(num_workers=n)],
)
reference = {
    "history": ref_hist.history,
    "batches": ref_rec.batches,
    "weights": weights(ref),
}

# -- 3: resume from the checkpoint written after epoch 1 ---------------------------
kmp.barrier()  # rank 0 has written it
resumed = keras.models.load_model(os.path.join(out_dir, "ck-01.keras"))
opt = resumed.optimizer
loaded_state = {
    "iterations": int(opt.iterations.numpy()),
    "skipped": int(opt.skipped_steps.numpy()),
    "scale": float(opt.dynamic_scale.numpy()),
    "lr": float(np.asarray(opt.learning_rate)),
}
rec2 = Recorder()
hist2 = fit_in_order(
    resumed,
    xs,
    ys,
    **sharded,
    initial_epoch=1,
    callbacks=[rec2, GlobalMetrics(), scaler()],
)
resume = {
    "history": hist2.history,
    "batches": rec2.batches,
    "weights": weights(resumed),
    "loaded": loaded_state,
}

# -- 4: unequal training steps are refused before any step -------------------------
uneven_error = None
bad = build()
compile_(bad, kmp.DistributedOptimizer(keras.optimizers.SGD(0.05)))
try:
    extra = b if rank == n - 1 else 0
    bad.fit(
        xs[: len(xs) - extra],
        ys[: len(ys) - extra],
        batch_size=b,
        epochs=1,
        verbose=0,
        callbacks=[GlobalMetrics()],
    )
except ValueError as exc:
    uneven_error = str(exc)

print(
    json.dumps(
        {
            "rank": rank,
            "size": n,
            "val_steps": val_steps,
            "dist": dist,
            "reference": reference,
            "resume": resume,
            "after_fit_evaluate": after_fit,
            "evaluate_global": evaluate_global,
            "checkpoint_writes": CountingCheckpoint.writes,
            "uneven_error": uneven_error,
        }
    ),
    flush=True,
)
