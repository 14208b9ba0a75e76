"""Where training is, as far as the library knows (set by callbacks).

The gradient reduction checks that all ranks are at the same train step; when
a callback has told us the current epoch, it checks the epoch too, which
catches a rank with more batches per epoch at the first mismatched step.
"""

from __future__ import annotations

_epoch: int = -1
# Called with the new epoch by `set_epoch` (the TensorFlow backend keeps a
# variable in step with it, so the train step reads the epoch in the graph
# instead of crossing into Python for it).
_epoch_listeners: tuple = ()
# (epoch, step, ranks that wrote the backup or None) of a fit resuming in
# the middle of an epoch, from its start until that epoch begins.
_resumed: tuple[int, int, int | None] | None = None


def set_epoch(epoch: int) -> None:
    """Records the epoch that is starting (called from `on_epoch_begin`)."""
    global _epoch
    _epoch = int(epoch)
    for listener in _epoch_listeners:
        listener(_epoch)


def add_epoch_listener(listener) -> None:
    """Calls `listener(epoch)` on every later `set_epoch` (once per listener)."""
    global _epoch_listeners
    if listener not in _epoch_listeners:
        _epoch_listeners = (*_epoch_listeners, listener)


def epoch() -> int:
    """The current epoch, or -1 when no callback reports epochs."""
    return _epoch


def set_resumed(epoch: int, step: int, written_at: int | None) -> None:
    """Records that the `fit` starting resumes at `step` of `epoch` from a
    backup written by `written_at` ranks (None: not recorded); called from
    `on_train_begin`, read by callbacks in the epoch's `on_epoch_begin`."""
    global _resumed
    _resumed = (int(epoch), int(step), None if written_at is None else int(written_at))


def clear_resumed() -> None:
    """Forgets the resume point (its epoch has begun, or there is none)."""
    global _resumed
    _resumed = None


def resumed() -> tuple[int, int, int | None] | None:
    """`(epoch, step, ranks that wrote the backup)` of a `fit` resuming in
    the middle of an epoch, until that epoch has begun; else None."""
    return _resumed


__all__ = [
    "add_epoch_listener",
    "clear_resumed",
    "epoch",
    "resumed",
    "set_epoch",
    "set_resumed",
]
