"""keras_mpfp16.layers.LSTM / GRU: Keras compatibility and the float32 carry."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import pytest

import keras_mpfp16.layers as mp

KERAS = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
OURS = {"lstm": mp.LSTM, "gru": mp.GRU}
MIXED = ["mixed_float16", "mixed_bfloat16"]
B, T, F, U = 3, 7, 4, 5


@pytest.fixture(autouse=True)
def restore_policy():
    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


@pytest.fixture
def x():
    return np.random.default_rng(0).normal(size=(B, T, F)).astype("float32")


def built(cls, weights=None, input_shape=(B, T, F), **kwargs):
    layer = cls(U, **kwargs)
    layer.build(input_shape)
    if weights is not None:
        layer.set_weights(weights)
    return layer


def random_weights(kind, seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    layer = built(KERAS[kind], **kwargs)
    # Non-trivial biases so that bias handling is exercised.
    rng = np.random.default_rng(seed)
    return [
        w + 0.1 * rng.normal(size=w.shape).astype("float32")
        for w in layer.get_weights()
    ]


def as_np(tensors):
    if isinstance(tensors, (list, tuple)):
        return [as_np(t) for t in tensors]
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(tensors, "float32")))


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# -- float32: exactly Keras --------------------------------------------------

CONFIGS = [
    ("lstm", {}),
    ("lstm", {"return_sequences": True, "return_state": True}),
    ("lstm", {"go_backwards": True, "return_sequences": True}),
    ("lstm", {"implementation": 1}),
    ("gru", {}),
    ("gru", {"return_sequences": True, "return_state": True}),
    ("gru", {"reset_after": False, "return_sequences": True}),
    ("gru", {"go_backwards": True}),
]


@pytest.mark.parametrize("kind,kwargs", CONFIGS)
def test_float32_matches_keras(kind, kwargs, x):
    build_kwargs = (
        {"reset_after": kwargs["reset_after"]} if "reset_after" in kwargs else {}
    )
    weights = random_weights(kind, **build_kwargs)
    ours = as_np(built(OURS[kind], weights, **kwargs)(x))
    theirs = as_np(built(KERAS[kind], weights, **kwargs)(x))
    if not isinstance(ours, list):
        ours, theirs = [ours], [theirs]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_float64_policy_matches_keras(kind, x):
    weights = random_weights(kind)
    ours = built(OURS[kind], weights, dtype="float64")(x.astype("float64"))
    theirs = built(KERAS[kind], weights, dtype="float64")(x.astype("float64"))
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_weights_interchange_both_ways(kind, x, tmp_path):
    ours, theirs = built(OURS[kind]), built(KERAS[kind])
    assert [w.path.split("/")[-1] for w in ours.weights] == [
        w.path.split("/")[-1] for w in theirs.weights
    ]
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    theirs.set_weights(ours.get_weights())
    np.testing.assert_array_equal(as_np(ours(x)), as_np(theirs(x)))

    # Through weight files, Keras model -> ours and back.
    def model(cls):
        return keras.Sequential(
            [keras.Input((T, F)), cls(U, name="rnn"), keras.layers.Dense(2)]
        )

    keras_model, our_model = model(KERAS[kind]), model(OURS[kind])
    keras_model.save_weights(tmp_path / "keras.weights.h5")
    our_model.load_weights(tmp_path / "keras.weights.h5")
    np.testing.assert_array_equal(
        keras_model.predict(x, verbose=0), our_model.predict(x, verbose=0)
    )
    our_model.layers[0].set_weights(random_weights(kind, seed=5))
    our_model.save_weights(tmp_path / "ours.weights.h5")
    keras_model.load_weights(tmp_path / "ours.weights.h5")
    np.testing.assert_array_equal(
        keras_model.predict(x, verbose=0), our_model.predict(x, verbose=0)
    )


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("policy", ["float32"] + MIXED)
def test_bidirectional(kind, policy, x):
    keras.mixed_precision.set_global_policy(policy)
    weights = random_weights(kind)
    ours = keras.layers.Bidirectional(OURS[kind](U, return_sequences=True))
    ours.build(x.shape)
    assert type(ours.backward_layer) is OURS[kind]
    assert ours.backward_layer.go_backwards
    ours.set_weights(weights + weights)
    y = as_np(ours(x))
    keras.mixed_precision.set_global_policy("float32")
    reference = keras.layers.Bidirectional(KERAS[kind](U, return_sequences=True))
    reference.build(x.shape)
    reference.set_weights(weights + weights)
    y_ref = as_np(reference(x))
    assert y.shape == (B, T, 2 * U)
    if policy == "float32":
        np.testing.assert_allclose(y, y_ref, atol=1e-6)
    else:
        assert rel_err(y, y_ref) < (1e-2 if policy == "mixed_bfloat16" else 2e-3)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("policy", ["float32"] + MIXED)
def test_right_padded_mask_equals_truncated_sequences(kind, policy, x):
    keras.mixed_precision.set_global_policy(policy)
    weights = random_weights(kind)
    lengths = [T, 4, 2]
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    layer = built(OURS[kind], weights, return_sequences=True, return_state=True)
    outputs = as_np(layer(x * mask[..., None], mask=mask))
    for row, length in enumerate(lengths):
        alone = as_np(layer(x[row : row + 1, :length]))
        # Masked steps repeat the last valid output and keep the state.
        np.testing.assert_allclose(
            outputs[0][row, length - 1], alone[0][0, -1], atol=1e-6
        )
        np.testing.assert_allclose(
            outputs[0][row, length:],
            np.broadcast_to(alone[0][0, -1], outputs[0][row, length:].shape),
            atol=1e-6,
        )
        for state, state_alone in zip(outputs[1:], alone[1:]):
            np.testing.assert_allclose(state[row], state_alone[0], atol=1e-6)
    if policy == "float32":
        reference = built(KERAS[kind], weights, return_sequences=True)
        np.testing.assert_allclose(
            outputs[0], as_np(reference(x, mask=mask)), atol=1e-6
        )


# -- mixed precision ---------------------------------------------------------


PRECISION_PAIRS = [
    ("float32", "float32"),
    ("float32", "split"),
    ("float32", "compute"),
    ("compute", "float32"),
    ("compute", "compute"),
    ("tf32x3", "tf32x3"),
]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("policy", MIXED)
@pytest.mark.parametrize("input_precision,recurrent_precision", PRECISION_PAIRS)
def test_mixed_forward_backward_finite(
    kind, policy, input_precision, recurrent_precision, x
):
    keras.mixed_precision.set_global_policy(policy)
    layer = OURS[kind](
        U,
        return_sequences=True,
        dropout=0.2,
        recurrent_dropout=0.2,
        recurrent_precision=recurrent_precision,
        input_precision=input_precision,
        seed=3,
    )
    model = keras.Sequential(
        [keras.Input((T, F)), layer, keras.layers.Dense(1, dtype="float32")]
    )
    model.compile(optimizer="adam", loss="mse")
    y = np.ones((B, T, 1), "float32")
    outputs = model(x, training=True)
    assert outputs.dtype == "float32"
    assert layer.compute_dtype == policy.split("_")[1]
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    for weight in layer.weights:
        assert weight.dtype == "float32"
        assert np.isfinite(as_np(weight)).all()
    # Inference path (no dropout) as well.
    assert np.isfinite(model.predict(x, verbose=0)).all()


@pytest.mark.parametrize("kind,kwargs", CONFIGS)
@pytest.mark.parametrize("input_precision", ["float32", "compute"])
def test_mixed_close_to_float32(kind, kwargs, input_precision, x):
    """Every branch of the float32-carry step agrees with Keras in float32."""
    build_kwargs = (
        {"reset_after": kwargs["reset_after"]} if "reset_after" in kwargs else {}
    )
    weights = random_weights(kind, **build_kwargs)
    reference = as_np(built(KERAS[kind], weights, **kwargs)(x))
    keras.mixed_precision.set_global_policy("mixed_float16")
    ours = as_np(
        built(OURS[kind], weights, input_precision=input_precision, **kwargs)(x)
    )
    if not isinstance(ours, list):
        ours, reference = [ours], [reference]
    for a, b in zip(ours, reference):
        assert rel_err(a, b) < 2e-3


def test_initial_state_and_unroll_under_mixed(x):
    weights = random_weights("lstm")
    rng = np.random.default_rng(2)
    state = [rng.normal(size=(B, U)).astype("float32") for _ in range(2)]
    reference = as_np(
        built(mp.LSTM, weights, return_sequences=True)(x, initial_state=state)
    )
    keras.mixed_precision.set_global_policy("mixed_float16")
    layer = built(mp.LSTM, weights, return_sequences=True)
    assert layer.input_dtype == "float32"  # given states are not rounded
    ours = as_np(layer(x, initial_state=state))
    assert rel_err(ours, reference) < 1e-3
    unrolled = as_np(built(mp.LSTM, weights, return_sequences=True, unroll=True)(x))
    np.testing.assert_allclose(unrolled, as_np(layer(x)), atol=1e-3)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_unknown_length_runs_the_same_loop(kind, x):
    """Unknown time length (batch-major loop) == known length (time-major).

    On TensorFlow the second call with a new length retraces with the time
    dimension relaxed to None, which takes the batch-major loop.
    """
    keras.mixed_precision.set_global_policy("mixed_float16")
    weights = random_weights(kind)
    layer = OURS[kind](U, return_sequences=True, dropout=0.3, recurrent_dropout=0.3)
    model = keras.Sequential([keras.Input((None, F)), layer, keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    layer.set_weights(weights)
    for steps in (T, T - 2, T - 3):
        expected = as_np(layer(x[:, :steps]))  # eager: static length
        got = np.asarray(model.layers[0](x[:, :steps]), "float32")
        np.testing.assert_array_equal(got, expected)
        predicted = model.predict_on_batch(x[:, :steps])
        assert predicted.shape == (B, steps, 1)
        loss = model.train_on_batch(x[:, :steps], np.zeros((B, steps, 1)))
        assert np.isfinite(loss)
        layer.set_weights(weights)
    # The retraced (length None) predict agrees with the eager layer.
    reference = keras.Sequential(
        [
            keras.Input((T - 3, F)),
            OURS[kind](U, return_sequences=True),
            keras.layers.Dense(1),
        ]
    )
    reference.set_weights(model.get_weights())
    np.testing.assert_allclose(
        model.predict_on_batch(x[:, : T - 3]),
        reference.predict_on_batch(x[:, : T - 3]),
        atol=1e-6,
    )


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="uses tf.GradientTape"
)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_float32(kind, x):
    """Mixed-precision gradients agree with float32 ones to half precision."""
    import tensorflow as tf

    weights = random_weights(kind)

    def grads(policy):
        layer = built(OURS[kind], weights, return_sequences=True, dtype=policy)
        with tf.GradientTape() as tape:
            loss = keras.ops.sum(keras.ops.cast(layer(x), "float32") ** 2)
        return [as_np(g) for g in tape.gradient(loss, layer.trainable_variables)]

    reference = grads("float32")
    for g, r in zip(grads("mixed_float16"), reference):
        assert rel_err(g, r) < 5e-3


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_long_memory_drift_below_keras(kind):
    """The case the layers exist for: a long-memory gate under mixed_float16."""
    steps, units = 192, 8
    keras.utils.set_random_seed(0)
    weights = built(KERAS[kind], input_shape=(2, steps, F)).get_weights()
    weights = [w * 1.0 for w in weights]  # copies
    u = U
    if kind == "lstm":
        weights[2][u : 2 * u] = 8.0  # forget gate
    else:
        weights[2][0, :u] = 8.0  # update gate
    del units
    x = np.random.default_rng(1).normal(size=(2, steps, F)).astype("float32")
    reference = as_np(
        built(KERAS[kind], weights, (2, steps, F), return_sequences=True)(x)
    )
    keras.mixed_precision.set_global_policy("mixed_float16")
    theirs = as_np(built(KERAS[kind], weights, (2, steps, F), return_sequences=True)(x))
    ours = as_np(built(OURS[kind], weights, (2, steps, F), return_sequences=True)(x))
    tail = slice(-64, None)
    err_ours = rel_err(ours[:, tail], reference[:, tail])
    err_theirs = rel_err(theirs[:, tail], reference[:, tail])
    assert err_ours < 0.5 * err_theirs
    assert err_ours < 2e-3


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_states_and_outputs_dtypes(kind, x):
    keras.mixed_precision.set_global_policy("mixed_float16")
    layer = built(OURS[kind], return_sequences=True, return_state=True, stateful=True)
    outputs = layer(x)
    assert all(o.dtype == "float16" for o in outputs)  # Keras's convention
    assert all(v.dtype == "float32" for v in layer.states)  # the carry


# -- stateful lanes ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_lane_reset_equals_fresh_sequence(kind, policy, x):
    keras.mixed_precision.set_global_policy(policy)
    weights = random_weights(kind)
    first, second = x[:, :4], x[:, 4:]
    stateful = built(
        OURS[kind], weights, (B, 4, F), stateful=True, return_sequences=True
    )
    stateful(first)
    stateful.reset_state(lanes=[1])
    after_reset = as_np(stateful(second))

    plain = built(OURS[kind], weights, return_sequences=True)
    fresh = as_np(plain(second))
    continued = as_np(plain(x))[:, 4:]
    tol = 1e-6 if policy == "float32" else 2e-3
    np.testing.assert_allclose(after_reset[1], fresh[1], atol=tol)
    for lane in (0, 2):
        np.testing.assert_allclose(after_reset[lane], continued[lane], atol=tol)


def test_stateful_float32_carry_is_not_rounded(x):
    """Two chunks through a stateful layer equal one pass, to float32 accuracy."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    weights = random_weights("lstm")
    stateful = built(mp.LSTM, weights, (B, 4, F), stateful=True, return_state=True)
    stateful(x[:, :4])
    _, h_split, c_split = stateful(x[:, 4:])
    plain = built(mp.LSTM, weights, return_state=True)
    plain(x)
    np.testing.assert_allclose(as_np(stateful.states[1]), as_np(plain(x)[2]), atol=2e-3)
    np.testing.assert_allclose(as_np(h_split), as_np(plain(x)[1]), atol=2e-3)


