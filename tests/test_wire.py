"""The 16-bit wire format, the step slots and DLPack buffers, in one process.

The in-graph encoder (backend/tf_wire.py) must produce exactly the
numpy encoder's words (runtime/wire.py): ranks may mix the two (the numpy
path serves `allreduce_flat`), and both must keep float16 from flushing tiny
values or overflowing.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_mpfp16.backend import tf_path, tf_sparse, tf_steps, tf_wire
from keras_mpfp16.runtime.mpi import cuda, wire


@pytest.fixture(params=["ops", "fused"])
def codec(request, monkeypatch):
    """Both codec stages of tf_wire: separate ops, and the fused (XLA)
    functions large buckets use (forced here for small rows)."""
    threshold = 0 if request.param == "fused" else 2**62
    monkeypatch.setattr(tf_wire, "FUSED_MIN_ELEMENTS", threshold)
    monkeypatch.setattr(tf_wire, "OWNER_FUSED_MIN_ELEMENTS", threshold)
    return request.param


def sample_rows(rng, rows=9, cols=257):
    x = rng.normal(size=(rows, cols)) * 10.0 ** rng.integers(-12, 8, size=(rows, 1))
    x = x.astype(np.float32)
    x[1] = 0.0  # an all-zero row (padding)
    x[2, :] = 2.0**7  # an exact power of two: the max must land on 2**15 exactly
    x[3, 5] = np.nan
    x[4, 7] = -np.inf
    # Tiny but normal float32 (TensorFlow flushes float32 subnormals to zero,
    # so below 1.2e-38 the graph encoder sees zeros where numpy does not).
    x[5] = rng.normal(size=cols) * 1e-33
    x[6] = np.linspace(1, 2, cols) * 60000  # near float16's max
    return x


@pytest.mark.parametrize("wire_dtype", ["float16", "bfloat16"])
def test_graph_encoder_matches_numpy_encoder_bit_for_bit(wire_dtype, codec):
    rows = sample_rows(np.random.default_rng(0))
    slots = wire.slot_words([3, 123456789012, 17])
    want = wire.encode_rows(rows, wire_dtype, slots)
    got = tf_wire.encode_rows(
        tf.constant(rows), wire_dtype, flag=True, slots=tf.constant(slots)
    ).numpy()
    np.testing.assert_array_equal(got[:, 2:], want[:, 2:])  # exponents, slots, values
    # Flags: numpy computes them for both wires; the graph too when asked.
    np.testing.assert_array_equal(got[:, 1], want[:, 1])
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    assert want[3, 1] == want[4, 1] == wire.FLAG_NONFINITE and want[0, 1] == 0


@pytest.mark.parametrize("wire_dtype", ["float16", "bfloat16"])
def test_graph_decoder_matches_numpy_decoder(wire_dtype, codec):
    rows = sample_rows(np.random.default_rng(1))
    words = wire.encode_rows(rows, wire_dtype)
    flat, finite = tf_wire.decode_rows(tf.constant(words), wire_dtype, 1.0)
    want = wire.decode_rows(words, wire_dtype).reshape(-1)
    np.testing.assert_array_equal(flat.numpy(), want)
    assert not bool(finite)  # rows 3 and 4 carry NaN / Inf
    finite_words = np.delete(words, [3, 4], axis=0)
    assert bool(tf_wire.decode_rows(tf.constant(finite_words), wire_dtype, 1.0)[1])


@pytest.mark.parametrize("scale", [0.5, 1.0 / 3.0])
def test_fused_decode_scales_as_the_separate_ops_do(scale, monkeypatch):
    """The averaging scale (1/N: not a power of two at N = 3) folded into the
    fused decode rounds exactly as the separate ops round it."""
    rows = sample_rows(np.random.default_rng(3))
    rows[3, 5] = rows[4, 7] = 1.0
    words = tf.constant(wire.encode_rows(rows, "float16"))
    monkeypatch.setattr(tf_wire, "FUSED_MIN_ELEMENTS", 2**62)
    want, _ = tf_wire.decode_rows(words, "float16", scale)
    monkeypatch.setattr(tf_wire, "FUSED_MIN_ELEMENTS", 0)
    got, _ = tf_wire.decode_rows(words, "float16", scale)
    np.testing.assert_array_equal(
        got.numpy().view(np.int32), want.numpy().view(np.int32)
    )


def test_fused_encode_flags_a_nan_wherever_it_lies(codec):
    """The row maxima propagate NaN from any position (the fused encode takes
    its non-finite flag from them), next to large values and infinities too."""
    rng = np.random.default_rng(4)
    for cols in (1, 7, 64, 1000, 4099):
        for col in sorted({0, cols // 2, cols - 1}):
            x = rng.normal(size=(3, cols)).astype(np.float32)
            x[1, col] = np.nan
            if cols > 1:
                x[1, (col + 1) % cols] = -np.inf if col % 2 else 1e30
            words = tf_wire.encode_rows(tf.constant(x), "float16", flag=False).numpy()
            np.testing.assert_array_equal(words[:, 1], [0, wire.FLAG_NONFINITE, 0])


def test_float16_rows_neither_flush_nor_overflow():
    tiny = np.full((1, 64), 3e-9, np.float32)  # below float16's smallest subnormal
    huge = np.full((1, 64), 3e6, np.float32)  # far above float16's max
    for x in (tiny, huge):
        words = wire.encode_rows(x, "float16")
        back = wire.decode_rows(words, "float16")
        np.testing.assert_allclose(back, x, rtol=1e-3)
        assert words[0, 1] == 0
    # A row whose max is an exact power of two lands on 2**15, not above.
    words = wire.encode_rows(np.full((1, 4), 2.0**-30, np.float32), "float16")
    assert words[0, 2:].view(np.float16).max() == 2.0**15


def test_owner_sum_in_tensorflow_matches_numpy(codec):
    rng = np.random.default_rng(2)
    for wire_dtype in ("float16", "bfloat16"):
        # Three senders' rows for one owner, each with its own exponent.
        rows = (rng.normal(size=(3, 100)) * [[1e-6], [1.0], [3e4]]).astype(np.float32)
        recv = wire.encode_rows(rows, wire_dtype, wire.slot_words([1, 2]))
        want = wire.owner_sum(recv, wire_dtype, slot_count=8)
        got = tf_wire.owner_sum(tf.constant(recv), wire_dtype, 8).numpy()
        np.testing.assert_array_equal(got[:, :2], want[:, :2])
        np.testing.assert_allclose(
            wire.decode_rows(got, wire_dtype), wire.decode_rows(want, wire_dtype)
        )
        if codec == "fused":  # sums in rank order, as numpy does: bit for bit
            np.testing.assert_array_equal(got, want)
        # A sender's non-finite flag survives into the owner's row.
        recv[1, 1] = wire.FLAG_NONFINITE
        assert tf_wire.owner_sum(tf.constant(recv), wire_dtype, 8).numpy()[0, 1] == 1


def test_step_slots_are_exact_for_large_steps():
    values = np.array([[-1, 0, 2**40 + 3], [7, 2**47 - 1, 0]], np.int64)
    words = np.stack([wire.slot_words(v) for v in values])
    np.testing.assert_array_equal(wire.slots_from_words(words), values)
    pairs = np.stack([wire.float_slots(v).reshape(-1) for v in values]).astype(
        np.float32
    )
    # What an Allreduce does to rank-owned slots: sums with zeros.
    reduced = pairs.reshape(-1) + np.float32(0.0)
    np.testing.assert_array_equal(wire.slots_from_floats(reduced, 2), values)


def test_step_table_errors_name_what_differs():
    # Row counts (the columns after epoch and step) may differ.
    tf_steps.check_step_table(np.array([[0, 5, 3], [0, 5, 9]]), "x")
    with pytest.raises(RuntimeError) as err:
        tf_steps.check_step_table(np.array([[1, 12], [0, 12]]), "bucket 1/1")
    text = str(err.value)
    assert "different epochs at the same train step" in text
    assert "rank 0: train step 12 (epoch 1), rank 1: train step 12 (epoch 0)" in text
    assert "batches" not in text and "steps differ" not in text
    with pytest.raises(RuntimeError) as err:
        tf_steps.check_step_table(np.array([[-1, 4], [-1, 5], [-1, 4]]), "bucket 1/2")
    text = str(err.value)
    assert "train steps differ" in text and "batches" in text
    assert "rank 1: train step 5" in text and "epoch" not in text.split("—")[1][:60]


def test_tensorflow_tensors_reach_mpi_through_dlpack():
    from mpi4py import MPI

    t = tf.range(6, dtype=tf.float32)
    buf = cuda.DLPackBuffer(tf.experimental.dlpack.to_dlpack(t))
    assert buf.__dlpack_device__() == (cuda.KDL_CPU, 0) and not buf.on_device
    out = tf.raw_ops.Empty(shape=[6], dtype=tf.float32, init=False)
    MPI.COMM_SELF.Allreduce(
        buf, cuda.DLPackBuffer(tf.experimental.dlpack.to_dlpack(out))
    )
    np.testing.assert_array_equal(out.numpy(), np.arange(6))


def test_cuda_query_failure_warns_once_and_stages(monkeypatch):
    monkeypatch.delenv(cuda.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(cuda, "_detected", None)

    def broken():
        raise OSError("libmpi.so: cannot read symbols")

    monkeypatch.setattr(cuda, "_query_library", broken)
    with pytest.warns(RuntimeWarning, match="query failed.*cannot read symbols"):
        assert cuda.cuda_aware() is False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cuda.cuda_aware() is False  # said once, not at every call
    assert "cannot read symbols" in cuda.detection()[1]


def test_reduction_path_is_decided_once_and_says_why(monkeypatch):
    monkeypatch.setattr(tf_path, "_path", None)
    monkeypatch.setenv(cuda.ENV_OVERRIDE, "1")
    path = tf_path.reduction_path()
    assert path["path"] == "device" and "KERAS_MPFP16_CUDA_AWARE=1" in path["reason"]
    monkeypatch.setenv(cuda.ENV_OVERRIDE, "0")
    assert tf_path.reduction_path()["path"] == "device"  # decided once
    tf_path._reset_reduction_path()
    assert tf_path.reduction_path()["path"] == "host"
    monkeypatch.delenv(cuda.ENV_OVERRIDE)
    tf_path._reset_reduction_path()
    path = tf_path.reduction_path()
    assert path["path"] == "host" and path["gpus"] == 0 and path["reason"]
    tf_path._reset_reduction_path()


def test_sparse_mode_is_validated(monkeypatch):
    monkeypatch.setenv(tf_sparse.SPARSE_ENV, "sometimes")
    with pytest.raises(ValueError, match="auto, dense, sparse"):
        tf_sparse.sparse_mode()
    assert tf_sparse.sparse_mode("dense") == "dense"


def test_epoch_tensor_follows_set_epoch_at_run_time():
    """The step reads the epoch from a variable `progress.set_epoch` assigns
    (no crossing into Python): a function traced after an epoch was set (as
    `fit` does) traces once and sees every later epoch, also one set inside
    another function's trace."""
    from keras_mpfp16.runtime import progress

    saved = progress.epoch()
    try:
        progress.set_epoch(3)
        read = tf.function(lambda: tf_steps.epoch_tensor())
        assert int(read()) == 3
        progress.set_epoch(7)  # no retrace: the same graph reads the new value
        assert int(read()) == 7
        assert read.experimental_get_tracing_count() == 1

        @tf.function
        def sets_while_traced():
            progress.set_epoch(11)  # Python, at trace time: assigned eagerly
            return tf.constant(0)

        sets_while_traced()
        assert int(read()) == 11
        assert tf_steps.epoch_tensor().dtype == tf.int64
    finally:
        progress.set_epoch(saved)
