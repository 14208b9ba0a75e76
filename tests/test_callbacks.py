"""Callbacks in one process: the learning rate every step really uses, resume,
checkpoints, rank-0 helpers and the step-hook registry. No MPI jobs."""

import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_mpfp16 as kmp
from keras_mpfp16 import rank_output
from keras_mpfp16.callbacks import (
    AtomicModelCheckpoint,
    GlobalMetrics,
    LearningRateScaler,
    RootOnly,
    ScaledLearningRate,
    root_only,
    scaled_learning_rate,
)
from keras_mpfp16.callbacks.checkpoint import temporary_path
from keras_mpfp16.internals.keras import get_learning_rate_slot
from keras_mpfp16.sync import step_hooks

STEPS = 10  # batches per epoch below


@pytest.fixture(autouse=True)
def restore_global_state():
    yield
    keras.config.set_dtype_policy("float32")
    keras.config.enable_interactive_logging()


@keras.saving.register_keras_serializable(package="test_callbacks")
def mean_prediction(y_true, y_pred):
    return ops.mean(y_pred)


def slope_model(learning_rate, steps_per_execution=1, wrap=True):
    """loss = mean(kernel * 1): every SGD step lowers the kernel by exactly
    the step's learning rate, so the kernel's path reveals every rate used."""
    model = keras.Sequential(
        [
            keras.Input((1,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
        ]
    )
    sgd = keras.optimizers.SGD(learning_rate)
    model.compile(
        optimizer=kmp.DistributedOptimizer(sgd) if wrap else sgd,
        loss=mean_prediction,
        steps_per_execution=steps_per_execution,
    )
    return model


def ones(n=STEPS * 4):
    return np.ones((n, 1), "float32"), np.zeros((n, 1), "float32")


def fit_ones(model, epochs, callbacks, **kwargs):
    """`model.fit` on `ones()` in batches of 4, in order, silently."""
    x, y = ones()
    return model.fit(
        x,
        y,
        batch_size=4,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
        **kwargs,
    )


class Trace(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.kernel, self.batch_lr = [], {}

    def on_epoch_end(self, epoch, logs=None):
        self.kernel.append(float(self.model.layers[0].kernel.numpy()[0, 0]))

    def on_train_batch_end(self, batch, logs=None):
        self.batch_lr[(len(self.kernel), batch)] = logs["learning_rate"]


def closed_form(epochs, **kw):
    return [
        float(scaled_learning_rate(e + b / STEPS, **kw))
        for e in epochs
        for b in range(STEPS)
    ]


@pytest.mark.parametrize("spe", [1, 4])
def test_every_step_uses_its_exact_rate(spe):
    """Also with steps_per_execution=4, when batch callbacks fire only every
    4th batch: the rate is computed inside the step."""
    kw = dict(
        base_learning_rate=0.01, factor=8.0, warmup_epochs=1.5, decay=0.9, max_lr=0.06
    )
    model = slope_model(0.01, steps_per_execution=spe)
    trace = Trace()
    scaler = LearningRateScaler(
        rule="linear", num_workers=8, warmup_epochs=1.5, decay=0.9, max_lr=0.06
    )
    history = fit_ones(model, 3, [trace, scaler])
    want = closed_form(range(3), **kw)
    np.testing.assert_allclose(
        [-k for k in trace.kernel], np.cumsum(want)[STEPS - 1 :: STEPS], rtol=1e-5
    )
    # A batch callback sees the logs of the last batch of its execution. Which
    # batch number Keras passes differs by version (3.10: the first of the
    # execution; later: the last, e.g. 11 for batches 8-9), so count calls.
    calls_in_epoch = {}
    for (epoch, _batch), lr in trace.batch_lr.items():
        k = calls_in_epoch[epoch] = calls_in_epoch.get(epoch, -1) + 1
        last = min((k + 1) * spe - 1, STEPS - 1)
        assert lr == pytest.approx(want[epoch * STEPS + last], rel=1e-6)
    assert len(trace.batch_lr) == 3 * (STEPS if spe == 1 else 3)
    last = [want[e * STEPS + STEPS - 1] for e in range(3)]
    np.testing.assert_allclose(history.history["learning_rate"], last, rtol=1e-6)
    # After fit the optimizer's own (single-worker) rate is back.
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.01)
    assert not step_hooks.installed(model, "keras_mpfp16.LearningRateScaler")


def test_schedule_learning_rate_is_the_base_and_survives_saving(tmp_path):
    schedule = keras.optimizers.schedules.ExponentialDecay(
        0.02, decay_steps=7, decay_rate=0.5
    )
    model = slope_model(schedule)
    trace = Trace()
    ckpt = AtomicModelCheckpoint(str(tmp_path / "m.keras"))
    scaler = LearningRateScaler(rule="sqrt", num_workers=4, warmup_epochs=1.0)
    fit_ones(model, 2, [trace, scaler, ckpt])
    want = [
        float(
            scaled_learning_rate(
                e + b / STEPS, schedule(e * STEPS + b).numpy(), 2.0, warmup_epochs=1.0
            )
        )
        for e in range(2)
        for b in range(STEPS)
    ]
    np.testing.assert_allclose(
        [-k for k in trace.kernel], np.cumsum(want)[9::10], rtol=1e-5
    )
    # Written while the scaler was installed, loaded with the user's schedule.
    loaded = keras.models.load_model(tmp_path / "m.keras")
    inner = loaded.optimizer.inner_optimizer
    slot = get_learning_rate_slot(inner)
    assert isinstance(slot, keras.optimizers.schedules.ExponentialDecay)
    assert slot.get_config() == schedule.get_config()
    assert int(inner.iterations.numpy()) == 2 * STEPS


def test_resume_in_the_middle_of_warmup_continues_the_schedule(tmp_path):
    def scaler():
        return LearningRateScaler(
            rule="paper", num_workers=100, warmup_epochs=3, decay=0.97
        )

    full, trace = slope_model(1e-3), Trace()
    fit_ones(full, 4, [trace, scaler()])

    first = slope_model(1e-3)
    ckpt = AtomicModelCheckpoint(str(tmp_path / "ck.keras"))
    fit_ones(first, 2, [ckpt, scaler()])
    resumed = keras.models.load_model(tmp_path / "ck.keras")
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(1e-3)
    trace2 = Trace()
    fit_ones(resumed, 4, [trace2, scaler()], initial_epoch=2)
    np.testing.assert_allclose(trace2.kernel, trace.kernel[2:], rtol=1e-6)
    got = {(e + 2, b): v for (e, b), v in trace2.batch_lr.items()}
    want = {k: v for k, v in trace.batch_lr.items() if k[0] >= 2}
    assert got == pytest.approx(want, rel=1e-7)


def test_a_fit_that_raises_leaves_nothing_that_stacks_on_the_next_fit():
    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("boom")

    model = slope_model(0.01)
    x, y = ones()
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=2,
            verbose=0,
            callbacks=[LearningRateScaler(num_workers=4), Boom()],
        )
    kernel = float(model.layers[0].kernel.numpy()[0, 0])
    trace = Trace()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[trace, LearningRateScaler(num_workers=2)],
    )
    assert list(trace.batch_lr.values()) == pytest.approx(
        [0.02] * STEPS
    )  # 0.01 * 2, once
    assert kernel - trace.kernel[0] == pytest.approx(STEPS * 0.02, rel=1e-5)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.01)
    assert not step_hooks.installed(model, "keras_mpfp16.LearningRateScaler")