def test_reset_lanes_in_model_resets_every_stateful_layer(x):
    keras.mixed_precision.set_global_policy("mixed_float16")
    inputs = keras.Input(batch_shape=(B, T, F))
    h = mp.LSTM(U, stateful=True, return_sequences=True)(inputs)
    h = keras.layers.Bidirectional(mp.GRU(U, stateful=True, return_sequences=True))(h)
    h = keras.layers.LSTM(U, stateful=True)(h)  # Keras's own layer too
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model(x)  # a direct call: on JAX, predict() does not carry RNN states
    layers = mp.reset_lanes(model, np.array([False, True, False]))
    assert len(layers) == 4
    for layer in layers:
        for state in layer.states:
            values = as_np(state)
            assert np.all(values[1] == 0)
            assert np.any(values[0] != 0) and np.any(values[2] != 0)


def test_reset_lanes_zeroes_non_finite_states(x):
    layer = built(mp.LSTM, input_shape=(B, T, F), stateful=True)
    layer(x)
    layer.states[0].assign(np.full((B, U), np.nan, "float32"))
    layer.reset_state(lanes=[0, 1, 2])
    assert np.all(as_np(layer.states[0]) == 0)


def test_reset_lanes_errors(x):
    layer = built(mp.GRU, input_shape=(B, T, F), stateful=True)
    layer(x)
    with pytest.raises(ValueError, match=r"\[3\].*0\.\.2"):
        layer.reset_state(lanes=[3])
    with pytest.raises(ValueError, match=r"shape \(3,\).*\(2,\)"):
        layer.reset_state(lanes=np.array([True, False]))
    with pytest.raises(ValueError, match="stateful=False"):
        built(mp.GRU).reset_state(lanes=[0])
    plain = keras.Sequential([keras.Input((T, F)), mp.GRU(U)])
    with pytest.raises(ValueError, match="no built stateful recurrent layer"):
        mp.reset_lanes(plain, [0])


