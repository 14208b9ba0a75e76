"""Step-level backups (stock `BackupAndRestore(save_freq=5)`) written in the
background, a rank 0 killed in the middle of one, and the resume.

`mpirun -np N python step_backup.py DIR MODE`:

- MODE `full`: uninterrupted, 3 epochs of 20 steps, `delete_checkpoint=False`
  (so the last backup stays for the test to read); rank 0 also prints the
  digest of a fresh model loaded from the backup.
- MODE `killed`: the same script, but on rank 0 the background write of the
  backup due at epoch 2 (index 1), step 10 blocks after the weights file is
  written (a stand-in for a slow disk: the write is in progress, nothing
  renamed yet). Up to that backup, rank 0 starts each step a backup falls
  due at only once the previous backup's write thread has ended, so every
  due backup is taken at its own step, whatever the load (no deferral:
  the backups are at steps 5, 10, 15, 20 of epoch 1 and 5, 10 of epoch 2).
  Training goes on while the blocked write is in flight; at the end of
  step 13 rank 0 waits until the writer has reached the block (the weights
  file written, nothing renamed: the library's own event, no clock), prints
  a JSON line (the steps run after the blocked backup was taken) and
  SIGKILLs itself, mid-write.
- MODE `resume`: the same script run normally again (resumes from the
  backup the kill left).
- MODE `sigkill`: the last rank, on the first launch only (no
  `DIR/killed` marker yet), from epoch 2 step 13 on, at the first step end
  that finds a backup of epoch 2 step 10 or later on disk, writes the
  marker and SIGKILLs itself (it never waits for the backup, as in `slurm`
  mode; every rank sleeps 50 ms a step from epoch 2 step 6 on so the writes
  keep up); run under `python -m keras_mpfp16.runtime.launch
  --max-restarts 1`, the relaunch resumes from that backup.
- MODE `slurm`: under the restart recipe examples/slurm/train_restart.sbatch
  (tests/test_slurm.py). Launch 1 (no `DIR/killed`): the last rank, from
  epoch 2 step 13 on, at the first step end that finds a backup of epoch 2
  step 10 or later on disk, writes the marker and SIGKILLs itself (it never
  waits for the backup: a due backup can be taken a few steps late under
  load, at a step end rank 0 would not reach while this rank waited; every
  rank sleeps 50 ms a step from epoch 2 step 6 on, so the writes keep up).
  Launch 2 (no `DIR/preempted`): the last rank, at epoch 3 step 8 (or its
  first step, if later), writes `DIR/preempted` and has Slurm send
  SIGTERM to every process of the job, batch shell included (`scancel --full --signal=TERM $SLURM_JOB_ID`: what a preemption or the
  time limit sends), then waits until the signal has reached it; every rank
  stops at one step (exit 75). Launch 3: to the end. Every rank prints a
  JSON line at its first step (`launch`, `start`: [epoch, step]) and, when
  preempted, one with the step it stopped at (`preempted`).

Prints one JSON line per rank after `fit`: the epochs run, the first step,
the history, a digest of every model and optimizer variable.
"""

import json
import os
import signal
import subprocess
import sys
import threading
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
    run_record,
)

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.internals import keras as keras_internals  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
rank, n = kmp.rank(), kmp.size()
EPOCHS, BATCH, STEPS, FREQ = 3, 4, 20, 5
BLOCKED = (1, 9)  # the backup due at the end of this (epoch, batch) blocks
KILL_AT = (1, 12)
WRITER = "keras_mpfp16-backup-write"  # the library's backup-write thread
PREEMPT_AT = (2, 7)  # `slurm` mode, launch 2
launch = 0
if mode == "slurm":
    launch = 1 if not os.path.exists(os.path.join(out_dir, "killed")) else 2
    if launch == 2 and os.path.exists(os.path.join(out_dir, "preempted")):
        launch = 3

rng = np.random.default_rng(11)
x, y = binary_data(rng, BATCH * STEPS * n)


# Ranks seeded differently: rank 0's model wins.
model = dense_bn_model(100 + rank, keras.optimizers.Adam(0.01))
if mode == "full" and rank == 0:
    os.makedirs(os.path.join(out_dir, "ref"), exist_ok=True)
in_write = threading.Event()

if mode == "killed" and rank == 0:
    real_snapshot = keras_internals.snapshot_weights
    real_write = keras_internals.write_weights_snapshot
    taken_at = {}  # id(snapshot) -> (epoch, batch) of the step that took it

    def snapshot(model):
        copy = real_snapshot(model)
        taken_at[id(copy)] = Steps.at
        return copy

    def slow_write(copy, path):
        real_write(copy, path)
        # The backup taken at BLOCKED (or, were one deferred after all, the
        # first one after it: the test checks which).
        if not Steps.blocked_at and taken_at.get(id(copy), (0, 0)) >= BLOCKED:
            Steps.blocked_at = list(taken_at[id(copy)])
            in_write.set()
            threading.Event().wait(600)  # "the disk": never finishes

    def join_backup_writes():
        """Returns when no backup write thread runs (its write swapped in)."""
        for thread in threading.enumerate():
            if thread.name == WRITER and thread is not threading.current_thread():
                thread.join(300)
                if thread.is_alive():
                    raise RuntimeError("a backup write did not end in 300 s")

    keras_internals.snapshot_weights = snapshot
    keras_internals.write_weights_snapshot = slow_write


