"""A training script preempted by a real signal, then started again.

`mpirun -np N python preempt.py DIR MODE BACKUP`:

- MODE `full`: the uninterrupted run; `run`: the same script, slowed down
  after the marker step (epoch 1, step 5) so the test has time to send a
  signal mid-epoch; every rank writes `DIR/ready.<rank>` (its pid) there.
  A relaunch is just `run` again (a backup is then restored).
- BACKUP `user`: `fit` has a stock `keras.callbacks.BackupAndRestore`
  (save_freq="epoch"); `horovod`: a stock `ModelCheckpoint` and
  `BackupAndRestore` appended on rank 0 only (Horovod's habit); `own`: none (the library's own backup directory,
  `KERAS_MPFP16_PREEMPTION_DIR`, set by the test).
- an optional 4th argument `sgd`: SGD instead of Adam (another job).

Ranks are seeded differently (rank 0's model wins). Prints one JSON line per
rank after `fit` returns: the epochs run, the history, a digest of every
model and optimizer variable. A preempted rank prints a JSON line with the
`Preempted` exception's fields and exits with its status.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    binary_data,
    dense_bn_model,
    emit,
    fit_in_order,
    run_record,
)

import keras_mpfp16 as kmp  # noqa: E402

out_dir, mode, backup = sys.argv[1], sys.argv[2], sys.argv[3]
variant = sys.argv[4] if len(sys.argv) > 4 else ""  # "sgd": another job's optimizer
rank, n = kmp.rank(), kmp.size()
EPOCHS, BATCH, STEPS = 3, 4, 20
MARK_EPOCH, MARK_STEP = 1, 5

rng = np.random.default_rng(11)
x, y = binary_data(rng, BATCH * STEPS * n)
xv, yv = binary_data(rng, 17)

model = dense_bn_model(
    100 + rank,
    keras.optimizers.SGD(0.05) if variant == "sgd" else keras.optimizers.Adam(0.01),
)


class Steps(keras.callbacks.Callback):
    epochs: list = []
    first_step = None

    def on_epoch_begin(self, epoch, logs=None):
        Steps.epochs.append(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if Steps.first_step is None:
            Steps.first_step = batch

    def on_train_batch_end(self, batch, logs=None):
        log = os.environ.get("PREEMPT_STEP_LOG")  # examples/benchmarks/preemption.py
        if log and rank == 0:
            with open(log, "a") as f:
                f.write(f"{Steps.epochs[-1]} {batch} {time.time()}\n")
        if mode != "run" or Steps.epochs[0] != 0:
            return  # only the first launch waits for the signal
        epoch = Steps.epochs[-1]
        if (epoch, batch) == (MARK_EPOCH, MARK_STEP):
            path = os.path.join(out_dir, f"ready.{rank}")
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(path + ".tmp", path)
        if (epoch, batch) >= (MARK_EPOCH, MARK_STEP):
            time.sleep(0.3)  # a long step: the signal lands mid-epoch


callbacks = [Steps()]
if backup == "user":
    callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")))
elif backup == "horovod" and rank == 0:  # a script ported from Horovod
    callbacks.append(
        keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "checkpoint.keras"))
    )
    callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")))
try:
    hist = fit_in_order(
        model,
        *kmp.shard(x, y),
        batch_size=BATCH,
        epochs=EPOCHS,
        validation_data=(xv, yv),
        callbacks=callbacks,
    )
except kmp.Preempted as exc:
    emit(
        {
            "rank": rank,
            "preempted": True,
            "signal": exc.signal,
            "epoch": exc.epoch,
            "steps_done": exc.steps_done,
            "backup_dir": exc.backup_dir,
            "code": exc.code,
            "t_exit": time.time(),
        }
    )
    raise
emit(
    run_record(
        model,
        hist,
        Steps.epochs,
        first_step=Steps.first_step,
        # Horovod's habit: rank 0's last checkpoint, loaded on every rank
        # right after fit, is the model fit ended with.
        checkpoint_is_model=(
            backup != "horovod"
            or all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(
                    keras.models.load_model(
                        os.path.join(out_dir, "checkpoint.keras")
                    ).weights,
                    model.weights,
                )
            )
        ),
    )
)