# -- serialization -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_get_config_round_trip(kind):
    layer = OURS[kind](
        U,
        return_sequences=True,
        recurrent_precision="split",
        use_cudnn=False,
        dropout=0.1,
        stateful=False,
    )
    config = layer.get_config()
    assert config["recurrent_precision"] == "split"
    assert config["use_cudnn"] is False
    clone = OURS[kind].from_config(config)
    assert clone.get_config() == config
    assert (
        keras.saving.get_registered_name(OURS[kind]) == f"keras_mpfp16>{kind.upper()}"
    )


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_keras_arguments_are_forwarded_unchanged(kind):
    """Every Keras argument reaches Keras's layer as given, positional or not."""
    theirs = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind]
    ours = OURS[kind](U, "relu", "hard_sigmoid", use_bias=False, go_backwards=True)
    reference = theirs(U, "relu", "hard_sigmoid", use_bias=False, go_backwards=True)
    mine = ours.get_config()
    for key, value in reference.get_config().items():
        if key not in ("name",):
            assert mine[key] == value, key
    assert mine["recurrent_precision"] == "float32"
    with pytest.raises(ValueError, match="not_an_argument"):  # Keras checks it
        OURS[kind](U, not_an_argument=1)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_keras_file_round_trip(kind, x, tmp_path):
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((T, F)),
            keras.layers.Bidirectional(
                OURS[kind](U, return_sequences=True, recurrent_precision="compute")
            ),
            OURS[kind](U),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, np.ones((B, 1)), epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.layers[1]) is OURS[kind]
    assert loaded.layers[0].forward_layer.recurrent_precision == "compute"
    np.testing.assert_array_equal(
        model.predict(x, verbose=0), loaded.predict(x, verbose=0)
    )


