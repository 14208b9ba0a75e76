"""Files written atomically: a temporary file, fsync, then `os.replace`.

`os.replace` is atomic on POSIX file systems: a reader, or a job restarted
after a crash, sees either the previous complete file or the new complete
one, never a half-written file. Used by the checkpoint callbacks and by
`model.save` in a multi-process job. Keras-free: `write` does the writing.
"""

from __future__ import annotations

import os
import re
import threading

from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.process.launcher_env import launcher_rank

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


# `temporary_path`'s names: `.<stem>.tmp-<pid>[.r<rank>]<suffix>`.
_TEMPORARY = re.compile(
    r"^\.(?P<stem>.+)\.tmp-(?P<pid>\d+)(?:\.r(?P<rank>\d+))?"
    r"(?P<suffix>\.weights\.h5|\.keras|\.h5)?$"
)


def _alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's), or cannot tell: keep its file
    return True


def remove_stale_temporaries(directory: str) -> list[str]:
    """Deletes the temporary files of `atomic_write`s whose process is gone.

    A process killed while writing (SIGKILL, a node failure) leaves its
    `.<stem>.tmp-<pid>[.r<rank>]<suffix>` file behind, often full size. Those
    whose process id is not alive on this host are removed; those of live
    processes (and anything else) are kept.

    Args:
        directory: Where to look (not recursive); a missing one is fine.

    Returns:
        The paths removed.
    """
    removed = []
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return removed
    for name in names:
        match = _TEMPORARY.match(name)
        if match is None or _alive(int(match.group("pid"))):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.isfile(path):
                os.remove(path)
                removed.append(path)
        except OSError:
            pass
    return removed


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
    recorder = trace.active()
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
