"""The dynamic loss-scale state machine, as one pure, branch-free function.

`transition` is written against an array namespace `xp` (numpy for tests,
`keras.ops` inside a compiled train step), so the exact same code decides on
every backend, and its only input from the current step is `finite`: whether
the *reduced* gradients are finite. Because every rank sees the same reduced
gradients, every rank takes the same decision and the same scale update.

Rules (with defaults from PyTorch's GradScaler and DeepSpeed's loss scaler):

* finite step: apply it; after `growth_interval` finite steps in a row the
  scale is multiplied by `growth_factor` (capped at `max_scale`).
* non-finite step: skip it; after `hysteresis` non-finite steps in a row the
  scale is multiplied by `backoff_factor` (floored at `min_scale`).
* a backoff due while the scale is already at `min_scale` means training
  cannot proceed: `failed` is raised and the caller stops with an error.
* without loss scaling (float32 or bfloat16 training) non-finite steps are
  still skipped, and `max_consecutive_nonfinite` of them in a row fail.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class LossScaleConfig:
    """Settings of the loss-scale state machine (validated on creation).

    Args:
        enabled: Whether the loss is scaled at all. When False the scale stays
            1 and only the non-finite-step guard is active.
        initial_scale: Starting scale (power of two recommended).
        growth_interval: Finite steps in a row before the scale grows.
        growth_factor: Multiplier applied when growing (> 1).
        backoff_factor: Multiplier applied when backing off (0 < f < 1).
        hysteresis: Non-finite steps in a row tolerated before a backoff.
        min_scale: Floor of the scale; a backoff due at the floor fails.
        max_scale: Ceiling of the scale.
        max_consecutive_nonfinite: Without scaling, how many non-finite steps
            in a row fail training.
    """

    enabled: bool = True
    initial_scale: float = 2.0**15
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    hysteresis: int = 1
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    max_consecutive_nonfinite: int = 10

    def __post_init__(self):
        def positive_int(name):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; received {value!r}.")

        for name in ("growth_interval", "hysteresis", "max_consecutive_nonfinite"):
            positive_int(name)
        for name in ("initial_scale", "min_scale", "max_scale"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0; received {value!r}.")
        if not self.growth_factor > 1:
            raise ValueError(
                f"growth_factor must be > 1; received {self.growth_factor!r}."
            )
        if not 0 < self.backoff_factor < 1:
            raise ValueError(
                f"backoff_factor must be in (0, 1); received {self.backoff_factor!r}."
            )
        if not self.min_scale <= self.initial_scale <= self.max_scale:
            raise ValueError(
                "Need min_scale <= initial_scale <= max_scale; received "
                f"{self.min_scale!r} <= {self.initial_scale!r} <= {self.max_scale!r}."
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def initial_state(self) -> LossScaleState:
        """State before the first step."""
        scale = float(self.initial_scale) if self.enabled else 1.0
        return LossScaleState(scale, 0, self.hysteresis, 0)


class LossScaleState(NamedTuple):
    """The machine's state; stored as optimizer variables between steps."""

    scale: Any  # float32: the current loss scale
    good_steps: Any  # int: finite steps since the last scale change
    hysteresis_left: Any  # int: non-finite steps still tolerated before a backoff
    nonfinite_streak: Any  # int: non-finite steps in a row (for reporting and failure)


def transition(state: LossScaleState, finite, config: LossScaleConfig, xp) -> tuple:
    """Computes the next state from whether this step's reduced gradients are finite.

    Args:
        state: The current `LossScaleState`.
        finite: Boolean scalar; True when all reduced gradients are finite.
        config: The `LossScaleConfig`.
        xp: An array namespace with `where`, `minimum`, `maximum`,
            `logical_and`, `logical_not` (numpy or `keras.ops`).

    Returns:
        `(new_state, apply, failed)`: the next state; whether the step's
        update is applied (equal to `finite`); whether training must stop.
    """
    scale, good, hyst, streak = state
    bad = xp.logical_not(finite)
    streak = xp.where(finite, 0, streak + 1)
    if not config.enabled:
        failed = streak >= config.max_consecutive_nonfinite
        return LossScaleState(scale, good, hyst, streak), finite, failed

    good = xp.where(finite, good + 1, 0)
    grow = xp.logical_and(finite, good >= config.growth_interval)
    hyst = xp.where(finite, config.hysteresis, hyst - 1)
    backoff = xp.logical_and(bad, hyst <= 0)
    failed = xp.logical_and(backoff, scale <= config.min_scale)

    grown = xp.minimum(scale * config.growth_factor, config.max_scale)
    shrunk = xp.maximum(scale * config.backoff_factor, config.min_scale)
    scale = xp.where(grow, grown, xp.where(backoff, shrunk, scale))
    good = xp.where(grow, 0, good)
    hyst = xp.where(backoff, config.hysteresis, hyst)
    return LossScaleState(scale, good, hyst, streak), finite, failed
