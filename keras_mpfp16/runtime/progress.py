"""Where training is, as far as the library knows (set by callbacks).

The gradient reduction checks that all ranks are at the same train step; when
a callback has told us the current epoch, it checks the epoch too, which
catches a rank with more batches per epoch at the first mismatched step.
"""

from __future__ import annotations

_epoch: int = -1


def set_epoch(epoch: int) -> None:
    """Records the epoch that is starting (called from `on_epoch_begin`)."""
    global _epoch
    _epoch = int(epoch)


def epoch() -> int:
    """The current epoch, or -1 when no callback reports epochs."""
    return _epoch


__all__ = ["epoch", "set_epoch"]
