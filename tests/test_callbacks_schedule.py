"""The learning-rate rule for N workers against closed forms (pure functions)."""

import json
import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_mpfp16.callbacks import LearningRateScaler
from keras_mpfp16.callbacks.lr_schedule import scale_factor, scaled_learning_rate

NS = [1, 2, 8, 100, 1000]
LR0 = 0.01


@pytest.mark.parametrize("n", NS)
def test_scale_factors(n):
    assert scale_factor("linear", n) == n
    assert scale_factor("sqrt", n) == pytest.approx(math.sqrt(n))
    assert scale_factor("paper", n) == pytest.approx(n / (1 + n / 100))
    assert scale_factor("paper", n, n0=10) == pytest.approx(n / (1 + n / 10))
    assert scale_factor("none", n) == 1.0


def test_paper_rule_saturates_at_n0():
    # FRNN's rule: ~linear for N << N0, never above N0 times lr0.
    assert scale_factor("paper", 1000) == pytest.approx(1000 / 11)
    assert scale_factor("paper", 10**9) < 100
    assert scale_factor("paper", 100) == pytest.approx(50.0)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("rule", ["linear", "sqrt", "paper", "none"])
def test_warmup_start_middle_end(n, rule):
    f = scale_factor(rule, n)
    w = 5.0

    def lr(e):
        return float(scaled_learning_rate(e, LR0, f, warmup_epochs=w))

    assert lr(0.0) == pytest.approx(LR0, rel=1e-12)  # the single-worker rate
    assert lr(2.5) == pytest.approx(LR0 * (1 + (f - 1) / 2), rel=1e-12)
    assert lr(1.25) == pytest.approx(LR0 * (1 + (f - 1) / 4), rel=1e-12)
    assert lr(5.0) == pytest.approx(LR0 * f, rel=1e-12)
    assert lr(17.3) == pytest.approx(LR0 * f, rel=1e-12)  # stays scaled after


@pytest.mark.parametrize("n", NS)
def test_no_warmup_is_the_scaled_rate_from_the_first_step(n):
    assert scaled_learning_rate(0.0, LR0, float(n)) == pytest.approx(LR0 * n)


@pytest.mark.parametrize("n", NS)
def test_cap(n):
    f = scale_factor("linear", n)
    cap = 0.05
    for e in (0.0, 0.5, 1.0, 3.0):
        got = float(scaled_learning_rate(e, LR0, f, warmup_epochs=1.0, max_lr=cap))
        want = min(cap, LR0 * (1 + (f - 1) * min(e, 1.0)))
        assert got == pytest.approx(want, rel=1e-12)
    assert float(scaled_learning_rate(9.0, LR0, f, max_lr=cap)) <= cap


@pytest.mark.parametrize("n", NS)
def test_frnn_rule_with_decay_and_cap(n):
    """FRNN: lr0 * N/(1+N/100) * 0.97**epoch, capped at 0.1, fractional epochs."""
    f = scale_factor("paper", n)
    for e in (0.0, 0.37, 1.0, 4.5, 30.0):
        got = float(scaled_learning_rate(e, LR0, f, decay=0.97, max_lr=0.1))
        assert got == pytest.approx(min(0.1, LR0 * f * 0.97**e), rel=1e-12)


@pytest.mark.parametrize("n", NS)
def test_decay_runs_on_the_absolute_epoch_clock_during_and_after_warmup(n):
    f = float(n)
    for e in (0.0, 1.0, 2.5, 6.0):
        got = float(scaled_learning_rate(e, LR0, f, warmup_epochs=2.0, decay=0.9))
        ramp = 1 + (f - 1) * min(e / 2.0, 1.0)
        assert got == pytest.approx(LR0 * ramp * 0.9**e, rel=1e-12)


def test_callable_decay_and_multiplier():
    got = scaled_learning_rate(
        3.0, LR0, 4.0, decay=lambda e: 1.0 / (1.0 + e), multiplier=0.5
    )
    assert float(got) == pytest.approx(LR0 * 4 * 0.25 * 0.5)


@pytest.mark.parametrize("n", NS)
def test_resume_in_the_middle_of_warmup(n):
    """The rate depends only on (epoch, batch in epoch): a run resumed at epoch
    2 of a 5-epoch warmup continues exactly where the uninterrupted one was."""
    f = scale_factor("linear", n)
    steps = 7

    def run(epochs):
        return [
            float(
                scaled_learning_rate(
                    e + b / steps, LR0, f, warmup_epochs=5.0, decay=0.97, max_lr=0.5
                )
            )
            for e in epochs
            for b in range(steps)
        ]

    full = run(range(0, 6))
    resumed = run(range(2, 6))
    assert resumed == full[2 * steps :]
    assert full[2 * steps] == pytest.approx(
        min(0.5, LR0 * (1 + (f - 1) * 2 / 5) * 0.97**2), rel=1e-12
    )


