"""Shard arithmetic (pure functions) and `shard` on arrays and datasets, in one
process with explicit `rank`/`num_ranks`."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_mpfp16.data import (
    ShardedPyDataset,
    shard,
    shard_indices,
    shard_sizes,
    steps_per_epoch,
)


def rows(n, r, size, **kw):
    return np.arange(n)[shard_indices(n, r, size, **kw)]


CASES = list(
    itertools.product(
        [1, 2, 3, 5, 17, 100, 101, 1000],  # rows
        [1, 2, 3, 8],  # ranks
        [None, 1, 4, 32],  # batch size
        [True, False],  # drop_remainder
    )
)


@pytest.mark.parametrize("n, size, b, drop", CASES)
def test_shards_are_disjoint_ordered_and_cover_what_they_keep(n, size, b, drop):
    sizes = shard_sizes(n, size, batch_size=b, drop_remainder=drop)
    parts = [rows(n, r, size, batch_size=b, drop_remainder=drop) for r in range(size)]
    assert [len(p) for p in parts] == sizes
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union)  # disjoint
    for p in parts:
        assert (np.diff(p) > 0).all()  # original order
    block = b or 1
    if drop:
        # Equal rows (so equal steps for any batch size), only the last
        # n mod (N*b) rows dropped.
        assert len(set(sizes)) == 1
        assert sorted(union.tolist()) == list(range(n - n % (size * block)))
    else:
        assert sorted(union.tolist()) == list(range(n))  # nothing dropped
        assert max(sizes) - min(sizes) <= block


@pytest.mark.parametrize("n, size, b", [(96, 3, 4), (100, 2, 8), (37, 3, 2)])
def test_kth_batches_of_all_ranks_are_the_kth_global_batch(n, size, b):
    for block in (None, b):
        parts = [rows(n, r, size, batch_size=block) for r in range(size)]
        for k in range(len(parts[0]) // b):
            together = sorted(np.concatenate([p[k * b : (k + 1) * b] for p in parts]))
            assert together == list(range(k * size * b, (k + 1) * size * b))


def test_documented_examples():
    assert shard_sizes(10, 3) == [3, 3, 3]
    assert shard_sizes(10, 3, drop_remainder=False) == [4, 3, 3]
    assert shard_sizes(100, 3, batch_size=16, drop_remainder=False) == [36, 32, 32]
    assert shard_sizes(100, 3, batch_size=16) == [32, 32, 32]
    assert [steps_per_epoch(s, 16) for s in [36, 32, 32]] == [3, 2, 2]


def test_single_row_blocks_are_strided_views():
    index = shard_indices(10, 1, 3)
    assert index == slice(1, 10, 3)
    x = np.arange(20).reshape(10, 2)
    xs = shard(x, rank=1, num_ranks=3)
    assert np.shares_memory(xs, x)
    np.testing.assert_array_equal(xs[:, 0], [2, 8, 14])


def test_shard_keeps_rows_together_across_arrays_and_structures():
    n = 11
    x = {"a": np.arange(n), "b": np.arange(n) * 10}
    y = np.arange(n) * 100
    w = list(np.arange(n) * 1000)  # an array-like
    xs, ys, ws = shard(x, y, w, rank=1, num_ranks=2, batch_size=2)
    np.testing.assert_array_equal(xs["a"], [2, 3, 6, 7])
    np.testing.assert_array_equal(xs["b"], xs["a"] * 10)
    np.testing.assert_array_equal(ys, xs["a"] * 100)
    np.testing.assert_array_equal(ws, xs["a"] * 1000)


def test_one_argument_gives_one_value():
    out = shard(np.arange(6), rank=0, num_ranks=2)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, [0, 2, 4])


def test_different_lengths_name_the_lengths():
    with pytest.raises(ValueError, match=r"argument 0: 10, argument 1: 9"):
        shard(np.zeros(10), np.zeros(9), rank=0, num_ranks=2)
    with pytest.raises(ValueError, match=r"argument 0\['a'\]: 4, argument 0\['b'\]: 5"):
        shard({"a": np.zeros(4), "b": np.zeros(5)}, rank=0, num_ranks=2)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: shard(np.zeros(2), rank=0, num_ranks=3), "leave rank 0 without data"),
        (
            lambda: shard(np.zeros(5), rank=0, num_ranks=2, batch_size=4),
            "leave rank 0 without data",
        ),
        (
            lambda: shard(np.zeros(4), rank=2, num_ranks=2),
            r"`rank`: expected an integer in \[0, 1\]. Received: rank=2",
        ),
        (
            lambda: shard(np.zeros(4), rank=0, num_ranks=0),
            "`num_ranks`: expected an integer >= 1. Received: num_ranks=0",
        ),
        (
            lambda: shard(np.zeros(4), rank=0, num_ranks=2, batch_size=0),
            "`batch_size`: expected None or an integer >= 1. Received: batch_size=0",
        ),
        (lambda: shard(), "at least one"),
        (lambda: shard(np.float32(3.0), rank=0, num_ranks=1), "is a scalar"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_tf_dataset_equal_elements_and_no_loss_for_validation():
    ds = tf.data.Dataset.range(10)
    parts = [list(shard(ds, rank=r, num_ranks=3).as_numpy_iterator()) for r in range(3)]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # 9 dropped: equal steps
    parts = [
        list(shard(ds, rank=r, num_ranks=3, drop_remainder=False).as_numpy_iterator())
        for r in range(3)
    ]
    assert parts == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    batched = tf.data.Dataset.range(10).batch(2)  # whole batches are dealt
    got = [b.tolist() for b in shard(batched, rank=1, num_ranks=2).as_numpy_iterator()]
    assert got == [[2, 3], [6, 7]]


def test_tf_dataset_of_unknown_length():
    ds = tf.data.Dataset.range(10).filter(lambda v: v % 2 == 0)
    with pytest.raises(ValueError, match="cardinality is unknown"):
        shard(ds, rank=0, num_ranks=2)
    got = list(shard(ds, rank=1, num_ranks=2, drop_remainder=False).as_numpy_iterator())
    assert got == [2, 6]
    with pytest.raises(ValueError, match="batch_size applies to arrays"):
        shard(tf.data.Dataset.range(4), rank=0, num_ranks=2, batch_size=2)
    with pytest.raises(ValueError, match="either arrays or a single dataset"):
        shard(tf.data.Dataset.range(4), np.zeros(4), rank=0, num_ranks=2)


class Batches(keras.utils.PyDataset):
    def __init__(self, n, **kw):
        super().__init__(**kw)
        self.n, self.epochs_ended = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 1), i, "float32"), np.zeros((2, 1), "float32")

    def on_epoch_end(self):
        self.epochs_ended += 1


def test_py_dataset_batches_dealt_round_robin():
    base = Batches(7, workers=2, max_queue_size=3)
    parts = [shard(base, rank=r, num_ranks=3) for r in range(3)]
    assert all(isinstance(p, ShardedPyDataset) for p in parts)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert [int(p[i][0][0, 0]) for p in parts for i in range(len(p))] == [
        0,
        3,
        1,
        4,
        2,
        5,
    ]
    assert parts[0].workers == 2 and parts[0].max_queue_size == 3
    keep = [shard(base, rank=r, num_ranks=3, drop_remainder=False) for r in range(3)]
    assert [len(p) for p in keep] == [3, 2, 2]
    assert int(keep[0][2][0][0, 0]) == 6
    with pytest.raises(IndexError):
        keep[1][2]
    keep[0].on_epoch_end()
    assert base.epochs_ended == 1


def test_py_dataset_trains():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(shard(Batches(6), rank=1, num_ranks=2), epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1


# -- the same-data check (the real multi-process check: test_mpi_shard_check.py)


def test_check_argument_is_validated():
    x = np.arange(12.0)
    with pytest.raises(ValueError, match="check"):
        shard(x, check="yes")
    # One process: nothing to compare, no collective; explicit rank/num_ranks
    # (an offline layout) is never checked either.
    assert np.array_equal(shard(x, check=True), x)
    assert np.array_equal(shard(x, rank=1, num_ranks=3, check=True), x[1::3])


def test_mismatch_message_names_the_ranks_and_the_fix(monkeypatch):
    import importlib

    fp = importlib.import_module("keras_mpfp16.data.fingerprint")
    shard_module = importlib.import_module("keras_mpfp16.data.shard")

    x = np.arange(12.0)
    same, other = fp.fingerprint_arrays(x), fp.fingerprint_arrays(x + 1)
    # The O(1)-byte agreement says "differ"; the fingerprints are then
    # gathered for the message.
    monkeypatch.setattr(
        shard_module.collectives, "same_on_all_ranks", lambda value, name=None: False
    )
    monkeypatch.setattr(
        shard_module.collectives,
        "allgather_object",
        lambda value, name=None: [same, other, same, other],
    )
    with pytest.raises(ValueError) as info:
        shard_module.check_same_data((x,), dataset=False)
    message = str(info.value)
    assert "ranks 0, 2 hold version 1; ranks 1, 3 hold version 2" in message
    assert "same shapes and dtypes, different contents" in message
    assert "seed" in message and "check=False" in message
    monkeypatch.setattr(
        shard_module.collectives,
        "allgather_object",
        lambda value, name=None: [same, fp.fingerprint_arrays(x[:-1])],
    )
    with pytest.raises(ValueError, match="shapes or dtypes differ"):
        shard_module.check_same_data((x,), dataset=False)


def test_fingerprint_samples_only_large_arrays():
    import importlib

    fp = importlib.import_module("keras_mpfp16.data.fingerprint")

    rows = fp.FULL_HASH_BYTES // (64 * 4) + 10  # just over the limit
    x = np.zeros((rows, 64), np.float32)
    base = fp.fingerprint_arrays(x)
    step = int(x.nbytes // fp.FULL_HASH_BYTES) + 1
    read = x.copy()
    read[step, 0] = 1.0  # a row it reads: caught
    assert fp.fingerprint_arrays(read) != base
    unread = x.copy()
    unread[1, 0] = 1.0  # a row it skips: documented as not caught
    assert fp.fingerprint_arrays(unread) == base
    small = np.zeros((10, 64), np.float32)
    changed = small.copy()
    changed[1, 0] = 1.0  # under the limit every byte counts
    assert fp.fingerprint_arrays(changed) != fp.fingerprint_arrays(small)
    # A strided view gives the fingerprint of its values.
    wide = np.zeros((rows, 128), np.float32)
    assert fp.fingerprint_arrays(wide[:, ::2]) == base


def test_tf_data_fingerprint_reads_several_small_elements():
    """The CI failure of stop 35: two unseeded shuffles of 60 rows that start
    with the same row. One element read, they looked the same; the leading
    elements tell them apart. Large elements stop the read after one."""
    import importlib

    fp = importlib.import_module("keras_mpfp16.data.fingerprint")

    rows_ = np.arange(60, dtype=np.float32).reshape(60, 1)
    order_a = np.arange(60)
    order_b = np.concatenate([[0], np.arange(59, 0, -1)])  # same first row
    a = tf.data.Dataset.from_tensor_slices(rows_[order_a])
    b = tf.data.Dataset.from_tensor_slices(rows_[order_b])
    assert fp.first_element_crc(a) == fp.first_element_crc(b)
    assert fp.fingerprint(a) != fp.fingerprint(b)
    assert fp.fingerprint(a) == fp.fingerprint(
        tf.data.Dataset.from_tensor_slices(rows_[order_a])
    )
    crc, count = fp.leading_elements_crc(a)
    assert count == fp.LEADING_ELEMENTS
    big = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2**18 + 1), np.float32))
    assert fp.leading_elements_crc(big)[1] == 1
    assert fp.leading_elements_crc(a.take(3))[1] == 3
