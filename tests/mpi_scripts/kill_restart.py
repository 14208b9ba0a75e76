"""Kill and restart with stock BackupAndRestore + ModelCheckpoint on every rank.

`mpirun -np N python kill_restart.py DIR MODE`, MODE one of

- `full`: the uninterrupted run (its own backup directory);
- `killed`: rank 0 is SIGKILLed in the middle of writing the epoch-3
  checkpoint (after the temporary file is complete, before the rename), so
  the job dies with epoch 2's backup in place;
- `resume`: the same script started again: BackupAndRestore restores on
  rank 0, every rank resumes from the same epoch.

Ranks are seeded differently (rank 0's model wins). Prints one JSON line per
rank: the epochs run, their logs, a digest of every model and optimizer
variable, and what is on disk.
"""

import os
import signal
import sys

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
from keras_mpfp16.runtime.supervision import (  # noqa: E402
    atomic_files as checkpoint_module,
)

out_dir, mode = sys.argv[1], sys.argv[2]
rank, n = kmp.rank(), kmp.size()
EPOCHS = 4
run_dir = os.path.join(out_dir, "full" if mode == "full" else "run")
os.makedirs(run_dir, exist_ok=True)

rng = np.random.default_rng(5)
x, y = binary_data(rng, 24 * n + 3)
xv, yv = binary_data(rng, 19)

model = dense_bn_model(77 + rank, keras.optimizers.Adam(0.02))


class Epochs(keras.callbacks.Callback):
    seen: list = []
    current = -1

    def on_epoch_begin(self, epoch, logs=None):
        Epochs.current = epoch
        Epochs.seen.append(epoch)


if mode == "killed" and rank == 0:
    real_fsync = checkpoint_module.fsync_file

    def fsync_then_die(path):
        real_fsync(path)
        if path.endswith(".keras") and Epochs.current == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-write: temp done, no rename

    checkpoint_module.fsync_file = fsync_then_die

ckpt = os.path.join(run_dir, "last.keras")
hist = fit_in_order(
    model,
    *kmp.shard(x, y),
    batch_size=8,
    epochs=EPOCHS,
    validation_data=(xv, yv),
    callbacks=[
        Epochs(),
        keras.callbacks.ModelCheckpoint(ckpt),
        keras.callbacks.BackupAndRestore(os.path.join(run_dir, "backup")),
    ],
)
emit(run_record(model, hist, Epochs.seen))