def test_xp_namespace_gives_the_same_numbers_in_float32():
    from keras import ops

    for e in (0.0, 0.3, 1.7, 4.0):
        want = scaled_learning_rate(
            e, LR0, 8.0, warmup_epochs=2.0, decay=0.95, max_lr=0.06
        )
        got = scaled_learning_rate(
            ops.convert_to_tensor(e, "float32"),
            ops.convert_to_tensor(LR0, "float32"),
            8.0,
            warmup_epochs=2.0,
            decay=0.95,
            max_lr=0.06,
            xp=ops,
        )
        assert float(ops.convert_to_numpy(got)) == pytest.approx(float(want), rel=1e-6)


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"warmup_epochs": -1},
            "`warmup_epochs`: expected a finite number >= 0. Received: warmup_epochs=-1",
        ),
        ({"warmup_epochs": float("nan")}, "Received: warmup_epochs=nan"),
        (
            {"max_lr": 0},
            "`max_lr`: expected None or a finite number > 0. Received: max_lr=0",
        ),
        ({"max_lr": -0.1}, "Received: max_lr=-0.1"),
        ({"rule": "cubic"}, "'linear', 'sqrt', 'paper', 'none'"),
        (
            {"decay": 1.5},
            r"`decay`: expected None, a number in \(0, 1\].*callable.*Received: decay=1.5",
        ),
        (
            {"num_workers": 0},
            "`num_workers`: expected None or an integer >= 1. Received: num_workers=0",
        ),
        ({"n0": 0}, "`n0`: expected a finite number > 0. Received: n0=0"),
        (
            {"steps_per_epoch": 0},
            "`steps_per_epoch`: expected None or an integer >= 1. Received: steps_per_epoch=0",
        ),
        (
            {"base_learning_rate": -1.0},
            "`base_learning_rate`: expected None or a finite number >= 0",
        ),
    ],
)
def test_bad_arguments_name_the_value_and_what_is_allowed(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LearningRateScaler(**kwargs)


def test_unknown_rule_lists_allowed_values_in_pure_function():
    with pytest.raises(
        ValueError,
        match="`rule`: expected one of 'linear', 'sqrt', 'paper', 'none'. Received: rule='cubic'",
    ):
        scale_factor("cubic", 2)


def test_numpy_arrays_of_epochs_work():
    e = np.linspace(0, 3, 7)
    got = scaled_learning_rate(e, LR0, 4.0, warmup_epochs=2.0)
    np.testing.assert_allclose(got, LR0 * (1 + 3 * np.minimum(e / 2, 1)), rtol=1e-12)


def test_numpy_scalars_are_accepted_like_python_numbers():
    """Failed before: np.int64 steps_per_epoch and np.float32 rates were rejected."""
    scaler = LearningRateScaler(
        num_workers=np.int32(4),
        steps_per_epoch=np.int64(10),
        base_learning_rate=np.float32(0.5),
        warmup_epochs=np.float64(1.0),
        decay=np.float32(0.5),
    )
    assert scaler.factor == 4.0
    config = scaler.get_config()
    assert config["steps_per_epoch"] == 10 and type(config["steps_per_epoch"]) is int
    assert config["base_learning_rate"] == 0.5
    assert type(config["decay"]) is float


@keras.saving.register_keras_serializable(package="kmp_tests")
def halve_every_epoch(epoch):
    return ops.power(0.5, epoch)


def test_callable_decay_survives_get_config():
    """Failed before: get_config() silently wrote decay=None for a callable."""
    scaler = LearningRateScaler(rule="sqrt", decay=halve_every_epoch, num_workers=4)
    config = scaler.get_config()
    assert config["decay"] is not None
    json.dumps(config)  # a config must be plain data
    restored = LearningRateScaler.from_config(config)
    assert restored.decay is halve_every_epoch
    assert restored.get_config() == config


def test_unsaveable_decay_raises_instead_of_dropping_it():
    def local_decay(epoch):  # not registered: Keras could not find it again
        return 1.0

    scaler = LearningRateScaler(decay=local_decay)
    with pytest.raises(
        ValueError, match="cannot save decay=.*register_keras_serializable"
    ):
        scaler.get_config()
    with pytest.raises(ValueError, match="a lambda.*register_keras_serializable"):
        LearningRateScaler(decay=lambda e: 1.0).get_config()
