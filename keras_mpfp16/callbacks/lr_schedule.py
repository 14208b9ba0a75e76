"""The learning-rate rule for N workers, as pure functions.

`scaled_learning_rate` is written against an array namespace `xp` (numpy for
tests and for planning, `keras.ops` inside a compiled train step), so the
rate a step uses and the rate a unit test checks come from the same code.

The rule, for a fractional epoch `e` (epoch index + batches done / batches
per epoch):

    factor   = {"linear": N, "sqrt": sqrt(N), "paper": N / (1 + N / N0), "none": 1}
    ramp(e)  = 1 + (factor - 1) * min(e / warmup_epochs, 1)    (= factor without warmup)
    decay(e) = decay ** e      (or decay(e) for a callable, 1 for None)
    lr(e)    = min(max_lr, base(e) * ramp(e) * decay(e) * multiplier)

`base(e)` is the single-worker recipe's rate: a constant `lr0`, or a Keras
`LearningRateSchedule` evaluated at the optimizer's own step. The warmup
therefore starts at exactly the single-worker rate and reaches the scaled
rate after `warmup_epochs` (Goyal et al. 2017); the decay runs on the
absolute epoch clock, as in FRNN's `lr0 * N/(1+N/N0) * lr_decay ** epoch`.
The scale factor is an input of the formula, not a value stored somewhere
a later epoch could overwrite (FRNN's bug: its `1/(1+N/N0)` factor was
overwritten every epoch and never took effect).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from keras_mpfp16 import _validate

SCALING_RULES = ("linear", "sqrt", "paper", "none")

# FRNN's N0: the rule "paper" grows about linearly for N << N0 and saturates
# at lr0 * N0 for N >> N0.
DEFAULT_N0 = 100.0


def validate_rule(rule: str) -> str:
    """Returns `rule` if it is one of `SCALING_RULES`, else raises ValueError."""
    return _validate.one_of("rule", rule, SCALING_RULES)


def scale_factor(rule: str, num_workers: int, n0: float = DEFAULT_N0) -> float:
    """How much larger than the single-worker rate the N-worker rate is.

    Args:
        rule: `"linear"` (N), `"sqrt"` (sqrt(N)), `"paper"` (N / (1 + N / n0),
            the rule of Svyatkovskiy et al. 2017 / FRNN) or `"none"` (1).
        num_workers: N, the number of workers (ranks), >= 1.
        n0: The saturation constant of `"paper"`, > 0.

    Returns:
        The factor, a float.
    """
    rule = validate_rule(rule)
    n = float(_validate.positive_int("num_workers", num_workers))
    n0 = _validate.number("n0", n0, minimum=0, min_inclusive=False)
    if rule == "linear":
        return n
    if rule == "sqrt":
        return math.sqrt(n)
    if rule == "paper":
        return n / (1.0 + n / n0)
    return 1.0


def validate_schedule_args(
    warmup_epochs: float, decay: Any, max_lr: float | None
) -> None:
    """Raises ValueError naming the bad value and what is allowed."""
    _validate.number("warmup_epochs", warmup_epochs, minimum=0)
    if decay is not None and not callable(decay):
        _validate.number(
            "decay",
            decay,
            minimum=0,
            min_inclusive=False,
            maximum=1,
            expected="None, a number in (0, 1] (the per-epoch factor) or a "
            "callable epoch -> multiplier",
        )
    _validate.number("max_lr", max_lr, minimum=0, min_inclusive=False, allow_none=True)


def scaled_learning_rate(
    epoch: Any,
    base_learning_rate: Any,
    factor: float,
    *,
    warmup_epochs: float = 0.0,
    decay: float | Callable[[Any], Any] | None = None,
    max_lr: float | None = None,
    multiplier: Any = 1.0,
    xp: Any = None,
) -> Any:
    """The learning rate at fractional `epoch` (see the module docstring).

    Args:
        epoch: Fractional epoch: epoch index + batches done / batches per
            epoch. A float, or a scalar tensor when `xp` is `keras.ops`.
        base_learning_rate: The single-worker rate at this point (lr0, or a
            schedule's value).
        factor: The scale factor for N workers (`scale_factor`).
        warmup_epochs: Epochs over which the factor ramps linearly from 1 to
            `factor`; 0 means no warmup.
        decay: None, a per-epoch factor `d` (multiplies by `d ** epoch`), or
            a callable `epoch -> multiplier`.
        max_lr: Upper bound on the returned rate, or None.
        multiplier: Extra factor (e.g. reductions by `ReduceLROnPlateau`).
        xp: Array namespace with `minimum` and `power` (numpy by default,
            `keras.ops` in a train step).

    Returns:
        The rate, a float (numpy) or scalar tensor.
    """
    if xp is None:
        import numpy as xp
    if warmup_epochs > 0:
        progress = xp.minimum(epoch / float(warmup_epochs), 1.0)
        ramp = 1.0 + (float(factor) - 1.0) * progress
    else:
        ramp = float(factor)
    rate = base_learning_rate * ramp * multiplier
    if callable(decay):
        rate = rate * decay(epoch)
    elif decay is not None and decay != 1:
        rate = rate * xp.power(float(decay), epoch)
    if max_lr is not None:
        rate = xp.minimum(rate, float(max_lr))
    return rate


__all__ = [
    "DEFAULT_N0",
    "SCALING_RULES",
    "scale_factor",
    "scaled_learning_rate",
    "validate_rule",
    "validate_schedule_args",
]
