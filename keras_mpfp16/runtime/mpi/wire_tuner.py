"""`wire_dtype="auto"`: one measured choice of the gradient wire for the job.

Which wire is faster depends on the link, the model's gradient sizes, the
cores per rank and the device: the 16-bit wire halves the bytes but costs a
codec pass (encode, the owner's float32 sum, decode). `auto` measures both on
this job's links and picks:

1. During the first step of `fit` the optimizer reduces in float32 and the
   train step records the sizes of its dense buckets.
2. After that step every rank times, per distinct bucket size, the bucket's
   reduction exactly as the step runs it (codec and transfer) on the float32
   and the float16 wire, `PAIRS` interleaved pairs (the backend's probe).
3. Rank 0 gathers every rank's times, takes per bucket and wire the slowest
   rank's median (the slowest rank sets the step's pace), sums over the
   buckets, and decides: float16 when it is faster than float32 by more than
   `MARGIN` (float32 is exact, so it wins ties). It broadcasts the
   `Decision`; every rank applies rank 0's, so the reduction graph and its
   numerics are identical on every rank by construction, whatever each rank
   measured.
4. When the reductions favour float16, whole train steps decide: the next
   `TRIAL_STEPS` steps run on the float32 wire, then (the step re-traced,
   one step not counted for the trace) `TRIAL_STEPS` on the float16 wire
   (fewer, down to `MIN_TRIAL_STEPS`, when the `fit` has fewer steps left:
   `trial_steps`; with fewer still the reductions' choice stands, so that
   the trial always ends inside the `fit` that started it);
   rank 0 takes each wire's slowest-rank median step time and keeps
   float16 only when it is faster by more than `MARGIN` (`confirm`), else
   the step is re-traced on float32. The reductions alone do not see what
   the codec costs the step around them (on one core per rank the encoding
   competes with the backward pass it overlaps): on 2 emulated nodes at
   10 Gbit/s they favoured float16 while float32 stepped faster in 2 of 3
   rounds (docs/benchmarks.md).
5. Every `CHECK_EVERY` steps rank 0 compares the recent median step time
   with the one measured just after the decision; a drift beyond `DRIFT`
   (either way) triggers one new measurement and decision (broadcast the
   same way).

The decision is said once (rank 0's log, and an instant event in the
timeline with every measured number). `KERAS_MPFP16_WIRE_AUTO` pins it
(`float32`, `float16` or `bfloat16`: no measurement) or leaves it to the
measurement (`measure`, the default). A model whose gradients are all
gathered as rows (sparse only: nothing on the dense wire) gets float32
without measuring.

This module is the decision and its agreement (numpy-free, no TensorFlow);
the timing is the backend's (`backend.tf_gradients.probe_wire`), the
callback that runs it `training.wire_auto`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.mpi import collectives, world

AUTO = "auto"
PIN_SETTING = "KERAS_MPFP16_WIRE_AUTO"  # registered in _settings.py
CANDIDATES = ("float32", "float16")
PAIRS = 3  # interleaved (float32, float16) timings per bucket size
MARGIN = 0.02  # float16 must beat float32 by more than this (relative)
TRIAL_STEPS = 5  # timed train steps per wire when the reductions favour float16
MIN_TRIAL_STEPS = 3  # fewer steps left in the fit: the reductions decide alone
DRIFT = 0.25  # relative change of the median step time that re-measures
CHECK_EVERY = 50  # steps between drift checks (one tiny broadcast each)


# Test seam: when set, `agree` uses `timings_hook(sizes)` as this rank's
# measurement instead of the backend's probe (tests inject per-rank times).
timings_hook = None
# Test seam: when set, `confirm` uses `step_times_hook(wire, seconds)` as this
# rank's step times on that wire instead of the measured `seconds`.
step_times_hook = None


@dataclass(frozen=True)
class Decision:
    """What `auto` chose, and why.

    Attributes:
        wire_dtype: the wire every rank uses.
        reason: one sentence: the measured totals or the pin.
        seconds: per candidate wire, the step's total reduction time as
            measured (slowest rank, median of the pairs, summed over buckets);
            empty when nothing was measured.
        buckets: per distinct bucket size: `{"elements", "count", <wire>:
            seconds}` (the slowest rank's median).
        step_seconds: per candidate wire, the train step's time on it (the
            slowest rank's median of `TRIAL_STEPS` steps), when whole steps
            were timed (the reductions favoured float16); else empty.
    """

    wire_dtype: str
    reason: str
    seconds: dict = field(default_factory=dict)
    buckets: tuple = ()
    step_seconds: dict = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "wire_dtype": self.wire_dtype,
            "reason": self.reason,
            "seconds": dict(self.seconds),
            "buckets": [dict(b) for b in self.buckets],
            "step_seconds": dict(self.step_seconds),
        }


def pinned() -> str | None:
    """The pinned wire (`KERAS_MPFP16_WIRE_AUTO`), None to measure."""
    value = env.get("WIRE_AUTO")
    return None if value == "measure" else value


def decide(per_rank: list[dict], sizes: list[int]) -> Decision:
    """The decision from every rank's timings (pure: the same inputs give the
    same decision).

    Args:
        per_rank: one dict per rank: `{elements: {wire: [seconds, ...]}}`.
        sizes: the step's dense bucket sizes (elements), repeats included.

    Returns:
        The `Decision`.
    """
    counts: dict[int, int] = {}
    for s in sizes:
        counts[int(s)] = counts.get(int(s), 0) + 1
    buckets, totals = [], dict.fromkeys(CANDIDATES, 0.0)
    for elements, count in sorted(counts.items()):
        row = {"elements": elements, "count": count}
        for w in CANDIDATES:
            slowest = max(
                statistics.median(timings[elements][w]) for timings in per_rank
            )
            row[w] = slowest
            totals[w] += count * slowest
        buckets.append(row)
    f32, f16 = totals["float32"], totals["float16"]
    if f16 < f32 * (1.0 - MARGIN):
        wire, why = "float16", "faster"
    else:
        wire, why = "float32", "not slower by more than the margin"
    reason = (
        f"measured the step's reduction ({len(sizes)} buckets) on this job's "
        f"links: float32 {f32 * 1e3:.1f} ms, float16 {f16 * 1e3:.1f} ms "
        f"(slowest of {len(per_rank)} ranks); {wire} is {why} "
        f"(float16 must win by > {MARGIN:.0%})"
    )
    return Decision(wire, reason, totals, tuple(buckets))


def agree(sizes: list[int], measure) -> Decision:
    """Every rank's measurement, rank 0's decision, applied on every rank.

    Collective: every rank calls it at the same step.

    Args:
        sizes: the step's dense bucket sizes (elements), the same on every
            rank (the bucket plan is).
        measure: `measure(distinct_sizes) -> {elements: {wire: [seconds]}}`,
            this rank's timings (the backend's probe); `timings_hook` replaces
            it when set.

    Returns:
        rank 0's `Decision`, on every rank.
    """
    pin = collectives.broadcast(pinned())
    if pin is not None:
        return Decision(pin, f"pinned by KERAS_MPFP16_WIRE_AUTO={pin}")
    if not sizes:
        return Decision(
            "float32",
            "no dense gradients on the wire (sparse gradients gather their rows "
            "in float32): nothing for a 16-bit wire to halve",
        )
    distinct = sorted({int(s) for s in sizes})
    timings = (timings_hook or measure)(distinct)
    everyone = collectives.allgather_object(timings, "wire auto (timings)")
    decision = decide(everyone, sizes) if world.rank() == 0 else None
    return collectives.broadcast(decision)


def needs_steps(decision: Decision) -> bool:
    """Whether whole train steps must confirm `decision`: a measured
    float16 (a pin, or float32 chosen by the reductions, stands)."""
    return decision.wire_dtype == "float16" and bool(decision.seconds)


def trial_steps(steps_left: int | None, traces: int) -> int:
    """How many whole steps per wire the trial times, 0 for no trial.

    Pure; the caller makes the answer the same on every rank.

    Args:
        steps_left: train steps (calls of the train function) this `fit` has
            left after the current one, minus those that cannot be timed
            (the first step of each later epoch); None when unknown (a
            generator without `steps_per_epoch`).
        traces: how many of those steps a re-trace takes (not timed).

    Returns:
        `TRIAL_STEPS` when unknown or when they fit; else as many as fit,
        or 0 when fewer than `MIN_TRIAL_STEPS` fit (the reductions decide).
    """
    if steps_left is None:
        return TRIAL_STEPS
    fit = max(0, steps_left - traces) // len(CANDIDATES)
    n = min(TRIAL_STEPS, fit)
    return n if n >= MIN_TRIAL_STEPS else 0


def confirm(candidate: Decision, step_times: dict[str, list[float]]) -> Decision:
    """The decision after timing whole train steps on both wires.

    Collective: every rank calls it at the same step.

    Args:
        candidate: the reductions' decision (float16).
        step_times: this rank's train-step times, `{wire: [seconds, ...]}`
            for float32 and float16, the same count on every rank
            (`step_times_hook` replaces them when set).

    Returns:
        rank 0's `Decision` on every rank: float16 when its slowest-rank
        median step is faster than float32's by more than `MARGIN`, else
        float32; the reductions' numbers are kept beside the steps'.
    """
    if step_times_hook is not None:
        step_times = {w: step_times_hook(w, list(t)) for w, t in step_times.items()}
    mine = {w: statistics.median(step_times[w]) for w in CANDIDATES}
    count = min(len(step_times[w]) for w in CANDIDATES)
    everyone = collectives.allgather_object(mine, "wire auto (step times)")
    decision = None
    if world.rank() == 0:
        slowest = {w: max(r[w] for r in everyone) for w in CANDIDATES}
        f32, f16 = slowest["float32"], slowest["float16"]
        wire = "float16" if f16 < f32 * (1.0 - MARGIN) else "float32"
        verdict = (
            "float16 confirmed"
            if wire == "float16"
            else "float32 instead: the whole step decides, not the reduction alone"
        )
        reason = (
            f"{candidate.reason}; then timed whole train steps ({count} "
            f"per wire, median, slowest of {len(everyone)} ranks): float32 "
            f"{f32 * 1e3:.1f} ms, float16 {f16 * 1e3:.1f} ms: {verdict}"
        )
        decision = Decision(wire, reason, candidate.seconds, candidate.buckets, slowest)
    return collectives.broadcast(decision)


class DriftWatch:
    """Rank 0's step-time drift check, agreed every `CHECK_EVERY` steps."""

    def __init__(self, every: int = CHECK_EVERY, drift: float = DRIFT):
        self.every = every
        self.drift = drift
        self.times: list[float] = []
        self.baseline: float | None = None

    def reset(self) -> None:
        self.times, self.baseline = [], None

    def step(self, seconds: float) -> bool:
        """Records one step; collective every `every` steps. True (on every
        rank together) when the median step time drifted beyond `drift`."""
        self.times.append(seconds)
        if len(self.times) < self.every:
            return False
        median = statistics.median(self.times)
        self.times = []
        if self.baseline is None:
            self.baseline = median
            return False
        drifted = abs(median - self.baseline) > self.drift * self.baseline
        return bool(collectives.broadcast(drifted))
