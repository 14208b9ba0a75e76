"""The callback behind `wire_dtype="auto"` (`runtime/mpi/wire_tuner.py`).

After the first train step of `fit` (which reduced in float32 and recorded
its bucket plan) it runs the optimizer's measurement and decision, says what
it chose and why (rank 0's stderr, once per decision that changes the wire;
an instant event "wire auto" in the timeline with every number), and
re-traces the train step when the wire changed. Then it watches the step
time (`wire_tuner.DriftWatch`) and decides again on a drift.

`fit_run` adds it only for a `DistributedOptimizer(wire_dtype="auto")` on
more than one rank.
"""

from __future__ import annotations

import sys
import time

import keras

from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.mpi import wire_tuner, world


def wanted(model) -> bool:
    opt = getattr(model, "optimizer", None)
    return getattr(opt, "wire_dtype", None) == wire_tuner.AUTO and world.size() > 1


class WireAuto(keras.callbacks.Callback):
    """Decides `wire_dtype="auto"` after the first step, again on a drift."""

    def __init__(self):
        super().__init__()
        self.watch = wire_tuner.DriftWatch()
        self._last = None
        self.decisions: list[wire_tuner.Decision] = []

    def on_train_begin(self, logs=None):
        self.watch.reset()
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        opt = self.model.optimizer
        if opt.wire_decision is None:
            self._decide("after the first train step")
        elif self._last is not None and self.watch.step(now - self._last):
            self._decide("the step time drifted")
            self.watch.reset()
        self._last = time.perf_counter()

    def _decide(self, when: str) -> None:
        opt = self.model.optimizer
        before = opt.effective_wire_dtype
        recorder = trace.active()
        if recorder is None:
            decision = opt.tune_wire()
        else:
            with recorder.span("wire auto: measuring", "wire"):
                decision = opt.tune_wire()
        if decision is None:
            return
        self.decisions.append(decision)
        if decision.wire_dtype != before:
            # The step was traced with the old wire: trace it again.
            self.model.make_train_function(force=True)
        if recorder is not None:
            recorder.instant(
                f"wire auto: {decision.wire_dtype}",
                "wire",
                {"when": when, **decision.as_dict()},
            )
        if world.rank() == 0 and (
            len(self.decisions) == 1 or before != decision.wire_dtype
        ):
            sys.stderr.write(
                f"keras_mpfp16: wire_dtype='auto' chose {decision.wire_dtype} "
                f"({when}): {decision.reason}.\n"
            )
            sys.stderr.flush()
