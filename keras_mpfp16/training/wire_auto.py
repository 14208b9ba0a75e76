"""The callback behind `wire_dtype="auto"` (`runtime/mpi/wire_tuner.py`).

After the first train step of `fit` (which reduced in float32 and recorded
its bucket plan) it runs the optimizer's measurement and decision, says what
it chose and why (rank 0's stderr, once per decision that changes the wire;
an instant event "wire auto" in the timeline with every number), and
re-traces the train step when the wire changed. Then it watches the step
time (`wire_tuner.DriftWatch`) and decides again on a drift.

A decision costs nothing in later `fit` calls of the same model: it lives
on the optimizer (each `fit` gets a new callback, which starts from it and
only watches for a drift); the whole-step trial is sized to end inside the
`fit` that starts it (`wire_tuner.trial_steps`); and the train functions
traced for each wire are kept per model (`_functions`), so returning to a
wire traced before (the trial's float32 after its float16 steps) installs
that function again instead of tracing it anew. The kept functions are
dropped as soon as anything else rebuilds the model's train function
(a recompile, a callback that wraps the train step).

`fit_run` adds it only for a `DistributedOptimizer(wire_dtype="auto")` on
more than one rank.
"""

from __future__ import annotations

import math
import sys
import time
import weakref

import keras

from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.mpi import collectives, wire_tuner, world

# model -> {wire: the train function traced with that wire}, across `fit`s.
_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def wanted(model) -> bool:
    opt = getattr(model, "optimizer", None)
    return getattr(opt, "wire_dtype", None) == wire_tuner.AUTO and world.size() > 1


class WireAuto(keras.callbacks.Callback):
    """Decides `wire_dtype="auto"` after the first step, again on a drift.

    When the reductions favour float16, the decision waits for whole train
    steps timed on both wires (`wire_tuner.confirm`): `TRIAL_STEPS` steps on
    float32, then, re-traced, `TRIAL_STEPS` on float16 (fewer when the `fit`
    has fewer steps left; none below `MIN_TRIAL_STEPS`). A step whose time
    includes a trace or an epoch boundary (validation) is not counted. A
    `fit` that ends before the trial does (its length unknown, or stopped
    early) keeps the reductions' choice.
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
        self._epoch = 0
        self._traced = self.model.optimizer.effective_wire_dtype
        # Keras built (or kept) the train function before this call. When it
        # is not the one kept for this wire, something rebuilt it: the kept
        # functions are stale.
        kept = _functions.setdefault(self.model, {})
        current = self.model.train_function
        if kept.get(self._traced) is not current:
            kept.clear()
            if current is not None:
                kept[self._traced] = current

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
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        took = None if self._last is None else now - self._last
        opt = self.model.optimizer
        if opt.wire_decision is None:
            self._decide("after the first train step", batch)
        elif self._trial is not None:
            self._trial_step(took)
        elif took is not None and self.watch.step(took):
            self._decide("the step time drifted", batch)
            self.watch.reset()
        self._last = time.perf_counter()

    def _steps_left(self, batch: int) -> int | None:
        """Timeable calls of the train function left in this `fit` after the
        current one (the first of each later epoch is not timeable); None
        when Keras does not know the epoch's length."""
        steps = self.params.get("steps")
        if not steps:
            return None
        per_call = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        later = max(0, int(self.params.get("epochs", 1)) - self._epoch - 1)
        calls = math.ceil(max(0, steps - batch - 1) / per_call)
        return calls + later * (math.ceil(steps / per_call) - 1)

    def _decide(self, when: str, batch: int) -> None:
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
            kept = _functions.get(self.model, {})
            traces = sum(
                w != self._traced and w not in kept for w in ("float32", "float16")
            )
            # Rank 0's count, so that every rank runs the same trial.
            n = collectives.broadcast(
                wire_tuner.trial_steps(self._steps_left(batch), traces)
            )
            if n:
                self._start_trial(decision, when, before, n)
                return
            decision = wire_tuner.Decision(
                decision.wire_dtype,
                f"{decision.reason}; this fit had too few steps left to time "
                f"whole steps on both wires (at least {wire_tuner.MIN_TRIAL_STEPS} "
                "each), so the reductions decide",
                decision.seconds,
                decision.buckets,
            )
        self._apply(decision, when, before)

    # -- whole steps on both wires -------------------------------------------

    def _start_trial(self, candidate, when, before, steps: int) -> None:
        self._trial = {
            "steps": steps,
            "candidate": candidate,
            "when": when,
            "before": before,
            "wire": "float32",
            "skip": 0,
            "times": {w: [] for w in wire_tuner.CANDIDATES},
        }
        self._switch("float32", f"timing {steps} float32 steps")

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
        if len(t["times"][t["wire"]]) < t["steps"]:
            return
        if t["wire"] == "float32":
            t["wire"] = "float16"
            self._switch("float16", f"timing {t['steps']} float16 steps")
            return
        self._trial = None
        decision = wire_tuner.confirm(t["candidate"], t["times"])
        self._apply(decision, t["when"], t["before"])

    # -- the decision ----------------------------------------------------------

    def _retrace(self, wire: str) -> bool:
        """Makes the train step run `wire`: the function kept for it when
        there is one, else a new trace. True when the next step traces."""
        if wire == self._traced:
            return False
        kept = _functions.setdefault(self.model, {})
        self._traced = wire
        if kept.get(wire) is not None:
            self.model.train_function = kept[wire]
            return False
        self.model.make_train_function(force=True)
        kept[wire] = self.model.train_function
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
