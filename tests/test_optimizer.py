"""DistributedOptimizer in one process: API, validation, serialization, no MPI."""

import keras
import numpy as np
import pytest

import keras_mpfp16 as kmp
from keras_mpfp16.runtime.mpi import collectives


@pytest.fixture(autouse=True)
def restore_policy():
    yield
    keras.config.set_dtype_policy("float32")


def tiny_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6, 3)),
            keras.layers.LSTM(4),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )


def data(n=64):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 6, 3)).astype("float32"), rng.normal(size=(n, 1)).astype(
        "float32"
    )


def test_accepts_identifier_and_instance():
    assert isinstance(
        kmp.DistributedOptimizer("adam").inner_optimizer, keras.optimizers.Adam
    )
    sgd = keras.optimizers.SGD(0.3)
    assert kmp.DistributedOptimizer(sgd).inner_optimizer is sgd


def test_unwraps_a_keras_loss_scale_optimizer():
    lso = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=256.0
    )
    opt = kmp.DistributedOptimizer(lso)
    assert isinstance(opt.inner_optimizer, keras.optimizers.SGD)
    assert opt.loss_scale_config.initial_scale == 256.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"optimizer": 3}, TypeError, "int"),
        ({"optimizer": "not-an-optimizer"}, ValueError, "not-an-optimizer"),
        ({"optimizer": "adam", "op": "mean"}, ValueError, "'average', 'sum'"),
        (
            {"optimizer": "adam", "wire_dtype": "int8"},
            ValueError,
            "one of 'float32', 'float16', 'bfloat16'",
        ),
        ({"optimizer": "adam", "bucket_size_mb": 0}, ValueError, "bucket_size_mb"),
        ({"optimizer": "adam", "bucket_size_mb": -5}, ValueError, "-5"),
        ({"optimizer": "adam", "growth_interval": 0}, ValueError, "growth_interval"),
        (
            {"optimizer": "adam", "loss_scale": "dynamic"},
            ValueError,
            "'auto', True, False",
        ),
        (
            {"optimizer": "adam", "gradient_accumulation_steps": 0},
            ValueError,
            "gradient_accumulation",
        ),
        # An explicit 0 is an error naming it, not silently 2**15.
        ({"optimizer": "adam", "initial_scale": 0}, ValueError, "initial_scale"),
        (
            {"optimizer": "adam", "non_trainable_sync": "batch"},
            ValueError,
            "'step', 'epoch'",
        ),
    ],
)
def test_bad_arguments_name_the_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        kmp.DistributedOptimizer(**kwargs)


def test_loss_scaling_is_resolved_once_scale_and_unscale_agree():
    """Created under float32, built under mixed_float16, traced again under
    float32: the loss is still scaled by the scale the gradients are divided
    by (before, scale_loss re-read the global policy and returned the loss
    unscaled while the gradients were divided by 2**15)."""
    keras.config.set_dtype_policy("float32")
    opt = kmp.DistributedOptimizer("sgd")
    keras.config.set_dtype_policy("mixed_float16")
    model = tiny_model()
    opt.build(model.trainable_variables)
    keras.config.set_dtype_policy("float32")
    assert opt.loss_scaling is True and opt.loss_scale_config.enabled is True
    loss = keras.ops.convert_to_tensor(1.5)
    assert float(opt.scale_loss(loss)) == 1.5 * 2.0**15


