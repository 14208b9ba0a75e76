"""Sparse (IndexedSlices) gradients: the selection rule and the local pieces."""

import numpy as np
import pytest
import tensorflow as tf

from keras_mpfp16.backend import tf_sparse
from keras_mpfp16.backend.buckets import sparse_is_cheaper


def test_gather_is_chosen_only_when_it_moves_fewer_bytes():
    # IMDB-shaped: 20000 x 128 embedding, 2 ranks, ~2,000 distinct tokens each.
    assert sparse_is_cheaper(4000, 128, 20000, 4)
    # Rows plus their 4-byte index versus the dense tensor, exactly at the edge:
    # 129 rows * (128*4 + 4) bytes = 66,564 > 130 * 128 * 4 = 66,560.
    assert not sparse_is_cheaper(129, 128, 130, 4)
    assert sparse_is_cheaper(128, 128, 130, 4)
    # A 16-bit wire halves the dense side, so gathering must beat half.
    # 11000 * 516 = 5.68 MB: below 10.24 MB (float32), above 5.12 MB (16-bit).
    assert sparse_is_cheaper(11000, 128, 20000, 4)
    assert not sparse_is_cheaper(11000, 128, 20000, 2)
    # Every rank touching the whole vocabulary: dense.
    assert not sparse_is_cheaper(40000, 128, 20000, 4)


def test_rule_evaluates_on_tensors_like_on_integers():
    for total in (0, 4000, 11000, 40000):
        want = sparse_is_cheaper(total, 128, 20000, 2)
        got = sparse_is_cheaper(tf.constant(total, tf.int64), 128, 20000, 2)
        assert bool(got.numpy()) == want


def test_local_dense_form_sums_repeated_rows():
    """The dense fallback of a sparse gradient equals TensorFlow's densifying."""
    values = tf.constant(np.arange(12, dtype=np.float32).reshape(6, 2))
    grad = tf.IndexedSlices(values, tf.constant([4, 1, 4, 0, 1, 4]), [6, 2])
    s = tf_sparse.SparseGradient(0, grad, tf.TensorShape([6, 2]))
    dense = s.local_dense().numpy().reshape(6, 2)
    np.testing.assert_array_equal(dense, tf.convert_to_tensor(grad).numpy())


@pytest.mark.parametrize("seed", [0, 1])
def test_cpu_segment_sum_adds_in_input_order(seed):
    """Every rank densifies the same gathered slices (TensorFlow's IndexedSlices
    -> dense conversion is an unsorted segment sum): same input order, same
    bits on every rank, as long as the sum runs in input order (CPU)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 50, size=3000).astype(np.int32)
    vals = (rng.normal(size=(3000, 3)) * 10.0 ** rng.integers(-4, 4, (3000, 1))).astype(
        np.float32
    )
    want = np.zeros((50, 3), np.float32)
    for i, v in zip(idx, vals):  # strictly sequential float32 adds
        want[i] += v
    got = tf.math.unsorted_segment_sum(vals, idx, 50).numpy()
    np.testing.assert_array_equal(got, want)
