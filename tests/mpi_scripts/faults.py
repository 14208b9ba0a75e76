"""Fault injection for multi-rank training. One fault per run:

  exception-layer | exception-callback | exception-input : rank 1 raises at batch 3
  sigkill      rank 1 SIGKILLs itself at batch 3 (writes the time first, to --stamp)
  exit         rank 1 calls sys.exit(3) at batch 3
  uneven       rank 1 has one batch more per epoch: in a custom loop of
               train_on_batch calls (nobody reports epochs), or with
               --epochs-known in fit on a dataset of unknown length (no one
               can count the steps beforehand; fit reports the epochs)
  uneven-known rank 1 has one batch more per epoch, in arrays (fit counts
               the steps before the first one)
  mismatch     rank 1 builds a wider LSTM
  nan          rank 1's inputs are NaN from batch 2 on (--policy float32/mixed_float16)
  diverge      rank 1 perturbs its weights after batch 4; replica check every 2 steps
  stall        rank 1 sleeps 5 s before a barrier (the test sets a 2 s stall timeout)
  hang-step    rank 1 sleeps an hour inside its 16th train step (epoch 2, after
               the first step's tracing; in a layer; the test sets a short
               KERAS_MPFP16_HANG_TIMEOUT)
  ckpt-crash   4 epochs with AtomicModelCheckpoint(--ckpt); rank 0 is SIGKILLed
               half-way through writing the 3rd checkpoint
  ckpt-resume  load --ckpt's checkpoint on every rank and finish the 4 epochs
  ckpt-full    the same 4 epochs uninterrupted (reference for ckpt-resume)

Prints "DONE rank R" on a rank that finishes (the faults should prevent it).
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import fit_in_order, lstm_model_or_checkpoint  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--fault", required=True)
p.add_argument("--policy", default="float32")
p.add_argument("--stamp", default=None)
p.add_argument("--epochs-known", action="store_true")
p.add_argument("--ckpt", default=None)
args = p.parse_args()
rank, size = kmp.rank(), kmp.size()
keras.config.set_dtype_policy(args.policy)
fault = args.fault
FAULTY = 1
b = 8


def stamp():
    if args.stamp:
        with open(args.stamp, "w") as f:
            f.write(repr(time.time()))


if fault.startswith("ckpt"):
    import hashlib
    import json

    rng = np.random.default_rng(rank)
    x = rng.normal(size=(12 * b, 6, 3)).astype("float32")
    y = rng.normal(size=(12 * b, 1)).astype("float32")
    path = os.path.join(args.ckpt, "last.keras") if args.ckpt else None

    class CrashingCheckpoint(kmp.callbacks.AtomicModelCheckpoint):
        writes = 0

        def write(self, p):
            CrashingCheckpoint.writes += 1
            if fault == "ckpt-crash" and CrashingCheckpoint.writes == 3:
                with open(p, "wb") as f:  # half a file, then the process dies
                    f.write(b"PK\x03\x04 truncated")
                    f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            super().write(p)

    model, start = lstm_model_or_checkpoint(path, 12, resume=fault == "ckpt-resume")
    callbacks = [CrashingCheckpoint(path)] if path else []
    fit_in_order(
        model, x, y, batch_size=b, epochs=4, initial_epoch=start, callbacks=callbacks
    )
    h = hashlib.sha256(
        b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
    )
    print(
        json.dumps(
            {"rank": rank, "resumed_from_epoch": start, "digest": h.hexdigest()}
        ),
        flush=True,
    )
    print(f"DONE rank {rank}", flush=True)
    sys.exit(0)

if fault == "stall":
    if rank == FAULTY:
        time.sleep(5)
    kmp.barrier()
    print(f"DONE rank {rank}", flush=True)
    sys.exit(0)

steps = 12 + (1 if fault.startswith("uneven") and rank == FAULTY else 0)
rng = np.random.default_rng(rank)
x = rng.normal(size=(steps * b, 6, 3)).astype("float32")
y = rng.normal(size=(steps * b, 1)).astype("float32")
if fault == "nan" and rank == FAULTY:
    x[2 * b :] = np.nan


class FailingLayer(keras.layers.Layer):
    """Raises from inside the compiled step on the faulty rank, at its 4th call."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def call(self, inputs):
        def check(v):
            self.calls += 1
            if rank == FAULTY and fault == "hang-step" and self.calls == 16:
                stamp()
                time.sleep(3600)  # a step that never returns
            if rank == FAULTY and fault != "hang-step" and self.calls == 4:
                stamp()
                raise ValueError("injected failure inside a layer")
            return v

        out = tf.numpy_function(check, [inputs], inputs.dtype)
        out.set_shape(inputs.shape)
        return out


units = 9 if fault == "mismatch" and rank == FAULTY else 8
layers = [keras.Input((6, 3))]
if fault in ("exception-layer", "hang-step"):
    layers.append(FailingLayer())
layers += [keras.layers.LSTM(units), keras.layers.Dense(1, dtype="float32")]
model = keras.Sequential(layers)
opt = kmp.DistributedOptimizer(
    "sgd",
    max_consecutive_nonfinite=3,
    initial_scale=8.0,
    check_replicas_every=2 if fault == "diverge" else 0,
)
model.compile(optimizer=opt, loss="mse")


class Inject(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if args.epochs_known:
            kmp.runtime.progress.set_epoch(epoch)

    def on_train_batch_end(self, batch, logs=None):
        if rank != FAULTY:
            return
        if fault == "exception-callback" and batch == 3:
            stamp()
            raise RuntimeError("injected failure inside a callback")
        if fault == "sigkill" and batch == 3:
            stamp()
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "exit" and batch == 3:
            stamp()
            sys.exit(3)
        if fault == "diverge" and batch == 4:
            model.set_weights([w + 0.01 for w in model.get_weights()])


data = (x, y)
if fault == "exception-input":

    def gen():
        for i in range(steps):
            if rank == FAULTY and i == 3:
                stamp()
                raise OSError("injected failure in the input pipeline")
            yield x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]

    ds = tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec((None, 6, 3), tf.float32),
            tf.TensorSpec((None, 1), tf.float32),
        ),
    )
    model.fit(ds, epochs=2, verbose=0, callbacks=[Inject()])
elif fault == "uneven" and not args.epochs_known:
    for i in range(steps):
        model.train_on_batch(x[i * b : (i + 1) * b], y[i * b : (i + 1) * b])
elif fault == "uneven":
    unknown_length = (
        tf.data.Dataset.from_tensor_slices(data).batch(b).filter(lambda a, c: True)
    )
    model.fit(unknown_length, epochs=2, verbose=0, callbacks=[Inject()])
else:
    fit_in_order(model, *data, batch_size=b, epochs=2, callbacks=[Inject()])
print(f"DONE rank {rank}", flush=True)