def test_creating_and_loading_makes_no_mpi_call(tmp_path):
    """`load_model` on one rank must not start MPI (a collective) or change
    the console: the constructor has no side effects."""
    import os
    import subprocess
    import sys

    code = f"""
import os
os.environ["OMPI_COMM_WORLD_RANK"] = "1"  # as if launched as rank 1
import keras, keras_mpfp16 as kmp
keras.config.enable_interactive_logging()
opt = kmp.DistributedOptimizer("adam")
kmp.DistributedOptimizer.from_config(opt.get_config())
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer=opt, loss="mse")
model.save({str(tmp_path / "m.keras")!r})
keras.models.load_model({str(tmp_path / "m.keras")!r})
assert not kmp.runtime.is_initialized(), "MPI was initialised"
assert keras.config.is_interactive_logging_enabled(), "output was silenced"
print("ok")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_wrapping_twice_is_rejected():
    with pytest.raises(TypeError, match="already a DistributedOptimizer"):
        kmp.DistributedOptimizer(kmp.DistributedOptimizer("sgd"))


def test_compile_under_mixed_float16_does_not_rewrap():
    keras.config.set_dtype_policy("mixed_float16")
    model = tiny_model()
    opt = kmp.DistributedOptimizer("adam")
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt
    model.fit(*data(), batch_size=16, epochs=1, verbose=0)
    assert opt.loss_scaling and float(opt.dynamic_scale.numpy()) == 2.0**15


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_no_loss_scaling_outside_mixed_float16(policy):
    keras.config.set_dtype_policy(policy)
    model = tiny_model()
    opt = kmp.DistributedOptimizer("adam")
    model.compile(optimizer=opt, loss="mse")
    model.fit(*data(), batch_size=16, epochs=1, verbose=0)
    assert not opt.loss_scaling and float(opt.dynamic_scale.numpy()) == 1.0


@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(1e-2)],
    ids=["sgd", "adam"],
)
def test_one_process_trains_like_the_plain_optimizer_without_mpi(
    monkeypatch, make_optimizer
):
    def forbidden(*args, **kwargs):
        raise AssertionError("an MPI collective ran in a one-process train step")

    monkeypatch.setattr(collectives, "allreduce_flat", forbidden)
    monkeypatch.setattr(collectives, "broadcast_arrays", forbidden)
    x, y = data()
    ref = tiny_model()
    init = ref.get_weights()
    ref.compile(optimizer=make_optimizer(), loss="mse")
    ref.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = tiny_model()
    model.set_weights(init)
    model.compile(optimizer=kmp.DistributedOptimizer(make_optimizer()), loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_jit_compile_true_trains_in_one_process():
    model = tiny_model()
    model.compile(
        optimizer=kmp.DistributedOptimizer("adam"), loss="mse", jit_compile=True
    )
    hist = model.fit(*data(), batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(hist.history["loss"]).all()


def test_nonfinite_steps_are_skipped_then_fail_without_loss_scaling():
    import tensorflow as tf

    x, y = data(64)
    x[:] = np.nan
    model = tiny_model()
    opt = kmp.DistributedOptimizer("sgd", max_consecutive_nonfinite=3)
    model.compile(optimizer=opt, loss="mse")
    before = model.get_weights()
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="non-finite on 3 consecutive steps"
    ):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)  # nothing NaN was applied


def test_stuck_at_min_scale_raises_naming_step_and_scale():
    import tensorflow as tf

    keras.config.set_dtype_policy("mixed_float16")
    x, y = data(64)
    x[:] = np.inf
    model = tiny_model()
    opt = kmp.DistributedOptimizer("adam", initial_scale=4.0, min_scale=1.0)
    model.compile(optimizer=opt, loss="mse")
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"train step 2 and the loss scale is already at its minimum 1",
    ):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_get_config_round_trip():
    opt = kmp.DistributedOptimizer(
        keras.optimizers.SGD(0.2, momentum=0.5),
        wire_dtype="bfloat16",
        bucket_size_mb=4,
        hysteresis=2,
        gradient_accumulation_steps=3,
    )
    clone = kmp.DistributedOptimizer.from_config(opt.get_config())
    assert clone.get_config() == opt.get_config()
    assert clone.inner_optimizer.momentum == 0.5 and clone.accumulation_steps == 3


def test_saves_to_keras_file_and_loads_back(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model = tiny_model()
    model.compile(optimizer=kmp.DistributedOptimizer("adam", hysteresis=2), loss="mse")
    model.fit(*data(), batch_size=16, epochs=1, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.optimizer, kmp.DistributedOptimizer)
    assert loaded.optimizer.loss_scale_config.hysteresis == 2
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert float(loaded.optimizer.dynamic_scale.numpy()) == float(
        model.optimizer.dynamic_scale.numpy()
    )
    assert int(loaded.optimizer.iterations.numpy()) == int(
        model.optimizer.iterations.numpy()
    )
