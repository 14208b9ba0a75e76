"""A preempted multi-process `fit` stops at one step, backed up, and resumes there.

While a multi-process `fit` of a `DistributedOptimizer` model runs, SIGTERM
and SIGUSR1 are recorded (`runtime.preemption`) and the record travels in
the next step's metric reduction, so every rank learns in the same step that
some rank was signalled. At the end of that step (or of the epoch, when the
signal came during validation) `Preemption`:

1. has rank 0 write a complete backup: into the directory of the user's
   `keras.callbacks.BackupAndRestore` when `fit` has one, else into the
   library's own (`KERAS_MPFP16_PREEMPTION_DIR`, default
   `./keras_mpfp16_preemption`, one `fit-<n>` directory per collective `fit`
   of the process); the backup records the step reached in the epoch and
   the epoch's metric state;
2. waits until the backup is on disk (a barrier), then raises
   `Preempted` (a `SystemExit` with status `PREEMPTED_EXIT_CODE`, 75) on
   every rank. `on_train_end` does not run, so the backup is kept.

Started again with the same script and arguments, `fit` restores rank 0
from the backup (the user's `BackupAndRestore` does, or the library's own
when its directory exists), every rank takes rank 0's state
(`sync.replica`), the epoch's metric state is restored and the steps
already trained are read from the input but not trained again. The result
is bitwise identical to an uninterrupted run when the batches of an epoch
do not depend on the process's history (`shuffle=False`, a `PyDataset`
whose order depends on the epoch only, a deterministic `tf.data`
pipeline). With `shuffle=True` the resumed epoch draws a new permutation,
as stock `BackupAndRestore` does at an epoch start. The library's own
backup is deleted when its `fit` ends normally.
"""

from __future__ import annotations

import os
import sys

import keras
import numpy as np

from keras_mpfp16 import runtime
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime.supervision import preemption
from keras_mpfp16.sync.metric_reduction import metric_variables
from keras_mpfp16.training.files import SafeBackupAndRestore

_fits = {"count": 0}  # collective fits started by this process


class OwnBackup(SafeBackupAndRestore):
    """The library's backup for a `fit` without `BackupAndRestore`: written
    only at a preemption, restored when its directory exists, deleted at the
    end of a `fit` that ends normally."""

    def on_train_begin(self, logs=None):
        if runtime.is_root() and (
            os.path.isdir(self.backup_dir)
            or os.path.isdir(self._old)
            or os.path.isdir(self._new)
        ):
            super().on_train_begin(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._steps = epoch + 1, 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1


def own_backup_dir() -> str:
    """A new `fit-<n>` directory name under the library's backup directory."""
    _fits["count"] += 1
    _, base = preemption.settings()
    return os.path.join(base, f"fit-{_fits['count']}")


def writer_for(callbacks: list) -> tuple[SafeBackupAndRestore | None, bool]:
    """The backup a preemption writes into: the user's (first) `BackupAndRestore`
    among the callbacks already made safe, or a new `OwnBackup` (True); None
    when there is none and preemption handling is off."""
    for cb in callbacks:
        if isinstance(cb, SafeBackupAndRestore):
            return cb, False
    if not preemption.settings()[0]:
        return None, False
    directory = own_backup_dir()
    return OwnBackup(keras.callbacks.BackupAndRestore(directory)), True


class Preemption(keras.callbacks.Callback):
    """Stops every rank at the agreed step with a backup; resumes mid-epoch.

    Listed after every other callback of the collective `fit`.

    Args:
        writer: The backup to write and resume from.
    """

    def __init__(self, writer: SafeBackupAndRestore):
        super().__init__()
        self.writer = writer
        self.front = ResumedMetrics()
        self._epoch = 0
        self._steps = 0
        self._resume: dict | None = None

    def set_model(self, model):
        super().set_model(model)
        # Looked up when a backup is written: Keras builds the compiled
        # metrics' variables in the first step.
        self.writer.metric_state = lambda: _flat_values(metric_variables(model))

    # -- resume ----------------------------------------------------------------

    def on_train_begin(self, logs=None):
        record = self.writer.resume_point() if runtime.is_root() else None
        record = runtime.broadcast(record)
        start = keras_internals.get_initial_epoch(self.model) or 0
        if record and int(record.get("steps_done", 0)) > 0:
            if int(record.get("epoch", -1)) == start:
                self._resume = record

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._steps = epoch, 0
        record, self._resume = self._resume, None
        if record is None:
            return
        steps = int(record["steps_done"])
        # The compiled metrics' variables exist only after the first step:
        # their saved state is added after it (`ResumedMetrics`).
        self.front.pending = record.get("metrics") or []
        keras_internals.skip_steps_of_next_epoch.arm(steps)
        self._steps = steps
        if runtime.is_root():
            sys.stderr.write(
                f"keras_mpfp16: resuming epoch {epoch + 1} at step {steps} "
                f"from the backup in {self.writer.backup_dir}\n"
            )

    # -- stop --------------------------------------------------------------------

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        if preemption.agreed():
            self._stop(self._epoch, self._steps)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._steps = epoch + 1, 0
        if preemption.agreed():
            self._stop(epoch + 1, 0)

    def _stop(self, epoch: int, steps: int) -> None:
        if runtime.is_root():
            self.writer.write_now(epoch, steps)
        runtime.barrier()  # every rank leaves once the backup is complete
        preemption.mark_exiting()
        exc = preemption.Preempted(
            preemption.requested(), epoch, steps, self.writer.backup_dir
        )
        if runtime.is_root():
            sys.stderr.write(
                f"keras_mpfp16: {exc} (epoch {epoch + 1} resumes at step {steps} "
                "when the job is started again)\n"
            )
            sys.stderr.flush()
        raise exc


class ResumedMetrics(keras.callbacks.Callback):
    """Adds a resumed epoch's saved metric state after its first step.

    Listed first, so every other callback sees the logs of that step with
    the whole epoch's state. The metric state is additive (the metric
    reduction's premise): the saved state plus the first step's is the
    state an uninterrupted run has, bit for bit (float addition commutes).
    """

    def __init__(self):
        super().__init__()
        self.pending: list | None = None

    def on_train_batch_end(self, batch, logs=None):
        values, self.pending = self.pending, None
        if not values:
            return
        variables = metric_variables(self.model)
        sizes = [int(np.prod(var.shape)) for var in variables]
        if sum(sizes) != len(values):
            return  # a different set of metrics: the epoch's logs restart
        offset = 0
        for var, size in zip(variables, sizes):
            saved = np.asarray(values[offset : offset + size], np.float64)
            saved = saved.reshape(var.shape).astype(var.dtype)
            var.assign(np.asarray(var) + saved)
            offset += size
        if isinstance(logs, dict):
            fresh = self.model.get_metrics_result()
            for key in logs:
                if key in fresh:
                    logs[key] = float(np.asarray(fresh[key]))


def _flat_values(variables) -> list[float]:
    return [
        float(v)
        for var in variables
        for v in np.asarray(var, dtype=np.float64).reshape(-1)
    ]
