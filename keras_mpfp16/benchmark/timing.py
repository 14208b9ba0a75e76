"""Timing helpers that survive this kind of machine's noise.

Step times on shared machines drift and, on some, flip between modes. Two
configurations are therefore compared in interleaved rounds (A B A B ...),
and the result is the median of per-round ratios, with raw figures kept.
"""

from __future__ import annotations

import statistics
import time


class StepTimer:
    """Keras callback recording the wall time at the end of every train batch."""

    def __new__(cls, *args, **kwargs):
        import keras

        class _StepTimer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.stamps: list[float] = []

            def on_train_batch_end(self, batch, logs=None):
                self.stamps.append(time.perf_counter())

            def seconds_per_step(self, skip: int = 3) -> float:
                s = self.stamps[skip:]
                if len(s) < 2:
                    raise ValueError("Need more steps than `skip` + 1 to time.")
                return (s[-1] - s[0]) / (len(s) - 1)

        return _StepTimer()


def median_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[i] / b[i]."""
    return statistics.median(x / y for x, y in zip(a, b))


def best_of(fn, repeat: int) -> float:
    """Minimum wall time of `fn()` over `repeat` calls (for tiny operations)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
