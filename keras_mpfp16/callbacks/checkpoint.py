"""Checkpoints written by rank 0 only, atomically.

A checkpoint is first written to a temporary file in the same directory and
then renamed over the final name with `os.replace`, which is atomic on POSIX
file systems: a reader, or a job restarted after a crash, sees either the
previous complete checkpoint or the new complete one, never a half-written
file.
"""

from __future__ import annotations

import os

import keras

from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.supervision.atomic_files import atomic_write, temporary_path

__all__ = ["AtomicModelCheckpoint", "atomic_write", "temporary_path"]


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
        if not should_save or not world.is_root():
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