def test_reduce_lr_on_plateau_multiplies_the_schedule():
    # mode="max" on a falling loss: no improvement after epoch 0, so the
    # rate is halved after epochs 1 and 2; warmup and decay continue on top.
    plateau = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", mode="max", factor=0.5, patience=1
    )
    kw = dict(base_learning_rate=0.01, factor=4.0, warmup_epochs=2.0, decay=0.9)
    model, trace = slope_model(0.01), Trace()
    scaler = LearningRateScaler(num_workers=4, warmup_epochs=2.0, decay=0.9)
    fit_ones(model, 4, [scaler, plateau, trace])
    want = closed_form(range(4), **kw)
    mult = [1.0, 1.0, 0.5, 0.25]
    for (epoch, batch), lr in trace.batch_lr.items():
        assert lr == pytest.approx(
            want[epoch * STEPS + batch] * mult[epoch], rel=1e-6
        ), epoch


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_unknown_steps_per_epoch_needs_the_argument():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(ones(8)).batch(4).filter(lambda x, y: True)
    model = slope_model(0.01)
    with pytest.raises(ValueError, match="pass steps_per_epoch"):
        model.fit(
            ds,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[LearningRateScaler(warmup_epochs=1)],
        )
    model = slope_model(0.01)
    model.fit(
        ds,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[LearningRateScaler(warmup_epochs=1, steps_per_epoch=2)],
    )


def test_scaled_learning_rate_config_round_trip():
    class Fake:
        _rate = 0.5

    assert (
        ScaledLearningRate.from_config(ScaledLearningRate(Fake(), 0.125).get_config())
        == 0.125
    )


# -- checkpoints ----------------------------------------------------------------------


def test_temporary_path_keeps_directory_and_keras_suffix():
    pid = os.getpid()
    assert temporary_path("ck/model-03.keras") == f"ck/.model-03.tmp-{pid}.keras"
    assert temporary_path("w.weights.h5") == f".w.tmp-{pid}.weights.h5"
    assert temporary_path("/a/b/old.h5") == f"/a/b/.old.tmp-{pid}.h5"


