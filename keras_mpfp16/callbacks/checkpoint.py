"""Checkpoints written by rank 0 only, atomically.

A checkpoint is first written to a temporary file in the same directory and
then renamed over the final name with `os.replace`, which is atomic on POSIX
file systems: a reader, or a job restarted after a crash, sees either the
previous complete checkpoint or the new complete one, never a half-written
file.
"""

from __future__ import annotations

import os
import threading

import keras

from keras_mpfp16 import runtime
from keras_mpfp16.callbacks.rank_output import launcher_rank
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime import timeline

# Keras's save functions dispatch on these endings, so temporary names keep them.
_SUFFIXES = (".weights.h5", ".keras", ".h5")


def temporary_path(filepath: str) -> str:
    """Name of the temporary file `filepath` is written to before the rename.

    Same directory (so the rename stays on one file system and is atomic),
    hidden, tagged with the process id (and, under an MPI launcher, the rank:
    processes on two hosts sharing a file system may have the same id), and
    ending with the same Keras suffix (`.keras`, `.h5`, `.weights.h5`) so
    Keras writes the same format.

    Example: `"ckpt/model-03.keras"` -> `"ckpt/.model-03.tmp-1234.keras"`
    (`"ckpt/.model-03.tmp-1234.r1.keras"` on rank 1 under mpirun).
    """
    directory, name = os.path.split(os.fspath(filepath))
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            break
    else:
        stem, suffix = name, ""
    rank = launcher_rank()
    tag = f"{os.getpid()}" if rank is None else f"{os.getpid()}.r{rank}"
    return os.path.join(directory, f".{stem}.tmp-{tag}{suffix}")


_writing = threading.local()


def in_atomic_write() -> bool:
    """Whether this thread is inside `atomic_write`'s `write` (so a save it
    makes is the temporary file itself, not a file to write atomically)."""
    return getattr(_writing, "depth", 0) > 0


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(filepath: str, write) -> None:
    """Calls `write(path)` on a temporary file, then renames it to `filepath`.

    The temporary file is `temporary_path(filepath)` (same directory, same
    Keras suffix); it is fsync'ed before the atomic `os.replace`, and the
    directory after it, so a crash at any point leaves either the previous
    complete `filepath` or the new one. A URL (`gs://...`) is written
    directly.

    Args:
        filepath: The final file.
        write: `path -> None`, e.g. `lambda p: model.save(p)`.
    """
    filepath = os.fspath(filepath)
    recorder = timeline.active()
    if recorder is None or _writing.depth:
        _atomic_write(filepath, write)
        return
    # The outermost write only (AtomicModelCheckpoint's write calls a
    # model.save that fit made atomic too).
    _writing.depth += 1
    try:
        with recorder.span("checkpoint write", "checkpoint", {"path": filepath}):
            _atomic_write(filepath, write)
    finally:
        _writing.depth -= 1


class _Writing(threading.local):
    depth = 0


_writing = _Writing()


def _atomic_write(filepath: str, write) -> None:
    if "://" in filepath:
        write(filepath)
        return
    tmp = temporary_path(filepath)
    try:
        _writing.depth = getattr(_writing, "depth", 0) + 1
        try:
            write(tmp)
        finally:
            _writing.depth -= 1
        _fsync_file(tmp)
        os.replace(tmp, filepath)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(os.path.dirname(filepath))


class AtomicModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` that writes on rank 0 only, atomically.

    Same arguments and behaviour as Keras's `ModelCheckpoint` (file name
    templates, `save_best_only`, `save_weights_only`, `save_freq`), except:

    - only rank 0 writes (all ranks hold the same model, and N ranks writing
      one file would corrupt it); other ranks only keep the books (`best`),
      so the object holds the same state on every rank;
    - each write goes to `temporary_path(filepath)` and is then renamed over
      `filepath` with `os.replace` (after an `fsync`), so a crash during the
      write leaves the previous checkpoint intact and at worst a stray
      hidden temporary file, which the next write of the same name replaces.

    A `.keras` file holds everything needed to resume: weights, the
    optimizer's variables (with a `DistributedOptimizer`: the loss scale and
    its counters, skipped steps, iterations) and its configuration. Resume
    with `keras.models.load_model(path)` on every rank and
    `fit(..., initial_epoch=k)`; `LearningRateScaler` continues its schedule
    from epoch `k`. After loading on rank 0 only, call
    `keras_mpfp16.broadcast_variables`.

    Fault injection: the file is written by `write(path)`, called with the
    temporary path; a test can make it (or `model.save`) raise part-way and
    check that `filepath` still holds the previous checkpoint.

    Args:
        filepath: As for `keras.callbacks.ModelCheckpoint`; must end in
            `.keras` (or `.weights.h5` with `save_weights_only=True`). Local
            or POSIX-mounted paths; a URL (`gs://...`) is written directly,
            without the rename.
        **kwargs: Any other `keras.callbacks.ModelCheckpoint` argument.

    Example:

    ```python
    import keras_mpfp16 as kmp

    ckpt = kmp.callbacks.AtomicModelCheckpoint("ckpt/last.keras")
    model.fit(x, y, epochs=10, callbacks=[ckpt])
    # later, on every rank:
    model = keras.models.load_model("ckpt/last.keras")
    model.fit(x, y, epochs=10, initial_epoch=7, callbacks=[ckpt])
    ```
    """

    # Keras's hook for the writing (keras_internals.MODEL_CHECKPOINT_SAVE_METHOD:
    # the seam checks its signature when keras_mpfp16 is imported).
    def _save_model(self, epoch, batch, logs):
        # Every rank keeps the books (`best`, with the global logs fit gives
        # every rank), so the object's state is the same everywhere.
        filepath = keras_internals.checkpoint_file_path(self, epoch, batch, logs)
        should_save = keras_internals.checkpoint_should_save(
            self, epoch, batch, logs, filepath
        )
        if not should_save or not runtime.is_root():
            return
        if os.path.isdir(filepath):
            raise OSError(
                "AtomicModelCheckpoint needs a file path, but filepath "
                f"{filepath!r} is an existing directory."
            )
        directory = os.path.dirname(filepath)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.save_atomically(filepath)
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished saving model to {filepath}")

    def save_atomically(self, filepath: str) -> None:
        """Writes the checkpoint to a temporary file, then renames it to `filepath`."""
        atomic_write(filepath, self.write)

    def write(self, path: str) -> None:
        """Writes the model (or its weights) to `path`: the interruptible step."""
        if self.save_weights_only:
            self.model.save_weights(path, overwrite=True)
        else:
            self.model.save(path, overwrite=True)
