"""A fit with a timeline, as a user writes it (tests/test_timeline.py).

Usage: timeline_fit.py DIR MODE [REPORT_STYLE [WIRE_DTYPE]]

MODE "ok": 2 epochs of 8 steps, validation, a stock ModelCheckpoint, loss
scaling with growth_interval=3 (loss-scale grows in the window), buckets of
4 KB (several per step), `Timeline(DIR/trace.json, steps="2-11")`; the last
rank sleeps 3 s before global step 10 (a straggler: the other ranks wait in
that step's first reduction, and with KERAS_MPFP16_STALL_TIMEOUT=1 the stall
inspector warns). Report style from argv[3] ("epoch" or "table"), the
gradient wire from argv[4] (default float32).

MODE "crash": the timeline comes from KERAS_MPFP16_TIMELINE (set by the
test); the last rank raises in a callback at the end of global step 5.

Prints one JSON line per rank.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.backend.buckets import plan_buckets  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
if os.environ.get("TIMELINE_TEST_PINGPONG"):
    # Test only: pretend each rank runs its own kernel, so the clocks are
    # aligned by ping-pong with rank 0 (as across hosts). They are in fact
    # the same clock: the measured offset must be within its stated bound.
    from keras_mpfp16.runtime.trace import clocks as _tl

    _tl._boot_id = lambda: f"fake-kernel-{os.environ.get('OMPI_COMM_WORLD_RANK')}"
style = sys.argv[3] if len(sys.argv) > 3 else "epoch"
wire_dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
rank, size = kmp.rank(), kmp.size()
BUCKET_MB = 4096 / 2**20
BATCH, STEPS = 8, 8

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(BATCH * STEPS * size, 6, 4)).astype("float32")
y = (x.mean(axis=(1, 2)) > 0).astype("float32")
xv, yv = x[: 4 * BATCH], y[: 4 * BATCH]
x, y = kmp.shard(x, y)

model = keras.Sequential(
    [
        keras.Input((6, 4)),
        keras.layers.LSTM(16, return_sequences=True),
        keras.layers.LSTM(16),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(
    optimizer=kmp.DistributedOptimizer(
        "adam",
        bucket_size_mb=BUCKET_MB,
        wire_dtype=wire_dtype,
        loss_scale=True,
        initial_scale=2.0**8,
        growth_interval=3,
    ),
    loss="binary_crossentropy",
    metrics=["accuracy"],
)


class Straggler(keras.callbacks.Callback):
    """The last rank arrives late at step 10 (mode ok: in the second epoch,
    away from step 0, whose tracing time differs between ranks) or fails
    at step 5."""

    def __init__(self):
        super().__init__()
        self.base = self.batches = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.base += self.batches

    def on_train_batch_begin(self, batch, logs=None):
        if mode == "ok" and rank == size - 1 and self.base + batch == 10:
            time.sleep(3.0)

    def on_train_batch_end(self, batch, logs=None):
        self.batches = batch + 1
        if mode == "crash" and rank == size - 1 and self.base + batch == 5:
            raise RuntimeError("deliberate failure at step 5")


callbacks = [Straggler(), keras.callbacks.ModelCheckpoint(f"{out_dir}/ckpt.keras")]
timeline = None
if mode == "ok":
    timeline = kmp.callbacks.Timeline(
        f"{out_dir}/trace.json", steps="2-11", report=style
    )
    callbacks.append(timeline)  # listed last: fit runs it first anyway
model.fit(
    x,
    y,
    batch_size=BATCH,
    epochs=2,
    validation_data=(xv, yv),
    callbacks=callbacks,
    verbose=0,
)

sizes = [int(np.prod(v.shape)) * 4 for v in model.trainable_variables]
plan = plan_buckets(sizes, int(BUCKET_MB * 2**20))
print(
    json.dumps(
        {
            "rank": rank,
            "report": timeline.report if timeline else None,
            "written": timeline.written if timeline else None,
            "plan_bytes": [sum(sizes[i] for i in b) for b in plan],
        }
    ),
    flush=True,
)
