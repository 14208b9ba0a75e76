"""`kmp.layers.SyncBatchNormalization` in one process (issue 28).

In one process it is Keras's BatchNormalization (the same code runs); its
global-statistics path (`_global_moments`, whose allreduce is the identity
with one process) is checked here against Keras's moments, with and without
a mask, values and gradients. The multi-process behaviour is in
tests/test_mpi_sync_batch_norm.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mpfp16 as kmp
from keras_mpfp16.layers import SyncBatchNormalization


def _pair(**kwargs):
    keras.utils.set_random_seed(3)
    sync = SyncBatchNormalization(**kwargs)
    keras.utils.set_random_seed(3)
    plain = keras.layers.BatchNormalization(**kwargs)
    return sync, plain


def _data(seed=0, shape=(6, 5, 4)):
    rng = np.random.default_rng(seed)
    x = rng.normal(3.0, 2.0, size=shape).astype("float32")
    mask = rng.random(shape[:-1]) < 0.7
    return x, mask


def test_exported_and_a_batch_normalization():
    assert kmp.layers.SyncBatchNormalization is SyncBatchNormalization
    assert issubclass(SyncBatchNormalization, keras.layers.BatchNormalization)


@pytest.mark.parametrize("masked", [False, True])
def test_one_process_is_keras_batch_normalization(masked):
    x, mask = _data()
    sync, plain = _pair(momentum=0.7)
    m = tf.constant(mask) if masked else None
    for _ in range(2):
        a = sync(x, training=True, mask=m)
        b = plain(x, training=True, mask=m)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(sync.moving_mean.numpy(), plain.moving_mean.numpy())
    np.testing.assert_array_equal(
        sync.moving_variance.numpy(), plain.moving_variance.numpy()
    )
    np.testing.assert_array_equal(
        sync(x, training=False).numpy(), plain(x, training=False).numpy()
    )


def _moments_and_grads(fn, x, mask):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        mean, var = fn(x, None if mask is None else tf.constant(mask))
        target = tf.reduce_sum(mean * [1.0, -2.0, 0.5, 3.0]) + tf.reduce_sum(
            var * [0.3, 1.0, -1.0, 2.0]
        )
    return mean.numpy(), var.numpy(), tape.gradient(target, x).numpy()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shape", [(6, 5, 4), (9, 4), (1, 4)])
def test_global_statistics_path_equals_keras_moments(masked, shape):
    """The N-rank formula (count, sum, squares about zero in float64),
    evaluated with one rank: Keras's moments and gradients up to rounding."""
    x, mask = _data(1, shape)
    sync, plain = _pair()
    sync.build(x.shape)
    plain.build(x.shape)
    mask = mask if masked else None
    got = _moments_and_grads(sync._global_moments, x, mask)
    want = _moments_and_grads(plain._moments, x, mask)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


def test_global_statistics_of_an_empty_or_fully_masked_batch_are_zero_not_nan():
    sync = SyncBatchNormalization()
    sync.build((None, 3))
    mean, var = sync._global_moments(tf.zeros((0, 3)), None)
    assert mean.numpy().tolist() == [0.0, 0.0, 0.0]
    assert var.numpy().tolist() == [0.0, 0.0, 0.0]
    sync = SyncBatchNormalization()
    sync.build((None, 2, 3))
    mean, var = sync._global_moments(tf.ones((4, 2, 3)), tf.zeros((4, 2), tf.bool))
    assert np.all(np.isfinite(mean.numpy())) and np.all(np.isfinite(var.numpy()))


def test_large_mean_small_spread_keeps_the_variance():
    """No catastrophic cancellation: mean 1e4, standard deviation 1e-1."""
    rng = np.random.default_rng(2)
    x = (1e4 + 0.1 * rng.normal(size=(256, 2))).astype("float32")
    sync = SyncBatchNormalization()
    sync.build(x.shape)
    _, var = sync._global_moments(tf.constant(x), None)
    np.testing.assert_allclose(var.numpy(), np.var(x.astype(np.float64), 0), rtol=1e-3)


def test_mixed_precision_statistics_in_float32():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        x, _ = _data(4, (8, 4))
        sync, plain = _pair()
        a = sync(x, training=True)
        b = plain(x, training=True)
        assert a.dtype == b.dtype == "float16"
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert sync.moving_mean.dtype == "float32"
    finally:
        keras.config.set_dtype_policy("float32")


def test_config_round_trip_and_keras_file(tmp_path):
    layer = SyncBatchNormalization(momentum=0.9, epsilon=1e-4, center=False)
    config = layer.get_config()
    again = SyncBatchNormalization.from_config(config)
    assert again.get_config() == config
    assert keras.saving.get_registered_name(SyncBatchNormalization) == (
        "keras_mpfp16>SyncBatchNormalization"
    )
    model = keras.Sequential(
        [keras.Input((None, 3)), keras.layers.LSTM(4), SyncBatchNormalization()]
    )
    x, _ = _data(5, (7, 5, 3))
    model(x, training=True)  # moving statistics move
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.layers[1], SyncBatchNormalization)
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )


def test_synchronized_true_is_refused_with_what_is_allowed():
    with pytest.raises(ValueError, match=r"synchronized=True.*allowed: False"):
        SyncBatchNormalization(synchronized=True)
