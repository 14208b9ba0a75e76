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
  start of the epoch.
"""

from __future__ import annotations

import functools
import json
import os
import shutil

import keras

from keras_mpfp16 import runtime
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
        callback.callback, BOOKKEEPING_TYPES
    ):
        # root_only(ModelCheckpoint(...)): rank 0 still writes alone, and the
        # object's state is kept on every rank as for an unwrapped one.
        callback = callback.callback
    if isinstance(
        callback,
        (RootOnly, AtomicModelCheckpoint, SafeBackupAndRestore, BookkeepingOnly),
    ):
        return callback
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        return SafeBackupAndRestore(callback)
    if runtime.is_root():
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
        self.job = None  # the writer record stored with each backup (a dict)

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
        if runtime.is_root():
            self.recover()
            self.callback.on_train_begin(logs)

    def resume_point(self) -> dict | None:
        """Rank 0, after `on_train_begin`: `{"epoch", "steps_done", "metrics"}`
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

    def _write(self, hook, *args) -> None:
        recorder = trace.active()
        if recorder is None:
            self._write_backup(hook, *args)
            return
        with recorder.span("backup write", "checkpoint", {"path": self.backup_dir}):
            self._write_backup(hook, *args)

    def _write_backup(self, hook, *args) -> None:
        """Runs the Keras callback's hook with its files redirected to the
        staging directory; swaps the directory in if it wrote a backup."""
        weights, metadata = keras_internals.backup_paths(self.callback)
        staged = [
            os.path.join(self._new, os.path.basename(p)) for p in (weights, metadata)
        ]
        shutil.rmtree(self._new, ignore_errors=True)
        os.makedirs(self._new)
        keras_internals.set_backup_paths(self.callback, *staged)
        try:
            hook(*args)
        finally:
            keras_internals.set_backup_paths(self.callback, weights, metadata)
        if not all(os.path.exists(p) for p in staged):
            shutil.rmtree(self._new, ignore_errors=True)  # this hook saved nothing
            return
        self._record_resume_point(staged[1])
        for path in staged:
            fsync_file(path)
        fsync_dir(self._new)
        if os.path.isdir(self.backup_dir):
            os.replace(self.backup_dir, self._old)
        os.replace(self._new, self.backup_dir)
        shutil.rmtree(self._old, ignore_errors=True)
        fsync_dir(os.path.dirname(os.path.abspath(self.backup_dir)))

    def _record_resume_point(self, metadata_path: str) -> None:
        """Adds where training is (epoch, steps done in it, metric state) to
        the metadata Keras wrote; Keras reads only its own keys. "epoch" is
        set too: Keras's own count is wrong for a mid-epoch save in the
        first epoch after a restore."""
        with open(metadata_path) as f:
            metadata = json.load(f)
        metrics = self.metric_state() if self.metric_state is not None else []
        metadata["epoch"] = self._epoch
        metadata[_RESUME_KEY] = {
            "epoch": self._epoch,
            "steps_done": self._steps,
            "metrics": [float(v) for v in metrics] if self._steps else [],
        }
        if self.job is not None:
            metadata[_RESUME_KEY]["writer"] = self.job
        with open(metadata_path, "w") as f:
            json.dump(metadata, f)

    def write_now(self, epoch: int, steps_done: int) -> None:
        """Rank 0: writes a complete backup now (a preemption), resuming at
        step `steps_done` of `epoch` (0: at the start of `epoch`)."""
        self._epoch, self._steps = int(epoch), int(steps_done)

        def save():
            weights, metadata = keras_internals.backup_paths(self.callback)
            self.model.save_weights(weights, overwrite=True)
            with open(metadata, "w") as f:
                json.dump({"epoch": self._epoch, "batch": max(self._steps - 1, 0)}, f)

        self._write(save)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._steps = epoch, 0

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._steps = epoch + 1, 0
        if runtime.is_root():
            self._write(self.callback.on_epoch_end, epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        if not runtime.is_root():
            return
        if self.callback.save_freq == "epoch":  # counts nothing, writes nothing
            return
        self._write(self.callback.on_train_batch_end, batch, logs)

    def on_train_end(self, logs=None):
        if runtime.is_root():
            self.callback.on_train_end(logs)
