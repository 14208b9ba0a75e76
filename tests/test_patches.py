"""The Keras patches, in one process: one installer, pass-through, opt-out.

`training.patches` installs every wrapper keras_mpfp16 puts on Keras; these
tests check the wrappers themselves (the multi-process behaviour they enable
is tested under mpirun elsewhere, `test_mpi_explicit_fit.py` among others).
"""

import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_mpfp16 as kmp
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.training import patches, sessions


@pytest.fixture(autouse=True)
def patched():
    yield
    kmp.install_keras_patches()  # every test leaves them installed


def _model(optimizer=None):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=optimizer or kmp.DistributedOptimizer("sgd"), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 1))


def test_import_installs_every_patch():
    assert kmp.training.installed() == {
        "keras.Model.fit": True,
        "keras.Model.evaluate": True,
        "keras.Model.save": True,
        "keras.Model.save_weights": True,
        "model_supports_jit": True,
    }


def test_install_is_idempotent():
    before = {name: getattr(keras.Model, name) for name in ("fit", "evaluate", "save")}
    assert kmp.install_keras_patches() is True
    assert kmp.install_keras_patches() is True
    after = {name: getattr(keras.Model, name) for name in before}
    assert after == before
    # One wrapper, not a wrapper of a wrapper.
    assert not getattr(keras.Model.fit.__wrapped__, "_keras_mpfp16_hook", False)


def test_uninstall_restores_keras_own_methods():
    kmp.uninstall_keras_patches()
    assert not any(kmp.training.installed().values())
    assert "fit" not in vars(keras.Model)  # Keras defines fit on its trainer
    assert "save" in vars(keras.Model)  # ... and save on Model itself
    assert not getattr(keras.Model.save, "_keras_mpfp16_hook", False)
    assert not keras_internals.model_supports_jit_wrapped()
    kmp.uninstall_keras_patches()  # idempotent
    kmp.install_keras_patches()
    assert all(kmp.training.installed().values())


def test_models_without_a_distributed_optimizer_pass_through(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the collective path ran for a plain model")

    monkeypatch.setattr(sessions, "fit_arguments", refuse)
    monkeypatch.setattr(sessions, "evaluate_arguments", refuse)
    x, y = _data()
    model = _model("sgd")
    patched = model.fit(x, y, epochs=2, verbose=0, shuffle=False).history
    logs = model.evaluate(x, y, verbose=0, return_dict=True)
    kmp.uninstall_keras_patches()
    model = _model("sgd")
    plain = model.fit(x, y, epochs=2, verbose=0, shuffle=False).history
    assert patched == plain
    assert model.evaluate(x, y, verbose=0, return_dict=True) == logs


def test_one_process_fit_is_keras_fit_for_every_entry_point():
    x, y = _data()
    ref = _model().fit(x, y, epochs=2, verbose=0, shuffle=False).history

    class Super(keras.Model):
        def fit(self, *args, **kwargs):
            with kmp.distributed_fit(self, *args, **kwargs) as fit_kwargs:
                return super().fit(**fit_kwargs)

    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    model = Super(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    assert model.fit(x, y, epochs=2, verbose=0, shuffle=False).history == ref

    model = _model()
    callbacks = keras.callbacks.CallbackList(add_history=True, model=model)
    assert (
        model.fit(x, y, epochs=2, verbose=0, shuffle=False, callbacks=callbacks).history
        == ref
    )


def test_distributed_fit_binds_to_keras_signature():
    x, y = _data()
    model = _model()
    with kmp.distributed_fit(model, x, y, epochs=3) as kwargs:
        assert kwargs["x"] is x and kwargs["y"] is y and kwargs["epochs"] == 3
        assert kwargs["batch_size"] is None  # Keras's defaults, applied
        assert "self" not in kwargs
        assert sessions.in_session(model)
    assert not sessions.in_session(model)
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'"):
        with kmp.distributed_fit(model, x, y, epoch=3):
            pass


def test_keras_patch_opt_out_at_import():
    code = (
        "import keras, keras_mpfp16 as kmp\n"
        "print(kmp.training.installed())\n"
        "print('fit' in vars(keras.Model))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "KERAS_MPFP16_PATCH_KERAS": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert "True" not in lines[-2], lines
    assert lines[-1] == "False"


def test_patch_table_lists_every_patch():
    # The module docstring is the reference of what is patched.
    for name, _ in patches._METHODS:
        assert (
            f"`keras.Model.{name}`" in patches.__doc__ or f"`{name}`" in patches.__doc__
        )
    assert "model_supports_jit" in patches.__doc__
