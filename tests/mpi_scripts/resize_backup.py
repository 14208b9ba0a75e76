"""A step-level backup written at N ranks, resumed at M != N ranks.

`mpirun -np N python resize_backup.py DIR MODE`: a stock script, 240 rows
dealt by `kmp.shard`, batch 4 per rank (20 steps per epoch at np=3, 30 at
np=2), 3 epochs, `shuffle=False`, `BackupAndRestore(DIR/backup,
save_freq=5)` and a `LearningRateScaler` (linear, 4 warmup epochs).

- MODE `kill`: the last rank SIGKILLs itself in epoch 2 (index 1), at the
  first step end from step 5 on that finds rank 0's backup of epoch 2,
  step >= 5 on disk (the job ends non-zero; the test reads the backup).
- MODE `resume`: the same script run normally (at any size). Before `fit`
  every rank reads the datasets of the backup's weights file; at the first
  step it runs, it saves the model (weights and optimizer state, as
  restored and synced) and compares.

Prints one JSON line per rank after `fit`: the epochs run, the first step
run, whether the state at that step equals the backup, the learning rate
of that step, the optimizer's
iterations, the history.
"""

import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    backup_position,
    binary_data,
    dense_bn_model,
    emit,
    fit_in_order,
    h5_datasets,
)

import keras_mpfp16 as kmp  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
rank, n = kmp.rank(), kmp.size()
EPOCHS, BATCH, ROWS, FREQ, WARMUP = 3, 4, 240, 5, 4
KILL_FROM = (1, 5)  # (epoch index, batch): see Steps.on_train_batch_end
LAST_KILL_STEP = 15

rng = np.random.default_rng(11)
x, y = binary_data(rng, ROWS)
backup_dir = os.path.join(out_dir, "backup")


# Ranks seeded differently: rank 0's model wins.
model = dense_bn_model(100 + rank, keras.optimizers.Adam(0.01))

saved = None
if mode == "resume":
    saved = h5_datasets(os.path.join(backup_dir, "latest.weights.h5"))


class Steps(keras.callbacks.Callback):
    epochs: list = []
    first_step = None
    restored_equal = None
    first_rate = None  # the rate LearningRateScaler gave the first step run
    at = (0, 0)

    def on_epoch_begin(self, epoch, logs=None):
        Steps.epochs.append(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        Steps.at = (Steps.epochs[-1], batch)
        if Steps.first_step is not None:
            return
        Steps.first_step = batch
        if saved is not None:
            path = os.path.join(out_dir, f"first-{rank}.weights.h5")
            self.model.save_weights(path)
            now = h5_datasets(path)
            Steps.restored_equal = sorted(now) == sorted(saved) and all(
                np.array_equal(now[k], saved[k]) for k in saved
            )

    def on_train_batch_end(self, batch, logs=None):
        if Steps.first_rate is None:
            Steps.first_rate = float(np.asarray(logs["learning_rate"]))
        if mode != "kill" or rank != n - 1 or Steps.at < KILL_FROM:
            return
        # Kill at the first step end of epoch 2 from step 5 on that finds a
        # backup of epoch 2, step >= 5 on disk. Until then, each step end
        # waits a little: rank 0 writes in the background and takes a
        # backup that fell due during a write at its next step end, so
        # under load slow writes still get done while the steps go on.
        # The epoch's last steps wait for one (rank 0 cannot reach the
        # epoch end meanwhile).
        last = Steps.at[1] >= LAST_KILL_STEP
        deadline = time.monotonic() + (120 if last else 0.5)
        while True:
            if backup_position(backup_dir) >= (1, 5):
                os.kill(os.getpid(), signal.SIGKILL)
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if last:
            raise RuntimeError(f"no backup of epoch 2, step >= 5 by {Steps.at}")


hist = fit_in_order(
    model,
    *kmp.shard(x, y),
    batch_size=BATCH,
    epochs=EPOCHS,
    callbacks=[
        Steps(),
        kmp.callbacks.LearningRateScaler(rule="linear", warmup_epochs=WARMUP),
        keras.callbacks.BackupAndRestore(backup_dir, save_freq=FREQ),
    ],
)
emit(
    {
        "rank": rank,
        "epochs_run": Steps.epochs,
        "first_step": Steps.first_step,
        "restored_equal": Steps.restored_equal,
        "first_rate": Steps.first_rate,
        "iterations": int(model.optimizer.iterations.numpy()),
        "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
    }
)
