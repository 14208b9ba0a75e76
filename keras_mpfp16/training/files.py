"""Stock file-writing callbacks made safe under mpirun, as users write them.

N ranks running Keras's `ModelCheckpoint`, `BackupAndRestore`, `CSVLogger`
or `TensorBoard` write the same files at the same time: HDF5 lock errors,
corrupt zip files, `FileExistsError`, interleaved CSV lines. In `fit` of a
model compiled with a `DistributedOptimizer` (more than one process):

- `ModelCheckpoint` and `CSVLogger` (and subclasses) write on rank 0 only.
  On the other ranks the user's object still runs every hook with the same
  (global) logs, with its writes switched off (`BookkeepingOnly`), so its
  state - `ModelCheckpoint.best`, `CSVLogger.keys`, ... - is rank 0's on
  every rank and code reading it after `fit` takes the same branch
  everywhere. `TensorBoard` and `RemoteMonitor` run on rank 0 only; on the
  other ranks a stand-in only forwards `set_model`/`set_params` (their
  public attributes are their arguments, which `fit` does not change; their
  counters and writers are private). All ranks hold the same model and,
  with global logs, the same logs, so rank 0's files are the job's.
- `model.save` and `model.save_weights` write atomically on every rank of
  a multi-process job, inside and outside `fit` (`wrap_save`, installed on
  `keras.Model` at import): to a temporary file in the same directory,
  fsync'ed, then renamed over the target. A process killed mid-write leaves
  the previous complete file; ranks saving the same path at once each
  replace it whole.
- `BackupAndRestore` writes on rank 0 only, and its weights and metadata
  files replace the previous backup *together* (`SafeBackupAndRestore`): a
  backup directory is written next to the real one and swapped in by
  renames; a restart recovers whichever complete backup a crash left. Only
  rank 0 restores; the other ranks receive rank 0's weights, optimizer state
  and starting epoch before the first step (`sync.replica`), so the
  restart resumes on every rank from the same epoch, also with a backup
  directory only rank 0 can see.
- Every backup it writes also records the step reached in the epoch and
  the epoch's metric state (key `"keras_mpfp16"` of Keras's metadata file),
  so a backup written in the middle of an epoch (`save_freq=<int>`, or at
  a preemption, see `training.preemption`) resumes at that step, not at the
  start of the epoch; and the number of ranks, steps per epoch and per-rank
  batch size, so a job relaunched on another number of ranks resumes at the
  same part of the epoch (`training.preemption.step_at_new_size`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading

import keras

from keras_mpfp16.callbacks.checkpoint import AtomicModelCheckpoint
from keras_mpfp16.callbacks.root_only import RootOnly
from keras_mpfp16.callbacks.wrapper import CallbackWrapper
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.optimizer import DistributedOptimizer
from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.supervision.atomic_files import (
    atomic_write,
    fsync_dir,
    fsync_file,
    in_atomic_write,
)

# Callbacks whose only effect is writing files (or sending logs out): one
# writer per job. The first two keep state users read after fit: on ranks
# other than 0 they run without writing; the others are stood in for.
BOOKKEEPING_TYPES = (keras.callbacks.ModelCheckpoint, keras.callbacks.CSVLogger)
ROOT_ONLY_TYPES = (
    *BOOKKEEPING_TYPES,
    keras.callbacks.TensorBoard,
    keras.callbacks.RemoteMonitor,
)


def make_safe(callback: keras.callbacks.Callback) -> keras.callbacks.Callback:
    """The callback to run in its place on this rank (often itself)."""
    if isinstance(callback, RootOnly) and isinstance(
        callback.callback, (*BOOKKEEPING_TYPES, keras.callbacks.BackupAndRestore)
    ):
        # root_only(ModelCheckpoint(...)): rank 0 still writes alone, and the
        # object's state is kept on every rank as for an unwrapped one;
        # root_only(BackupAndRestore(...)): as an unwrapped one (rank 0
        # restores and writes, the other ranks do nothing).
        callback = callback.callback
    if isinstance(
        callback,
        (RootOnly, AtomicModelCheckpoint, SafeBackupAndRestore, BookkeepingOnly),
    ):
        return callback
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        return SafeBackupAndRestore(callback)
    if world.is_root():
        return callback
    if isinstance(callback, BOOKKEEPING_TYPES):
        return BookkeepingOnly(callback)
    if isinstance(callback, ROOT_ONLY_TYPES):
        return RootOnly(callback)
    return callback


_HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_test_begin",
    "on_test_end",
    "on_predict_begin",
    "on_predict_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
)


class BookkeepingOnly(CallbackWrapper):
    """Runs a `ModelCheckpoint` or `CSVLogger` on a rank other than 0,
    writing nothing.

    Every hook of the user's object runs, with the logs rank 0 sees (logs
    are global), so its state after `fit` is rank 0's: `best` and the save
    counters of a `ModelCheckpoint` (Keras's own save decision runs, the
    save and the directory creation do not), the `keys` and `append_header`
    of a `CSVLogger` (its rows go to `os.devnull`). Keras's asynchronous
    batch-hook dispatch is allowed exactly when the user's callback allows it,
    as on rank 0.

    Args:
        callback: The user's `ModelCheckpoint` or `CSVLogger`.
    """

    def __init__(self, callback: keras.callbacks.Callback):
        super().__init__(callback)
        self.async_safe = bool(getattr(callback, "async_safe", False))

    def _run(self, name: str, args: tuple, kwargs: dict) -> None:
        hook = getattr(self.callback, name)
        if isinstance(self.callback, keras.callbacks.ModelCheckpoint):
            with keras_internals.checkpoint_bookkeeping_only(self.callback):
                hook(*args, **kwargs)
        elif name == "on_train_begin":  # CSVLogger: opens its file here
            _csv_logger_begin(self.callback, lambda: hook(*args, **kwargs))
        else:
            hook(*args, **kwargs)


def _forward(name: str):
    def hook(self, *args, **kwargs):
        self._run(name, args, kwargs)

    hook.__name__ = name
    return hook


for _name in _HOOKS:
    setattr(BookkeepingOnly, _name, _forward(_name))


def _csv_logger_begin(logger: keras.callbacks.CSVLogger, begin) -> None:
    """`CSVLogger.on_train_begin` writing to `os.devnull`; `append_header` as
    rank 0 computes it from the real file (read only: rank 0 writes nothing
    before the first epoch ends, after the ranks' sync)."""
    filename = logger.filename
    append_header = True
    if logger.append and os.path.exists(filename):
        with open(filename) as f:
            append_header = not bool(len(f.readline()))
    logger.filename = os.devnull
    try:
        begin()
    finally:
        logger.filename = filename
    logger.append_header = append_header


def wrap_save(original):
    """`keras.Model.save` / `save_weights`, atomic on every rank under mpirun.

    For a model compiled with a `DistributedOptimizer` in a job of more than
    one process (`world.launched_size()`: no MPI call, so a lone call
    inside `if kmp.is_root():` - or on any one rank - never waits for
    anyone), each call writes a temporary file of its own in the target's
    directory (`temporary_path`: process id and rank in the name), fsyncs
    it and renames it over the target (`atomic_write`). N ranks saving the
    same path at once (a script without `if kmp.is_root():`) then each
    replace the file whole with their own complete copy of the same model:
    no HDF5 lock error, no torn file, and a rank that loads the file after
    its own save reads a complete one. Inside `fit` the stock checkpoint
    callbacks write from rank 0 only; their saves go through here too.
    Passed through unchanged: other models, one process, file objects,
    `overwrite=False`, `zipped=False` (a directory) and saves made inside
    an atomic write (the temporary file itself).
    """

    @functools.wraps(original)
    def save(self, filepath, *args, **kwargs):
        overwrite = args[0] if args else kwargs.get("overwrite", True)
        if (
            not isinstance(getattr(self, "optimizer", None), DistributedOptimizer)
            or world.launched_size() == 1
            or not isinstance(filepath, (str, os.PathLike))
            or overwrite is False
            or kwargs.get("zipped") is False
            or in_atomic_write()
        ):
            return original(self, filepath, *args, **kwargs)
        atomic_write(filepath, lambda path: original(self, path, *args, **kwargs))

    save._keras_mpfp16_hook = True  # model_hooks.MARK: patched by us
    return save


_RESUME_KEY = "keras_mpfp16"


class SafeBackupAndRestore(CallbackWrapper):
    """Runs a `keras.callbacks.BackupAndRestore` safely on many ranks.

    Rank 0 restores and writes; other ranks do nothing (they receive rank 0's
    state before the first step). Each backup is written into
    `<backup_dir>.kmp-new/`, fsync'ed, and swapped in for `<backup_dir>/` by
    two renames (the old one kept as `<backup_dir>.kmp-old/` until the new
    one is in place), so the weights and the epoch always come from the same
    backup. On restart, rank 0 first recovers a consistent `<backup_dir>/`
    from whatever a crash left. The layout inside the directory is Keras's,
    so a plain one-process `BackupAndRestore` can read it.

    The backups Keras would write at a step (`save_freq=<int>`) or an epoch
    end (`save_freq="epoch"`) do not stall training: in the step, the model's
    and optimizer's variables are copied to host memory (a few ms); a
    background thread writes the copy, fsyncs it and swaps it in. One write
    at a time: a step-level backup that falls due while the previous write
    is still running is taken at the first step end after that write
    finished (the step never waits); an epoch-end backup, a preemption's
    backup and the end of `fit` wait for the write in flight. A write that
    fails raises on rank 0 at the next hook (so the job ends with it).

    `double_checkpoint` is not needed (and not used): the previous backup is
    never half-replaced.

    Args:
        callback: The user's `BackupAndRestore`.
    """

    def __init__(self, callback: keras.callbacks.BackupAndRestore):
        super().__init__(callback)
        self.backup_dir = os.fspath(callback.backup_dir)
        self._new = self.backup_dir.rstrip("/") + ".kmp-new"
        self._old = self.backup_dir.rstrip("/") + ".kmp-old"
        # Where training is, for the resume record of each backup.
        self._epoch = 0
        self._steps = 0
        self.metric_state = None  # callable: the metric state as floats
        self._writes = BackgroundWrite(self.backup_dir)
        # Keras's own count of batches since the last save (save_freq=<int>).
        self._last_batch = 0
        self._since_save = 0
        self._deferred = False
        self.backups_written = 0  # complete backups swapped in (this object)
        self.backups_deferred = 0  # step-level backups taken late (a write ran)
        self.job = None  # the writer record stored with each backup (a dict)
        # The job's layout when it writes: {"ranks", "steps_per_epoch",
        # "batch_size"} (set by `training.preemption.Preemption`), for a
        # resume at another number of ranks.
        self.layout: dict = {}

    # -- restore -------------------------------------------------------------

    def recover(self) -> None:
        """Leaves `backup_dir` as the newest complete backup a crash left."""
        if os.path.isdir(self._old):
            if not os.path.isdir(self.backup_dir):
                # Crashed between the two renames: the new backup was
                # complete (written and fsync'ed before the first rename).
                source = self._new if os.path.isdir(self._new) else self._old
                os.replace(source, self.backup_dir)
            shutil.rmtree(self._old, ignore_errors=True)
        # A new backup still being written when the job died: incomplete.
        shutil.rmtree(self._new, ignore_errors=True)

    def on_train_begin(self, logs=None):
        self._last_batch, self._since_save, self._deferred = 0, 0, False
        if world.is_root():
            self._writes.wait()
            self.recover()
            self.callback.on_train_begin(logs)

    def resume_point(self) -> dict | None:
        """Rank 0, after `on_train_begin`: `{"epoch", "steps_done", "metrics"}`
        (and `"ranks"`, `"steps_per_epoch"`, `"batch_size"` where recorded)
        of the backup restored, when it was written by this class (None for
        no backup, or one Keras wrote alone: resume at its epoch)."""
        _, metadata = keras_internals.backup_paths(self.callback)
        try:
            with open(metadata) as f:
                record = json.load(f).get(_RESUME_KEY)
        except (OSError, ValueError, AttributeError):
            return None
        return record if isinstance(record, dict) else None

    # -- backup ----------------------------------------------------------------

    def _staged_paths(self) -> list[str]:
        return [
            os.path.join(self._new, os.path.basename(p))
            for p in keras_internals.backup_paths(self.callback)
        ]

    def _swap_in(self) -> None:
        """fsyncs the staged backup and renames it over the previous one."""
        for path in self._staged_paths():
            fsync_file(path)
        fsync_dir(self._new)
        if os.path.isdir(self.backup_dir):
            os.replace(self.backup_dir, self._old)
        os.replace(self._new, self.backup_dir)
        shutil.rmtree(self._old, ignore_errors=True)
        fsync_dir(os.path.dirname(os.path.abspath(self.backup_dir)))
        self.backups_written += 1

    def _resume_record(self) -> dict:
        """Where training is (epoch, steps done in it, metric state), added
        to the metadata Keras writes; Keras reads only its own keys. "epoch"
        is set too: Keras's own count is wrong for a mid-epoch save in the
        first epoch after a restore."""
        metrics = self.metric_state() if self.metric_state is not None else []
        record = {
            "epoch": self._epoch,
            "steps_done": self._steps,
            "metrics": [float(v) for v in metrics] if self._steps else [],
            **self.layout,
        }
        if self.job is not None:
            record["writer"] = self.job
        return {
            "epoch": self._epoch,
            "batch": max(self._steps - 1, 0),
            _RESUME_KEY: record,
        }

    def _back_up_in_background(self) -> None:
        """Rank 0, in the step: copies the state to host memory and starts
        its write (the previous write has finished)."""
        recorder = trace.active()
        if recorder is None:
            weights = keras_internals.snapshot_weights(self.model)
        else:
            with recorder.span(
                "backup snapshot", "checkpoint", {"path": self.backup_dir}
            ):
                weights = keras_internals.snapshot_weights(self.model)
        metadata = self._resume_record()
        self._writes.start(lambda: self._write_files(weights, metadata))

    def _write_files(self, weights: list, metadata: dict) -> None:
        """The background half: the staged files, fsync'ed and swapped in."""
        staged_weights, staged_metadata = self._staged_paths()
        shutil.rmtree(self._new, ignore_errors=True)
        os.makedirs(self._new)
        keras_internals.write_weights_snapshot(weights, staged_weights)
        with open(staged_metadata, "w") as f:
            json.dump(metadata, f)
        self._swap_in()

    def write_now(self, epoch: int, steps_done: int) -> None:
        """Rank 0: writes a complete backup now (a preemption), resuming at
        step `steps_done` of `epoch` (0: at the start of `epoch`); returns
        when it is on disk."""
        self._writes.wait()
        self._epoch, self._steps = int(epoch), int(steps_done)
        recorder = trace.active()
        if recorder is None:
            self._write_now()
            return
        with recorder.span("backup write", "checkpoint", {"path": self.backup_dir}):
            self._write_now()

    def _write_now(self) -> None:
        staged_weights, staged_metadata = self._staged_paths()
        shutil.rmtree(self._new, ignore_errors=True)
        os.makedirs(self._new)
        self.model.save_weights(staged_weights, overwrite=True)
        with open(staged_metadata, "w") as f:
            json.dump(self._resume_record(), f)
        self._swap_in()

    def _save_due(self, batch: int) -> bool:
        """Keras's own `save_freq=<int>` count (steps_per_execution aware)."""
        if batch <= self._last_batch:  # a new epoch
            added = batch + 1
        else:
            added = batch - self._last_batch
        self._since_save += added
        self._last_batch = batch
        if self._since_save >= self.callback.save_freq:
            self._since_save = 0
            return True
        return False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._steps = epoch, 0

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._steps = epoch + 1, 0
        self._last_batch = 0
        if world.is_root() and self.callback.save_freq == "epoch":
            self._writes.wait()
            self._back_up_in_background()

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        if not world.is_root():
            return
        self._writes.raise_failure()
        if self.callback.save_freq in ("epoch", False):  # counts nothing
            return
        if not (self._save_due(batch) or self._deferred):
            return
        if self._writes.busy():
            self._deferred = True
            self.backups_deferred += 1
            return
        self._deferred = False
        self._back_up_in_background()

    def on_train_end(self, logs=None):
        if world.is_root():
            self._writes.wait()
            self.callback.on_train_end(logs)


class BackgroundWrite:
    """At most one backup write at a time, in a thread of its own.

    The thread only writes files (no MPI, no Keras object): `start(fn)` runs
    `fn` in it; `wait()` joins it and raises what it raised. A daemon thread:
    a process that ends mid-write leaves the previous backup (the write goes
    to a staging directory, renamed in only when complete).

    Args:
        backup_dir: Named in the error of a failed write.
    """

    def __init__(self, backup_dir: str):
        self.backup_dir = backup_dir
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def busy(self) -> bool:
        """Whether a write is still running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, fn) -> None:
        """Runs `fn()` in a new thread (the previous write must be done)."""
        if self.busy():
            raise RuntimeError("a backup write is already running")
        self.raise_failure()

        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - raised by wait()
                self._failure = exc

        self._thread = threading.Thread(
            target=run, name="keras_mpfp16-backup-write", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Returns when no write is running; raises a failed write's error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.raise_failure()

    def raise_failure(self) -> None:
        """Raises the error of a write that failed (once)."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(
                f"keras_mpfp16: writing the backup into {self.backup_dir!r} "
                f"failed: {type(failure).__name__}: {failure}"
            ) from failure
