"""A stock Keras script with a step-level backup, for the lost-node restart
test and benchmark on the emulated cluster.

  python cluster_restart.py DIR

3 epochs of a small LSTM over 480 rows dealt by `kmp.shard` (4 rows per rank
per step: 40 steps per epoch at 3 ranks, 60 at 2), `shuffle=False`, with
`keras.callbacks.BackupAndRestore(DIR/backup, save_freq=10)`.

On the first launch (no `DIR/reached` yet) at 3 ranks, rank 0 at the first
step end from step 35 of epoch 2 (index 1) on that finds the backup due at
step 30 of that epoch on disk, writes `DIR/reached` (the test then cuts a
node's link) and sleeps 3 s, so that the cut lands mid-epoch with the others
waiting in the next step's allreduce.

Rank 0 of each launch writes `DIR/launch-K.jsonl` (K = 1, 2, ... in launch
order), one JSON line per event, wall-clock times (`time.time()`):
`{"event": "start", "t", "n", "rows", "epochs", "batch_per_rank",
"save_freq"}` when the script starts (before importing Keras), `{"event": "ready", "t"}` after the imports and `kmp` setup,
`{"event": "begin", "t", "epoch", "batch"}` at the first batch start (after
the backup is restored and the ranks synchronised), and one
`{"event": "step", "t", "epoch", "batch", "samples"}` per step end, with
the step's global samples (every rank's rows of the step), and on the
first launch `{"event": "reached", "t", "epoch", "batch", "backup_steps"}`
before the cut (the steps done in the epoch of the backup then on disk).
Every rank also
writes the empty files `DIR/boot-HOST-PID` at its first line and
`DIR/init-HOST-PID` once `kmp.rank()` has initialised MPI and the library's
services (start-up markers for the tests that cut a node then). After `fit`
every rank prints a JSON line with the final weights' digest.
"""

import os
import socket
import sys
import time

START = time.time()


def mark(phase):
    """An empty file DIR/PHASE-HOST-PID: start-up markers for the tests that
    cut a node at a given point of start-up (every rank writes them)."""
    name = f"{phase}-{socket.gethostname()}-{os.getpid()}"
    open(os.path.join(sys.argv[1], name), "w").close()


mark("boot")  # before importing Keras, TensorFlow, mpi4py (before MPI_Init)

import hashlib  # noqa: E402
import json  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import fit_in_order  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out = sys.argv[1]
rank, n = kmp.rank(), kmp.size()
mark("init")  # MPI and the library's services (heartbeats) started
ROWS, BATCH, EPOCHS, FREQ = 480, 4, 3, 10
CUT_EPOCH, CUT_AT, BACKUP_AT = 1, 35, 30  # steps done in the epoch
backup_dir = os.path.join(out, "backup")

log = None
if rank == 0:
    k = 1
    while True:  # the first unused launch number
        try:
            fd = os.open(
                os.path.join(out, f"launch-{k}.jsonl"),
                os.O_CREAT | os.O_EXCL | os.O_WRONLY,
            )
            break
        except FileExistsError:
            k += 1
    log = os.fdopen(fd, "w", buffering=1)


def record(event, **fields):
    if log is not None:
        log.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


if log is not None:
    log.write(
        json.dumps(
            {
                "event": "start",
                "t": START,
                "n": n,
                "rows": ROWS,
                "epochs": EPOCHS,
                "batch_per_rank": BATCH,
                "save_freq": FREQ,
            }
        )
        + "\n"
    )

rng = np.random.default_rng(3)
x = rng.normal(size=(ROWS, 6, 3)).astype("float32")
y = (x[:, 0, 0] - x[:, 2, 1] > 0).astype("float32")[:, None]
xs, ys = kmp.shard(x, y)
per_rank = len(xs)

keras.utils.set_random_seed(5)
model = keras.Sequential(
    [
        keras.Input((6, 3)),
        keras.layers.LSTM(8),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(
    optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(0.01)),
    loss="binary_crossentropy",
)
record("ready")


def backed_up(epoch, steps_done):
    """The steps done in `epoch` of the backup on disk when it is of `epoch`
    and at least `steps_done` steps in, else None."""
    try:
        with open(os.path.join(backup_dir, "training_metadata.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    done = meta.get("batch", -1) + 1
    return done if meta.get("epoch") == epoch and done >= steps_done else None


class Timeline(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if not getattr(self, "began", False):
            self.began = True
            record("begin", epoch=self.epoch, batch=batch)

    def on_train_batch_end(self, batch, logs=None):
        rows = min(BATCH, per_rank - batch * BATCH)
        record("step", epoch=self.epoch, batch=batch, samples=rows * n)
        if not (
            rank == 0
            and n == 3
            and self.epoch == CUT_EPOCH
            and batch + 1 >= CUT_AT
            and not os.path.exists(os.path.join(out, "reached"))
        ):
            return
        # The backup due at step 30 is written in the background, and taken
        # late if the previous write still ran (a loaded machine): cut at the
        # first step end from step 35 on that finds it on disk (at the
        # epoch's last step, wait for it).
        last = batch + 1 == per_rank // BATCH
        deadline = time.monotonic() + (120 if last else 0)
        while (backup_steps := backed_up(CUT_EPOCH, BACKUP_AT)) is None:
            if time.monotonic() >= deadline:
                if last:
                    raise RuntimeError("no backup from step 30 on reached the disk")
                return
            time.sleep(0.05)
        record("reached", epoch=self.epoch, batch=batch, backup_steps=backup_steps)
        with open(os.path.join(out, "reached"), "w") as f:
            f.write(str(time.time()))
        # The others now wait in the next step's allreduce; the test cuts
        # the link meanwhile.
        time.sleep(3)


fit_in_order(
    model,
    xs,
    ys,
    batch_size=BATCH,
    epochs=EPOCHS,
    callbacks=[
        Timeline(),
        keras.callbacks.BackupAndRestore(backup_dir, save_freq=FREQ),
    ],
)
digest = hashlib.sha256(
    b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
).hexdigest()
record("end")
print(json.dumps({"rank": rank, "n": n, "digest": digest}), flush=True)