class CrashingCheckpoint(AtomicModelCheckpoint):
    """Fault injection at the documented point: the write starts, then dies."""

    crash = False

    def write(self, path):
        if self.crash:
            with open(path, "wb") as f:
                f.write(b"half a zip file")
            raise KeyboardInterrupt("simulated crash mid-write")
        super().write(path)


@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
@pytest.mark.parametrize(
    "name, weights_only", [("last.keras", False), ("last.weights.h5", True)]
)
def test_crash_mid_write_leaves_the_previous_checkpoint(tmp_path, name, weights_only):
    path = tmp_path / name
    model = slope_model(0.01)
    ckpt = CrashingCheckpoint(str(path), save_weights_only=weights_only)
    x, y = ones()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[ckpt])
    saved = model.get_weights()
    ckpt.crash = True
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[ckpt])
    assert os.listdir(tmp_path) == [name]  # no temporary file left behind
    check = slope_model(0.01)
    if weights_only:
        check.load_weights(path)
    else:
        check = keras.models.load_model(path)
    np.testing.assert_array_equal(check.get_weights()[0], saved[0])
    assert not np.array_equal(model.get_weights()[0], saved[0])


def test_checkpoint_holds_the_loss_scale_state(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    opt = kmp.DistributedOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=2.0**6, growth_interval=3
    )
    model.compile(optimizer=opt, loss="mse")
    x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
    model.fit(
        x,
        x[:, :1],
        batch_size=4,
        epochs=1,
        verbose=0,
        callbacks=[AtomicModelCheckpoint(str(tmp_path / "m.keras"))],
    )
    assert opt.loss_scaling and float(opt.dynamic_scale.numpy()) > 2.0**6  # it grew
    loaded = keras.models.load_model(tmp_path / "m.keras").optimizer
    for name in (
        "dynamic_scale",
        "step_counter",
        "hysteresis_left",
        "nonfinite_streak",
        "skipped_steps",
        "iterations",
    ):
        assert getattr(loaded, name).numpy() == getattr(opt, name).numpy(), name
    assert [v.numpy().tolist() for v in loaded.variables] == [
        v.numpy().tolist() for v in opt.variables
    ]


# -- rank 0 helpers -------------------------------------------------------------------


def test_root_only_is_the_callback_on_rank_0_and_a_forwarding_no_op_elsewhere():
    csv = keras.callbacks.CSVLogger("unused.csv")
    assert root_only(csv) is csv  # one process: rank 0
    inner = Trace()
    stand_in = RootOnly(inner)
    model = slope_model(0.01)
    stand_in.set_model(model)
    stand_in.set_params({"epochs": 1, "steps": 10})
    assert inner.model is model and inner.params == {"epochs": 1, "steps": 10}
    x, y = ones()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[stand_in])
    assert inner.kernel == [] and inner.batch_lr == {}  # nothing ran
    with pytest.raises(TypeError, match="keras.callbacks.Callback"):
        root_only("not a callback")


def test_quieting_from_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert rank_output.launcher_rank() == 1
    assert rank_output.quiet_non_root_ranks_early() is True
    assert not keras.config.is_interactive_logging_enabled()
    # The communicator (one process: rank 0) is authoritative and undoes it.
    assert rank_output.quiet_non_root_ranks() is False
    assert keras.config.is_interactive_logging_enabled()
    monkeypatch.setenv(rank_output.ENV_VAR, "1")
    assert rank_output.quiet_non_root_ranks_early() is False


def test_print_once_prints_in_one_process(capsys):
    # One process (no launcher, or the library's rank 0): it prints, with
    # print's arguments. Ranks other than 0: tests/test_mpi_rank_output.py.
    kmp.print_once("a", 2, sep="-", end="!\n")
    assert capsys.readouterr().out == "a-2!\n"
    assert kmp.root_stdout_only() is False  # rank 0 keeps its output


# -- step hooks ---------------------------------------------------------------------


def test_step_hooks_compose_in_priority_order_and_restore_in_any_order():
    model = slope_model(0.01)
    calls = []

    def hook(tag):
        def wrap(step):
            def wrapped(data):
                calls.append(tag)
                return step(data)

            return wrapped

        return wrap

    step_hooks.install(model, "outer", train=hook("outer"), priority=100)
    step_hooks.install(model, "inner", train=hook("inner"), priority=1)
    x, y = ones(4)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert calls[:2] == ["outer", "inner"]  # traced once: outer wraps inner
    step_hooks.uninstall(model, "outer")
    assert model.train_function is None
    step_hooks.uninstall(model, "inner")
    assert "train_step" not in model.__dict__ and "test_step" not in model.__dict__


def test_global_metrics_is_a_no_op_in_one_process():
    model = slope_model(0.01)
    gm = GlobalMetrics()
    x, y = ones()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[gm])
    assert not step_hooks.installed(model, "keras_mpfp16.GlobalMetrics")
    assert "get_metrics_result" not in model.__dict__
    assert GlobalMetrics(**gm.get_config()).check_steps is True
