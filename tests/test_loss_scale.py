"""The loss-scale state machine, checked step by step with numpy."""

import numpy as np
import pytest

from keras_mpfp16.optimizer.loss_scale import LossScaleConfig, transition


def run(config, finite_seq):
    state = config.initial_state()
    history = []
    for finite in finite_seq:
        state, apply, failed = transition(state, np.bool_(finite), config, np)
        history.append((float(state.scale), bool(apply), bool(failed)))
    return state, history


def test_grows_after_growth_interval_finite_steps():
    cfg = LossScaleConfig(initial_scale=8.0, growth_interval=3)
    _, hist = run(cfg, [True] * 7)
    assert [h[0] for h in hist] == [8, 8, 16, 16, 16, 32, 32]
    assert all(h[1] for h in hist)


def test_backoff_skips_and_resets_growth_counter():
    cfg = LossScaleConfig(initial_scale=8.0, growth_interval=2)
    _, hist = run(cfg, [True, False, True, True])
    assert [h[0] for h in hist] == [8, 4, 4, 8]
    assert [h[1] for h in hist] == [True, False, True, True]


def test_hysteresis_tolerates_consecutive_overflows():
    cfg = LossScaleConfig(initial_scale=64.0, hysteresis=3, growth_interval=100)
    _, hist = run(cfg, [False, False, True, False, False, False])
    # Two overflows, then a finite step refills the budget; three in a row back off.
    assert [h[0] for h in hist] == [64, 64, 64, 64, 64, 32]
    assert [h[1] for h in hist] == [False, False, True, False, False, False]


def test_caps_at_max_and_floors_at_min_then_fails():
    cfg = LossScaleConfig(
        initial_scale=4.0, min_scale=1.0, max_scale=8.0, growth_interval=1
    )
    _, hist = run(cfg, [True, True, True])
    assert [h[0] for h in hist] == [8, 8, 8]
    _, hist = run(cfg, [False, False, False])
    assert [h[0] for h in hist] == [2, 1, 1]
    assert [h[2] for h in hist] == [False, False, True]


def test_disabled_scaling_keeps_scale_one_and_fails_after_k_nonfinite():
    cfg = LossScaleConfig(enabled=False, max_consecutive_nonfinite=3)
    state, hist = run(cfg, [False, False, True, False, False, False])
    assert all(h[0] == 1.0 for h in hist)
    assert [h[1] for h in hist] == [False, False, True, False, False, False]
    assert [h[2] for h in hist] == [False, False, False, False, False, True]
    assert int(state.nonfinite_streak) == 3


def test_same_inputs_same_decisions():
    """Determinism: the machine is a pure function of its inputs."""
    cfg = LossScaleConfig(initial_scale=2.0**15, growth_interval=5, hysteresis=2)
    rng = np.random.default_rng(0)
    seq = rng.random(200) > 0.2
    assert run(cfg, seq)[1] == run(cfg, seq)[1]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"growth_interval": 0}, "growth_interval"),
        ({"growth_interval": 2.5}, "growth_interval"),
        ({"hysteresis": 0}, "hysteresis"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.5}, "backoff_factor"),
        ({"min_scale": -1.0}, "min_scale"),
        ({"initial_scale": 0.5, "min_scale": 1.0}, "min_scale <= initial_scale"),
        ({"max_consecutive_nonfinite": 0}, "max_consecutive_nonfinite"),
    ],
)
def test_bad_config_is_rejected_with_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossScaleConfig(**kwargs)
