"""The communication thread (KERAS_MPFP16_OVERLAP) in a real `fit`
(tests/test_mpi_overlap.py).

Usage: overlap_fit.py MODE WIRE_DTYPE [OUT_DIR]

MODE "same": the same model (LSTM + Dense, 4 KB buckets: several buckets
per step, loss scaling with growth) trained for 2 epochs of 6 steps twice
from the same seed: synchronously (OVERLAP off), then with the
communication thread (OVERLAP on, a Timeline recording when OUT_DIR is
given). Prints per rank the digests of both runs' weights, the buckets the
thread ran, and the timeline's per-epoch report.

MODE "fail": OVERLAP on; on the last rank the thread's third bucket
reduction of step 3 raises ("injected failure on the communication
thread"): the job must end with that traceback.
"""

import sys
import threading

import _common
import keras
import numpy as np

import keras_mpfp16 as kmp
from keras_mpfp16.runtime.mpi import collectives, overlap

mode, wire_dtype = sys.argv[1], sys.argv[2]
out_dir = sys.argv[3] if len(sys.argv) > 3 else None
rank, size = kmp.rank(), kmp.size()
BATCH, STEPS = 8, 6

rng = np.random.default_rng(0)
x_all = rng.normal(size=(BATCH * STEPS * size, 5, 4)).astype("float32")
y_all = (x_all.mean(axis=(1, 2)) > 0).astype("float32")
x, y = kmp.shard(x_all, y_all)


def train(on: bool, timeline_path=None):
    kmp.config.set("OVERLAP", on)
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((5, 4)),
            keras.layers.LSTM(12, return_sequences=True),
            keras.layers.LSTM(12),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(
        optimizer=kmp.DistributedOptimizer(
            "adam",
            bucket_size_mb=1024 / 2**20,
            wire_dtype=wire_dtype,
            loss_scale=True,
            initial_scale=2.0**8,
            growth_interval=2,
        ),
        loss="binary_crossentropy",
    )
    callbacks = []
    timeline = None
    if timeline_path:
        timeline = kmp.callbacks.Timeline(timeline_path, steps="1-11", report="epoch")
        callbacks.append(timeline)
    model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=callbacks, verbose=0)
    return model, timeline


if mode == "fail":
    target = "alltoall_into" if wire_dtype != "float32" else "allreduce_sum_into"
    real = getattr(collectives, target)

    def failing(send, recv, name, **kwargs):
        if threading.current_thread().name == "keras_mpfp16 comm":
            if "train step 3" in name and "bucket 3/" in name and rank == size - 1:
                raise RuntimeError("injected failure on the communication thread")
        return real(send, recv, name, **kwargs)

    setattr(collectives, target, failing)
    train(True)
    _common.emit({"rank": rank, "finished": True})  # must not be reached
    sys.exit(0)

sync_model, _ = train(False)
thread = overlap._thread
before = len(thread.executed) if thread else 0
path = f"{out_dir}/trace.json" if out_dir else None
overlap_model, timeline = train(True, path)
executed = overlap._thread.executed[before:]
_common.emit(
    {
        "rank": rank,
        "sync": _common.digest(sync_model.get_weights()),
        "overlap": _common.digest(overlap_model.get_weights()),
        "loss_scale": float(np.asarray(overlap_model.optimizer.dynamic_scale)),
        "sync_loss_scale": float(np.asarray(sync_model.optimizer.dynamic_scale)),
        "executed": [list(k) for k in executed],
        "report": timeline.report if timeline else None,
    }
)
