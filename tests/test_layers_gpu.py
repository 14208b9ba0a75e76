"""GPU readiness of the mixed-precision layers, tested on a CPU: the path
decision (GPU presence and TF32 read through seams), the float32 cuDNN path's
wiring with the fused kernel seamed, the float32 numerics it relies on
(Keras's float32 layer against our loop: outputs and gradients), and the TF32
emulation behind docs/layers.md's table."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_mpfp16 import layers as mp_layers
from keras_mpfp16.internals import keras as internals
from keras_mpfp16.layers import dispatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "benchmarks"))
import tf32_emulation  # noqa: E402


@pytest.fixture
def mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def gpu(monkeypatch):
    """Say a TensorFlow GPU is present (and TF32 off unless a test says)."""
    monkeypatch.setattr(dispatch, "gpu_query", lambda: True)
    monkeypatch.setattr(dispatch, "tf32_query", lambda: False)


# -- the decision ------------------------------------------------------------


@pytest.mark.parametrize(
    "half, requested, inp, rec, args_ok, gpu_here, expected",
    [
        (False, "auto", "float32", "float32", True, True, "keras"),
        (False, True, "float32", "float32", True, False, "keras"),
        (True, "auto", "float32", "float32", True, True, "cudnn-float32"),
        (True, "auto", "float32", "float32", True, False, "loop"),  # CPU
        (True, "auto", "float32", "float32", False, True, "loop"),  # arguments
        (True, "auto", "compute", "float32", True, True, "loop"),  # products
        (True, "auto", "float32", "split", True, True, "loop"),
        (True, "auto", "float32", "compute", True, True, "loop"),
        (True, False, "float32", "float32", True, True, "loop"),
        (True, True, "float32", "float32", True, True, "cudnn-compute"),
        (True, True, "compute", "compute", True, False, "cudnn-compute"),
    ],
)
def test_choose_path(half, requested, inp, rec, args_ok, gpu_here, expected):
    assert (
        dispatch.choose_path(
            half_compute=half,
            requested=requested,
            input_precision=inp,
            recurrent_precision=rec,
            arguments_ok=args_ok,
            gpu=gpu_here,
        )
        == expected
    )


@pytest.mark.parametrize(
    "cls, kwargs, expected",
    [
        (mp_layers.LSTM, {}, "cudnn-float32"),
        (mp_layers.GRU, {}, "cudnn-float32"),
        (mp_layers.LSTM, {"activation": "relu"}, "loop"),
        (mp_layers.LSTM, {"recurrent_activation": "hard_sigmoid"}, "loop"),
        (mp_layers.LSTM, {"unroll": True}, "loop"),
        (mp_layers.LSTM, {"use_bias": False}, "loop"),
        (mp_layers.LSTM, {"recurrent_dropout": 0.1}, "loop"),
        (mp_layers.GRU, {"reset_after": False}, "loop"),
        (mp_layers.LSTM, {"dropout": 0.1}, "cudnn-float32"),
        (mp_layers.LSTM, {"recurrent_precision": "split"}, "loop"),
        (mp_layers.GRU, {"input_precision": "compute"}, "loop"),
        (mp_layers.LSTM, {"use_cudnn": False}, "loop"),
        (mp_layers.LSTM, {"use_cudnn": True}, "cudnn-compute"),
    ],
)
def test_recurrence_path_per_argument_combination(
    cls, kwargs, expected, mixed_float16, gpu
):
    layer = cls(4, **kwargs)
    assert layer.recurrence_path == expected
    # `use_cudnn` keeps telling Keras's Bidirectional not to take its own
    # compute-dtype fused path under "auto".
    assert layer.use_cudnn is (True if kwargs.get("use_cudnn") is True else False)


def test_recurrence_path_on_cpu_and_under_float32(mixed_float16, monkeypatch):
    monkeypatch.setattr(dispatch, "gpu_query", lambda: False)
    assert mp_layers.LSTM(4).recurrence_path == "loop"
    monkeypatch.setattr(dispatch, "gpu_query", lambda: True)
    assert mp_layers.LSTM(4, dtype="float32").recurrence_path == "keras"


# -- the float32 cuDNN path, with the fused kernel seamed ---------------------


def _fake_fused(kind, calls):
    """A fused kernel that records what it is handed and returns zeros + 1."""

    def kernel(sequences, *args, **kwargs):
        n_states = 2 if kind == "lstm" else 1
        states = list(args[:n_states])
        calls.append(
            {
                "dtypes": {
                    keras.backend.standardize_dtype(t.dtype)
                    for t in [sequences, *states]
                    + [kwargs["kernel"], kwargs["recurrent_kernel"], kwargs["bias"]]
                },
                "go_backwards": kwargs["go_backwards"],
                "return_sequences": kwargs["return_sequences"],
                "mask": args[n_states],
            }
        )
        units = kwargs["recurrent_kernel"].shape[0]
        batch, time = sequences.shape[0], sequences.shape[1]
        outputs = tf.ones((batch, time, units), "float32") * 0.25
        new_states = [s + 1.0 for s in states]
        return outputs[:, -1], outputs, new_states

    return kernel


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_float32_path_hands_the_kernel_float32_and_casts_back(
    kind, mixed_float16, gpu, monkeypatch
):
    calls = []
    monkeypatch.setitem(internals._fused, kind, _fake_fused(kind, calls))
    cls = mp_layers.LSTM if kind == "lstm" else mp_layers.GRU
    layer = cls(3, return_sequences=True, return_state=True, go_backwards=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    output, *states = layer(x, mask=mask)
    (call,) = calls
    assert call["dtypes"] == {"float32"}
    assert call["go_backwards"] is True and call["return_sequences"] is True
    assert call["mask"] is not None
    assert keras.backend.standardize_dtype(output.dtype) == "float16"
    np.testing.assert_array_equal(np.asarray(output, "float32"), 0.25)
    for s in states:
        assert keras.backend.standardize_dtype(s.dtype) == "float16"
        np.testing.assert_array_equal(np.asarray(s, "float32"), 1.0)
    assert layer.supports_jit is False  # cuDNN ops do not compile with XLA


def test_float32_path_keeps_stateful_state_in_float32(mixed_float16, gpu, monkeypatch):
    calls = []
    monkeypatch.setitem(internals._fused, "lstm", _fake_fused("lstm", calls))
    layer = mp_layers.LSTM(3, stateful=True)
    x = np.zeros((2, 5, 4), "float32")
    layer(x)
    layer(x)
    assert len(calls) == 2 and calls[1]["dtypes"] == {"float32"}
    for v in layer.states:
        assert keras.backend.standardize_dtype(v.dtype) == "float32"
        np.testing.assert_array_equal(np.asarray(v), 2.0)  # +1 per call, float32


def test_float32_path_falls_back_to_the_loop_without_a_kernel(mixed_float16, gpu):
    # On this CPU Keras's fused kernel raises NotImplementedError: the layer
    # must run its loop and give the loop's numbers.
    x = np.random.default_rng(1).normal(size=(2, 6, 4)).astype("float32")
    layer = mp_layers.LSTM(3, return_sequences=True)
    assert layer.recurrence_path == "cudnn-float32"
    y = np.asarray(layer(x), "float32")
    loop = mp_layers.LSTM(3, return_sequences=True, use_cudnn=False)
    loop.build(x.shape)
    loop.set_weights(layer.get_weights())
    np.testing.assert_array_equal(y, np.asarray(loop(x), "float32"))


# -- the numerics the float32 path relies on ----------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_keras_float32_layer_equals_our_loop_outputs_and_gradients(
    kind, go_backwards, mixed_float16
):
    """What cuDNN in float32 computes is Keras's float32 layer; with our
    weights it equals our float32-carry loop within float32 rounding."""
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(3, 40, 5)).astype("float32"))
    ours_cls = mp_layers.LSTM if kind == "lstm" else mp_layers.GRU
    keras_cls = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
    ours = ours_cls(6, return_sequences=True, go_backwards=go_backwards)
    ours.build(x.shape)
    theirs = keras_cls(
        6, return_sequences=True, go_backwards=go_backwards, dtype="float32"
    )
    theirs.build(x.shape)
    theirs.set_weights(ours.get_weights())
    n_states = 2 if kind == "lstm" else 1
    h0 = [tf.constant(rng.normal(size=(3, 6)).astype("float32")) * 0.1] * n_states
    weights = rng.normal(size=(n_states, 3, 6)).astype("float32")

    def run(layer):
        with tf.GradientTape() as tape:
            last, outputs, states = layer.inner_loop(x, list(h0), None)
            states = keras.tree.flatten(states)
            loss = sum(tf.reduce_sum(s * w) for s, w in zip(states, weights))
        grads = tape.gradient(loss, layer.trainable_weights)
        return [np.asarray(s) for s in states], [np.asarray(g) for g in grads]

    our_states, our_grads = run(ours)
    their_states, their_grads = run(theirs)
    for a, b in zip(our_states, their_states):
        assert a.dtype == np.float32 and b.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    for a, b in zip(our_grads, their_grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# -- TF32 ---------------------------------------------------------------------


def seam_device(monkeypatch, *, gpu: bool) -> None:
    """Rank 0 of a job, TF32 on, compute capability 8.0, on a GPU or not;
    the notice not yet given."""
    monkeypatch.setattr(dispatch, "gpu_query", lambda: gpu)
    monkeypatch.setattr(dispatch, "tf32_query", lambda: True)
    monkeypatch.setattr(dispatch, "capability_query", lambda: (8, 0))
    monkeypatch.setattr(dispatch, "rank_query", lambda: 0)
    monkeypatch.setattr(dispatch, "_tf32_noticed", False)


@pytest.fixture
def tf32_gpu(monkeypatch):
    """Rank 0 of a job on an Ampere GPU with TF32 on, the notice not yet given."""
    seam_device(monkeypatch, gpu=True)


def test_tf32_notice_once_on_a_gpu_with_tf32(
    mixed_float16, tf32_gpu, monkeypatch, caplog
):
    monkeypatch.setattr(dispatch, "tf32_query", lambda: False)
    assert not dispatch.notice_tf32("cudnn-float32", "float32", "float32")
    monkeypatch.setattr(dispatch, "tf32_query", lambda: True)
    assert not dispatch.notice_tf32("keras", "float32", "float32")
    assert not dispatch.notice_tf32("loop", "compute", "compute")
    with caplog.at_level(logging.WARNING, logger="keras_mpfp16.layers"):
        assert dispatch.notice_tf32("loop", "float32", "split")
        assert not dispatch.notice_tf32("cudnn-float32", "float32", "float32")
    (record,) = caplog.records
    assert "enable_tensor_float_32_execution(False)" in record.getMessage()


@pytest.mark.parametrize(
    "capability, applies",
    [
        ((7, 0), False),  # V100: TensorFlow says TF32 is on; it has none
        ((7, 5), False),  # T4
        ((8, 0), True),  # A100
        ((8, 6), True),
        ((9, 0), True),  # H100
        (None, True),  # not reported: it may apply, so say it
    ],
)
def test_tf32_notice_only_where_the_gpu_has_tf32(
    mixed_float16, tf32_gpu, monkeypatch, caplog, capability, applies
):
    monkeypatch.setattr(dispatch, "capability_query", lambda: capability)
    assert dispatch.tf32_applies() is applies
    with caplog.at_level(logging.WARNING, logger="keras_mpfp16.layers"):
        assert dispatch.notice_tf32("loop", "float32", "float32") is applies
    assert len(caplog.records) == int(applies)


def test_tf32_notice_on_rank_0_only(mixed_float16, tf32_gpu, monkeypatch, caplog):
    """One copy per job: every rank builds the same model."""
    with caplog.at_level(logging.WARNING, logger="keras_mpfp16.layers"):
        for rank in (3, 1):
            monkeypatch.setattr(dispatch, "rank_query", lambda: rank)
            monkeypatch.setattr(dispatch, "_tf32_noticed", False)
            assert not dispatch.notice_tf32("cudnn-float32", "float32", "float32")
            assert not caplog.records
        monkeypatch.setattr(dispatch, "rank_query", lambda: 0)
        monkeypatch.setattr(dispatch, "_tf32_noticed", False)
        assert dispatch.notice_tf32("cudnn-float32", "float32", "float32")
    assert len(caplog.records) == 1


def test_tf32_notice_asks_the_rank_without_mpi(monkeypatch):
    """The default rank seam is the launcher's rank (no collective call: a
    layer may be built on one rank alone)."""
    from keras_mpfp16.runtime.mpi import world

    assert dispatch.rank_query is world.launched_rank


def test_no_tf32_notice_on_a_cpu(monkeypatch):
    seam_device(monkeypatch, gpu=False)
    assert not dispatch.notice_tf32("loop", "float32", "float32")


def test_round_to_tf32_is_round_to_nearest_even_at_10_bits():
    one = np.float32(1.0)
    ulp = np.float32(2.0**-10)  # TF32's spacing at 1
    cases = {
        one + ulp / 2: one,  # a tie rounds to the even neighbour (down)
        one + ulp + ulp / 2: one + 2 * ulp,  # a tie rounds to even (up)
        one + ulp / 2 + np.float32(2.0**-20): one + ulp,  # above the tie
        np.float32(-3.0e-30): np.float32(-3.0e-30),
        np.float32(3.0e38): np.float32(3.0e38),
    }
    x = np.array(list(cases), np.float32)
    expected = tf32_emulation.round_to_tf32_numpy(x)
    np.testing.assert_array_equal(expected[:3], np.array(list(cases.values()))[:3])
    rng = np.random.default_rng(3)
    x = np.concatenate([x, rng.normal(size=10000).astype(np.float32) * 1e3])
    got = np.asarray(tf32_emulation.round_to_tf32(x))
    np.testing.assert_array_equal(got, tf32_emulation.round_to_tf32_numpy(x))
    # At most 10 mantissa bits survive, and the error is at most half a TF32 ulp.
    assert np.all((got.view(np.uint32) & 0x1FFF) == 0)
    rel = np.abs(got - x) / np.abs(x)
    assert rel.max() <= 2.0**-11


def test_emulated_tf32_rounds_only_the_chosen_float32_products():
    x = tf.constant(np.random.default_rng(4).normal(size=(2, 7, 5)), "float32")
    layer = keras.layers.LSTM(3, dtype="float32")
    layer.build(x.shape)
    exact = np.asarray(layer(x))
    with tf32_emulation.emulated_tf32(("recurrent",), recurrent_rows=3) as counts:
        rounded = np.asarray(layer(x))
    assert counts["recurrent"] > 0 and counts["input"] == 0
    assert not np.array_equal(exact, rounded)
    np.testing.assert_allclose(exact, rounded, rtol=0.02, atol=2e-3)
    assert keras.ops.matmul is tf32_emulation._src_ops.matmul  # restored
    np.testing.assert_array_equal(np.asarray(layer(x)), exact)


# -- XLA ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_jit_compile_keeps_xla_and_the_numbers(policy):
    """`jit_compile=True` with both layers: Keras keeps XLA on (the model
    compiles), and three training steps give the same losses and predictions
    as without XLA, within float32 rounding."""
    keras.config.set_dtype_policy(policy)
    try:
        rng = np.random.default_rng(5)
        x = rng.normal(size=(4, 20, 5)).astype("float32")
        y = rng.normal(size=(4, 1)).astype("float32")
        results = {}
        for jit in (False, True):
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [
                    keras.Input((20, 5)),
                    mp_layers.LSTM(8, return_sequences=True),
                    mp_layers.GRU(8),
                    keras.layers.Dense(1, dtype="float32"),
                ]
            )
            model.compile(optimizer="adam", loss="mse", jit_compile=jit)
            losses = [float(model.train_on_batch(x, y)) for _ in range(3)]
            results[jit] = (losses, np.asarray(model.predict_on_batch(x)))
            assert model.jit_compile is jit
    finally:
        keras.config.set_dtype_policy("float32")
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-5)
    np.testing.assert_allclose(
        results[True][1], results[False][1], rtol=1e-4, atol=1e-5
    )


# -- "tf32x3": float32 accuracy from TF32 products -----------------------------


def test_split_tf32_is_exact_and_tf32x3_survives_tf32_rounding():
    from keras_mpfp16.layers.precision import split_tf32, tf32x3_matmul

    rng = np.random.default_rng(6)
    x = tf.constant(rng.normal(size=(8, 32)).astype("float32"))
    w = tf.constant(rng.normal(size=(32, 64)).astype("float32"))
    high, low = (np.asarray(t) for t in split_tf32(x))
    np.testing.assert_array_equal(high + low, np.asarray(x))
    np.testing.assert_array_equal(tf32_emulation.round_to_tf32_numpy(high), high)
    exact = np.asarray(x, "float64") @ np.asarray(w, "float64")

    def error(y):
        return np.abs(np.asarray(y, "float64") - exact).max() / np.abs(exact).max()

    plain_f32 = error(x @ w)
    with tf32_emulation.emulated_tf32(("input",), recurrent_rows=-1) as counts:
        plain_tf32 = error(keras.ops.matmul(x, w))
        three = error(tf32x3_matmul(x, split_tf32(w)))
    assert counts["input"] == 4  # the plain product and the three
    assert plain_tf32 > 100 * plain_f32  # TF32 rounding is visible
    assert three < 4 * plain_f32 + 1e-7  # and tf32x3 removes it
    # The gradient is the plain product's.
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        a = tf.reduce_sum(tf32x3_matmul(x, split_tf32(w)) ** 2)
        b = tf.reduce_sum((x @ w) ** 2)
    for v in (x, w):
        np.testing.assert_allclose(
            np.asarray(tape.gradient(a, v)),
            np.asarray(tape.gradient(b, v)),
            rtol=1e-5,
            atol=1e-4,
        )


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_tf32x3_layer_under_emulated_tf32_matches_float32_products(kind, mixed_float16):
    """Our layer with `"tf32x3"` products, run with every float32 product
    rounded to TF32, gives the float32 carry of the `"float32"` products run
    without TF32 (within float32 rounding); plain `"float32"` products under
    TF32 do not."""
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(3, 60, 5)).astype("float32"))
    cls = mp_layers.LSTM if kind == "lstm" else mp_layers.GRU
    n_states = 2 if kind == "lstm" else 1
    h0 = [tf.zeros((3, 6))] * n_states

    def final_states(precision, tf32_on):
        layer = cls(6, input_precision=precision, recurrent_precision=precision)
        layer.build(x.shape)
        layer.set_weights(reference)
        sites = ("input", "recurrent") if tf32_on else ()
        with tf32_emulation.emulated_tf32(sites, recurrent_rows=6):
            _, _, states = layer.inner_loop(x, list(h0), None)
        return np.concatenate([np.asarray(s) for s in keras.tree.flatten(states)])

    seed = cls(6)
    seed.build(x.shape)
    reference = seed.get_weights()
    f32 = final_states("float32", tf32_on=False)
    three = final_states("tf32x3", tf32_on=True)
    plain = final_states("float32", tf32_on=True)
    np.testing.assert_allclose(three, f32, rtol=1e-5, atol=1e-6)
    assert np.abs(plain - f32).max() > 10 * np.abs(three - f32).max()