class Steps(keras.callbacks.Callback):
    epochs: list = []
    first_step = None
    at = (0, 0)
    during_write: list = []
    blocked_at: list = []

    def on_epoch_begin(self, epoch, logs=None):
        Steps.epochs.append(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if Steps.first_step is None:
            Steps.first_step = batch
            if mode == "slurm":
                emit(
                    {"rank": rank, "launch": launch, "start": [Steps.epochs[-1], batch]}
                )
        Steps.at = (Steps.epochs[-1], batch)
        if (
            mode == "killed"
            and rank == 0
            and Steps.at <= BLOCKED
            and (batch + 1) % FREQ == 0
        ):
            # A backup falls due at this step's end: let the previous write
            # end first, so it is taken here and not deferred (one write at
            # a time). Rank 1 waits in the step's collective meanwhile.
            join_backup_writes()

    def on_train_batch_end(self, batch, logs=None):
        if mode == "sigkill":
            self.sigkill_fault()
        if mode == "slurm":
            self.slurm_faults()
        if mode == "full" and rank == 0:  # the state at every step, for the test
            ref = os.path.join(
                out_dir, "ref", f"{Steps.epochs[-1]}-{batch + 1}.weights.h5"
            )
            self.model.save_weights(ref)
        if mode != "killed" or rank != 0:
            return
        if Steps.at > BLOCKED:  # after the blocked backup was taken
            Steps.during_write.append(batch)
        if Steps.at >= KILL_AT:
            # The blocked backup was taken at BLOCKED's end (its step began
            # after the previous write ended); its write thread runs apart
            # from the steps, so waiting here holds nothing back. Wait until
            # it has reached the block: mid-write, weights file on disk.
            if not in_write.wait(300):
                raise RuntimeError("the blocked backup write never started")
            emit(
                {
                    "rank": 0,
                    "killing": True,
                    "steps": Steps.during_write,
                    "blocked_at": Steps.blocked_at,
                }
            )
            os.kill(os.getpid(), signal.SIGKILL)

    def sigkill_fault(self):
        # As in `slurm` mode: never wait for the backup at a step end (rank 0
        # takes a deferred snapshot only at a step end, which it would not
        # reach while this rank waited); slow the steps a little instead so
        # the writes keep up, and kill at the first step end from KILL_AT on
        # that finds the step-10 backup (or a later one) on disk.
        marker = os.path.join(out_dir, "killed")
        if os.path.exists(marker):
            return
        if Steps.at >= (1, 5):
            time.sleep(0.05)
        if rank == n - 1 and Steps.at >= KILL_AT and backup_on_disk((1, 10)):
            with open(marker, "w") as f:
                f.write("1")
            os.kill(os.getpid(), signal.SIGKILL)

    def slurm_faults(self):
        if launch == 1 and Steps.at >= (1, 5):
            time.sleep(0.05)
        if rank != n - 1:
            return
        if launch == 1 and Steps.at >= KILL_AT and backup_on_disk((1, 10)):
            with open(os.path.join(out_dir, "killed"), "w") as f:
                f.write("1")
            os.kill(os.getpid(), signal.SIGKILL)
        preempted = os.path.join(out_dir, "preempted")
        if launch == 2 and Steps.at >= PREEMPT_AT and not os.path.exists(preempted):
            from keras_mpfp16.runtime.supervision import preemption

            with open(preempted, "w") as f:
                f.write("1")
            job = os.environ["SLURM_JOB_ID"]
            # Not checked: scancel, a process of this job step, gets the
            # signal too (and dies of it, or of the SIGUSR1 it becomes).
            subprocess.run(["scancel", "--full", "--signal=TERM", job])
            deadline = time.monotonic() + 120
            while preemption.requested() is None and time.monotonic() < deadline:
                time.sleep(0.05)  # the signal handler runs in here
            if preemption.requested() is None:
                raise RuntimeError("scancel's SIGTERM did not arrive within 120 s")


def backup_on_disk(at_least):
    """Whether rank 0's newest backup on disk is at (epoch, steps done)
    `at_least` or later."""
    return backup_position(backup_dir) >= at_least


backup_dir = os.path.join(out_dir, "backup")
callbacks = [
    Steps(),
    keras.callbacks.BackupAndRestore(
        backup_dir, save_freq=FREQ, delete_checkpoint=(mode != "full")
    ),
]
try:
    hist = fit_in_order(
        model, *kmp.shard(x, y), batch_size=BATCH, epochs=EPOCHS, callbacks=callbacks
    )
except kmp.Preempted as exc:
    emit({"rank": rank, "launch": launch, "preempted": [exc.epoch, exc.steps_done]})
    raise
record = run_record(model, hist, Steps.epochs, first_step=Steps.first_step)
if mode == "full" and rank == 0:
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        at = json.load(f)["keras_mpfp16"]
    final = os.path.join(out_dir, "ref", f"{at['epoch']}-{at['steps_done']}.weights.h5")

    got = h5_datasets(os.path.join(backup_dir, "latest.weights.h5"))
    want = h5_datasets(final)
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        record["backup"] = {
            "datasets": len(want),
            "same_names": sorted(got) == sorted(want),
            "equal": all(np.array_equal(got[k], want[k]) for k in want if k in got),
            "metadata": json.load(f),
            "files": sorted(os.listdir(out_dir)),
        }
emit(record)