# -- arguments and the cuDNN path --------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bad_arguments_raise(kind):
    with pytest.raises(
        ValueError,
        match=r"'float32', 'split', 'compute', 'tf32x3'. Received: "
        r"recurrent_precision='float64'",
    ):
        OURS[kind](U, recurrent_precision="float64")
    with pytest.raises(
        ValueError,
        match=r"'float32', 'compute', 'tf32x3'. Received: input_precision='float16'",
    ):
        OURS[kind](U, input_precision="float16")
    with pytest.raises(ValueError, match=r"'auto'.*use_cudnn=yes"):
        OURS[kind](U, use_cudnn="yes")


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_use_cudnn_resolution(kind):
    assert OURS[kind](U).use_cudnn == "auto"
    keras.mixed_precision.set_global_policy("mixed_float16")
    assert OURS[kind](U).use_cudnn is False  # float32 carry instead
    assert OURS[kind](U, use_cudnn=True).use_cudnn is True
    assert OURS[kind](U).get_config()["use_cudnn"] == "auto"


def test_forced_cudnn_gets_compute_dtype_tensors(monkeypatch, x):
    """use_cudnn=True under mixed precision hands Keras's cuDNN op 16-bit tensors."""
    from keras.src import backend as keras_backend

    seen = {}

    def fake_lstm(inputs, h, c, mask, kernel, recurrent_kernel, bias, **kwargs):
        seen.update(
            {
                name: keras.backend.standardize_dtype(t.dtype)
                for name, t in [
                    ("inputs", inputs),
                    ("h", h),
                    ("c", c),
                    ("kernel", kernel),
                ]
            }
        )
        last = keras.ops.zeros((inputs.shape[0], U), inputs.dtype)
        return last, keras.ops.expand_dims(last, 1), [last, last]

    monkeypatch.setattr(keras_backend, "lstm", fake_lstm)
    keras.mixed_precision.set_global_policy("mixed_float16")
    layer = built(mp.LSTM, use_cudnn=True, stateful=True)
    layer(x)
    assert set(seen.values()) == {"float16"}
    assert all(v.dtype == "float32" for v in layer.states)


def test_forced_cudnn_without_gpu_raises(x):
    keras.mixed_precision.set_global_policy("mixed_float16")
    with pytest.raises(ValueError, match="use_cudnn=True"):
        built(mp.LSTM, use_cudnn=True)(x)
