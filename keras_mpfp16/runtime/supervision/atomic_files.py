"""Files written atomically: a temporary file, fsync, then `os.replace`.

`os.replace` is atomic on POSIX file systems: a reader, or a job restarted
after a crash, sees either the previous complete file or the new complete
one, never a half-written file. Used by the checkpoint callbacks and by
`model.save` in a multi-process job. Keras-free: `write` does the writing.
"""

from __future__ import annotations

import os
import threading

from keras_mpfp16.runtime.process.launcher_env import launcher_rank
from keras_mpfp16.runtime.trace import timeline

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


class _Writing(threading.local):
    depth = 0


_writing = _Writing()


def in_atomic_write() -> bool:
    """Whether this thread is inside `atomic_write`'s `write` (so a save it
    makes is the temporary file itself, not a file to write atomically)."""
    return _writing.depth > 0


def fsync_file(path: str) -> None:
    """Flushes `path`'s data to the disk (before a rename makes it visible)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(directory: str) -> None:
    """Flushes `directory`'s entries (after a rename), where the platform can."""
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


def _atomic_write(filepath: str, write) -> None:
    if "://" in filepath:
        write(filepath)
        return
    tmp = temporary_path(filepath)
    try:
        _writing.depth += 1
        try:
            write(tmp)
        finally:
            _writing.depth -= 1
        fsync_file(tmp)
        os.replace(tmp, filepath)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(filepath))
