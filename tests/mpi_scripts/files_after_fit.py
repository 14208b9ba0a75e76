"""Files complete when `fit` returns, and callbacks that differ between ranks.

`mpirun -np N python files_after_fit.py OUT_DIR` (issue 38, items 1 and 5).
Rank 0's file writes are slowed down (every fsync before a rename sleeps
`DELAY` s on rank 0, the checkpoints' and the backups' alike) so that a rank
leaving `fit` before rank 0 has renamed its last file in place sees the
previous file. Ranks are seeded differently (rank 0's model wins).

Parts, in one launch, each printing into this rank's one JSON line:

- `files`: three `fit`s in a row with `ModelCheckpoint(save_best_only=True)`,
  `CSVLogger`, `BackupAndRestore(delete_checkpoint=False)`: (1) on every
  rank, (2) Horovod's habit - appended on rank 0 only, with `TensorBoard`
  and a `Timeline` - and (3) wrapped in `kmp.callbacks.root_only`. Right
  after each `fit` every rank loads the checkpoint (`load_model`) and
  reads the CSV log and the backup's metadata; after a barrier it reads
  them again: both readings must agree.
- `evaluate`: a callback in `root_only` writes a file at the end of a
  collective `evaluate` (slowly): every rank finds it right after.
- `resume`: (2)'s rank-0-only `BackupAndRestore` again with more epochs:
  every rank resumes at rank 0's epoch.
- `errors`: differences that cannot be reconciled (and `OVERLAP` set on the
  last rank only) - `EarlyStopping` on
  rank 0 only, `ReduceLROnPlateau` in `root_only`, a `ModelCheckpoint` on
  the last rank only, a `Timeline` on the last rank only: each `fit` raises
  the same error on every rank (caught here), and the job goes on.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import binary_data, dense_bn_model, digest, emit, fit_in_order  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.runtime.supervision import atomic_files  # noqa: E402
from keras_mpfp16.training import files as training_files  # noqa: E402

out_dir = sys.argv[1]
rank, n = kmp.rank(), kmp.size()
EPOCHS, BATCH, STEPS = 3, 8, 6
DELAY = float(os.environ.get("FILES_TEST_DELAY", "0.8"))


def slow(fsync):
    def fsync_slowly(path):
        time.sleep(DELAY)  # rank 0 still writing while the others go on
        fsync(path)

    return fsync_slowly


if rank == 0:
    atomic_files.fsync_file = slow(atomic_files.fsync_file)  # model.save
    training_files.fsync_file = slow(training_files.fsync_file)  # backups

rng = np.random.default_rng(5)
x, y = binary_data(rng, BATCH * STEPS * n, label=lambda x: x[:, 0] + 0.5 * x[:, 2])
xs, ys = kmp.shard(x, y)

model = dense_bn_model(300 + rank, keras.optimizers.SGD(0.05))


class Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def read_files(ckpt, csv, backup):
    """What this rank sees on disk now."""
    loaded = keras.models.load_model(ckpt)
    with open(csv) as f:
        lines = f.read().count("\n")
    with open(os.path.join(backup, "training_metadata.json")) as f:
        meta = json.load(f)
    return {
        "checkpoint": digest(loaded.weights),
        "csv_lines": lines,
        "backup_epoch": meta["epoch"],
    }


def writers(i):
    ckpt = os.path.join(out_dir, f"best-{i}.keras")
    csv = os.path.join(out_dir, f"log-{i}.csv")
    backup = os.path.join(out_dir, f"backup-{i}")
    made = [
        keras.callbacks.ModelCheckpoint(ckpt, monitor="loss", save_best_only=True),
        keras.callbacks.CSVLogger(csv),
        keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False),
    ]
    return (ckpt, csv, backup), made


record = {"rank": rank, "files": [], "errors": {}}

# -- files -----------------------------------------------------------------------
for i, how in enumerate(("every rank", "rank 0 only", "root_only")):
    paths, made = writers(i)
    epochs = Epochs()
    callbacks = [epochs]
    if how == "every rank":
        callbacks += made
    elif how == "rank 0 only":  # Horovod's habit
        if rank == 0:
            callbacks += made
            callbacks.append(keras.callbacks.TensorBoard(os.path.join(out_dir, "tb")))
            callbacks.append(
                kmp.callbacks.Timeline(os.path.join(out_dir, "trace.json"))
            )
    else:
        callbacks += [kmp.callbacks.root_only(cb) for cb in made]
    fit_in_order(model, xs, ys, batch_size=BATCH, epochs=EPOCHS, callbacks=callbacks)
    right_after = read_files(*paths)
    kmp.barrier()
    time.sleep(0.2)
    after_barrier = read_files(*paths)
    record["files"].append(
        {
            "how": how,
            "epochs": epochs.epochs,
            "right_after": right_after,
            "after_barrier": after_barrier,
            "model": digest(model.weights),
            "trace": os.path.exists(os.path.join(out_dir, "trace.json")),
        }
    )


# -- evaluate: a file rank 0 writes at its end (slowly) is there on every rank --
class EvaluationReport(keras.callbacks.Callback):
    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_test_end(self, logs=None):
        time.sleep(DELAY)
        with open(self.path + ".tmp", "w") as f:
            json.dump({k: float(v) for k, v in logs.items()}, f)
        os.replace(self.path + ".tmp", self.path)


report = os.path.join(out_dir, "evaluation.json")
model.evaluate(
    x, y, batch_size=BATCH, verbose=0,
    callbacks=[kmp.callbacks.root_only(EvaluationReport(report))],
)  # fmt: skip
record["evaluate_report"] = os.path.exists(report)

# -- resume: rank 0's BackupAndRestore decides the start epoch on every rank -------
(ckpt, csv, backup), _ = writers(1)
epochs = Epochs()
callbacks = [epochs]
if rank == 0:
    callbacks.append(keras.callbacks.BackupAndRestore(backup))
fit_in_order(
    model, xs, ys, batch_size=BATCH, epochs=EPOCHS + 2,
    callbacks=callbacks)  # fmt: skip
record["resume"] = {
    "epochs": epochs.epochs,
    "model": digest(model.weights),
    "backup_left": os.path.exists(backup),
}


# -- errors -----------------------------------------------------------------------
def fit_expecting_error(name, callbacks):
    try:
        model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks)
    except ValueError as exc:
        record["errors"][name] = f"{type(exc).__name__}: {exc}"
    else:
        record["errors"][name] = None


fit_expecting_error(
    "EarlyStopping", [keras.callbacks.EarlyStopping("loss")] if rank == 0 else []
)
fit_expecting_error(
    "ReduceLROnPlateau",
    [kmp.callbacks.root_only(keras.callbacks.ReduceLROnPlateau("loss"))],
)
fit_expecting_error(
    "ModelCheckpoint",
    [keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "last.keras"))]
    if rank == n - 1
    else [],
)
fit_expecting_error(
    "Timeline",
    [kmp.callbacks.Timeline(os.path.join(out_dir, "t2.json"))] if rank == n - 1 else [],
)
# A setting that decides the step's collectives, on the last rank only (as
# when a launcher does not pass the variable to another node): SettingsDiffer
# on every rank, not a hang in mismatched collectives.
if rank == n - 1:
    kmp.config.set("overlap", True)
fit_expecting_error("KERAS_MPFP16_OVERLAP", [])
kmp.config.reset("overlap")
# The job goes on as one model.
model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
record["final"] = digest(model.weights)
emit(record)
