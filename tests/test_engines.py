"""A DistributedOptimizer under another distribution engine is refused (issue 19, item 7).

Refused where it is made in a strategy scope or with a keras.distribution
set, and in fit/evaluate of a model built or run in a strategy scope.

One process is enough: the error is raised before any collective, and
MirroredStrategy and keras.distribution.DataParallel both exist on one CPU.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mpfp16 as kmp


def _model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 3)).astype("float32"), np.zeros((8, 1), "float32")


def _check_message(message: str, engine: str) -> None:
    assert engine in message, message
    assert "DistributedOptimizer" in message and "mpirun" in message, message
    assert "plain Keras optimizer" in message, message


def test_model_built_in_a_strategy_scope_is_refused_at_fit_and_evaluate():
    with tf.distribute.MirroredStrategy().scope():
        model = _model()
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    x, y = _data()
    with pytest.raises(ValueError) as info:
        model.fit(x, y, verbose=0)
    _check_message(str(info.value), "tf.distribute.MirroredStrategy")
    assert "fit() of a model compiled with a DistributedOptimizer" in str(info.value)
    with pytest.raises(ValueError, match=r"evaluate\(\).*MirroredStrategy"):
        model.evaluate(x, y, verbose=0)


def test_the_optimizer_made_inside_a_strategy_scope_is_refused():
    # The usual MirroredStrategy script: model and compile inside the scope.
    with tf.distribute.MirroredStrategy().scope():
        model = _model()
        with pytest.raises(ValueError) as info:
            model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    _check_message(str(info.value), "tf.distribute.MirroredStrategy")
    assert "DistributedOptimizer created" in str(info.value)


def test_fit_and_evaluate_inside_a_strategy_scope_are_refused():
    model = _model()
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    x, y = _data()
    with tf.distribute.MirroredStrategy().scope():
        with pytest.raises(ValueError, match=r"fit\(\).*MirroredStrategy"):
            model.fit(x, y, verbose=0)
        with pytest.raises(ValueError, match=r"evaluate\(\).*MirroredStrategy"):
            model.evaluate(x, y, verbose=0)
    # Outside the scope the same model trains.
    model.fit(x, y, verbose=0)


def test_keras_distribution_is_refused():
    model = _model()
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    x, y = _data()
    try:
        data_parallel = keras.distribution.DataParallel()
    except AttributeError as e:  # Keras 3.10: no TensorFlow distribution_lib yet
        pytest.skip(f"keras.distribution is not usable with TensorFlow here: {e}")
    keras.distribution.set_distribution(data_parallel)
    try:
        with pytest.raises(ValueError) as info:
            kmp.DistributedOptimizer("sgd")
        _check_message(str(info.value), "DataParallel")
        assert "keras.distribution.set_distribution(None)" in str(info.value)
        with pytest.raises(ValueError, match=r"fit\(\).*DataParallel"):
            model.fit(x, y, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
    model.fit(x, y, verbose=0)


def test_a_loaded_model_is_compiled_and_trains(tmp_path):
    # The check hooks fit/evaluate, not compile (Keras skips compiling a
    # loaded model whose compile is overridden).
    model = _model()
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    model.fit(*_data(), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, kmp.DistributedOptimizer)
    loaded.fit(*_data(), verbose=0)


def test_a_plain_optimizer_under_a_strategy_is_left_alone():
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = _model()
        model.compile(optimizer="sgd", loss="mse")
    model.fit(*_data(), verbose=0)
