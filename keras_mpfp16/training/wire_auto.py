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
    """Decides `wire_dtype="auto"` after the first step, again on a drift.

    When the reductions favour float16, the decision waits for whole train
    steps timed on both wires (`wire_tuner.confirm`): `TRIAL_STEPS` steps on
    float32, then, re-traced, `TRIAL_STEPS` on float16. A step whose time
    includes a trace or an epoch boundary (validation) is not counted. A
    `fit` that ends before the trial does keeps the reductions' choice.
    """

    def __init__(self):
        super().__init__()
        self.watch = wire_tuner.DriftWatch()
        self._last = None
        self._traced = None  # the wire the train step was traced with
        self._trial = None  # timing whole steps: see _start_trial
        self.decisions: list[wire_tuner.Decision] = []

    def on_train_begin(self, logs=None):
        self.watch.reset()
        self._last = None
        self._trial = None
        self._traced = self.model.optimizer.effective_wire_dtype

    def on_train_end(self, logs=None):
        if self._trial is not None:  # too few steps to time both wires
            t, self._trial = self._trial, None
            candidate = t["candidate"]
            self._apply(
                wire_tuner.Decision(
                    candidate.wire_dtype,
                    f"{candidate.reason}; fit ended before whole steps were "
                    "timed on both wires",
                    candidate.seconds,
                    candidate.buckets,
                ),
                t["when"],
                t["before"],
            )

    def on_epoch_begin(self, epoch, logs=None):
        # The time between the last step of an epoch and the first of the
        # next holds validation and the epoch's callbacks: not a step.
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        took = None if self._last is None else now - self._last
        opt = self.model.optimizer
        if opt.wire_decision is None:
            self._decide("after the first train step")
        elif self._trial is not None:
            self._trial_step(took)
        elif took is not None and self.watch.step(took):
            self._decide("the step time drifted")
            self.watch.reset()
        self._last = time.perf_counter()

    def _decide(self, when: str) -> None:
        opt = self.model.optimizer
        before = self._traced
        recorder = trace.active()
        if recorder is None:
            decision = opt.tune_wire()
        else:
            with recorder.span("wire auto: measuring", "wire"):
                decision = opt.tune_wire()
        if decision is None:
            return
        if wire_tuner.needs_steps(decision):
            self._start_trial(decision, when, before)
        else:
            self._apply(decision, when, before)

    # -- whole steps on both wires -------------------------------------------

    def _start_trial(self, candidate, when, before) -> None:
        self._trial = {
            "candidate": candidate,
            "when": when,
            "before": before,
            "wire": "float32",
            "skip": 0,
            "times": {w: [] for w in wire_tuner.CANDIDATES},
        }
        self._switch("float32", f"timing {wire_tuner.TRIAL_STEPS} float32 steps")

    def _switch(self, wire: str, why: str) -> None:
        opt = self.model.optimizer
        opt.set_wire_decision(wire_tuner.Decision(wire, f"wire auto trial: {why}"))
        if self._retrace(wire):
            self._trial["skip"] = 1  # the next step's time holds the trace

    def _trial_step(self, took) -> None:
        t = self._trial
        if took is None or t["skip"]:
            t["skip"] = max(0, t["skip"] - 1)
            return
        t["times"][t["wire"]].append(took)
        if len(t["times"][t["wire"]]) < wire_tuner.TRIAL_STEPS:
            return
        if t["wire"] == "float32":
            t["wire"] = "float16"
            self._switch("float16", f"timing {wire_tuner.TRIAL_STEPS} float16 steps")
            return
        self._trial = None
        decision = wire_tuner.confirm(t["candidate"], t["times"])
        self._apply(decision, t["when"], t["before"])

    # -- the decision ----------------------------------------------------------

    def _retrace(self, wire: str) -> bool:
        """Re-traces the train step when it runs another wire than `wire`."""
        if wire == self._traced:
            return False
        self.model.make_train_function(force=True)
        self._traced = wire
        return True

    def _apply(self, decision, when: str, before: str) -> None:
        self.model.optimizer.set_wire_decision(decision)
        self.decisions.append(decision)
        self._retrace(decision.wire_dtype)
        recorder = trace.active()
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
