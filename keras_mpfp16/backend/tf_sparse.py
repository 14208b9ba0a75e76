"""Sparse (`tf.IndexedSlices`) gradients: the mode and the gathered slices.

A sparse gradient (Embedding) is reduced by an allgather of every rank's
(index, row) slices when that moves fewer bytes than the dense tensor
(`backend/buckets.py`'s rule, decided from the allgathered slice counts, the
same on every rank), else densely through a bucket reduction. Gathered
slices reach the inner optimizer as the `tf.IndexedSlices` one process would
have computed on the whole batch.
"""

from __future__ import annotations

import tensorflow as tf

from keras_mpfp16 import _settings as env
from keras_mpfp16.backend.tf_order import ordered
from keras_mpfp16.backend.tf_path import aligned_empty, host_finite
from keras_mpfp16.runtime.mpi import collectives, cuda, world

SPARSE_ENV = env.setting("SPARSE_GRADIENTS").name
SPARSE_MODES = env.setting("SPARSE_GRADIENTS").choices


def sparse_mode(mode: str | None = None) -> str:
    """`mode`, else `$KERAS_MPFP16_SPARSE_GRADIENTS`, else `"auto"` (validated)."""
    if mode is None:
        return env.get("SPARSE_GRADIENTS")  # validated there
    if mode not in SPARSE_MODES:
        raise ValueError(
            f"sparse={mode!r} is not understood; allowed values are {', '.join(SPARSE_MODES)}."
        )
    return mode


def reduced_as_slices(grad, shape: tf.TensorShape, mode: str) -> bool:
    """Whether `grad` is kept sparse (a `SparseGradient`) rather than densified
    into the buckets: an IndexedSlices, outside `"dense"` mode, whose row
    indices fit the int32 index the gathered records carry."""
    return (
        isinstance(grad, tf.IndexedSlices)
        and mode != "dense"
        and shape.rank >= 1
        and shape[0] < 2**31
    )


def _sparse_host(label: str, row_width: int):
    """numpy_function body: allgather of (index, row) records of uneven counts."""

    def gather(records, counts, step):
        name = f"{label}, train step {int(step)}"
        rows = int(counts.sum())
        out = aligned_empty(rows * row_width).reshape(rows, row_width)
        collectives.allgatherv_bytes(records, out, counts * (row_width * 4), name)
        cuda.path_counts["host"] += 1
        return out, host_finite(out[:, 1:])

    return gather


class SparseGradient:
    """An IndexedSlices gradient, reduced as the slices one process would see.

    Every rank contributes its slices as they are (one per lookup, repeated
    indices included) and receives every rank's, so the inner optimizer gets
    the `tf.IndexedSlices` one process computes on the concatenated batch.
    That matters beyond the sum: Keras's optimizers square the *slices* of a
    sparse gradient (Adam's second moment adds the squares of repeated
    rows, not the square of their sum), so densifying or deduplicating the
    gradient would change the training trajectory (measured: the IMDB
    stand-in's Adam run collapses within an epoch with a densified Embedding
    gradient, also in one process). The slice count depends only on the
    indices (known after the forward pass), so the first bucket can carry
    it while backprop still runs.
    """

    def __init__(self, index: int, grad: tf.IndexedSlices, shape: tf.TensorShape):
        self.index = index
        self.shape = shape
        self.dtype = grad.values.dtype
        self.num_rows = int(shape[0])
        self.row_elems = int(shape[1:].num_elements())
        self.rows = tf.reshape(tf.cast(grad.values, tf.float32), [-1, self.row_elems])
        self.indices = tf.cast(grad.indices, tf.int32)
        self.count = tf.cast(tf.size(self.indices), tf.int64)

    def local_dense(self):
        """This rank's gradient as a dense float32 vector (repeats summed)."""
        dense = tf.math.unsorted_segment_sum(self.rows, self.indices, self.num_rows)
        return tf.reshape(dense, [-1])

    def as_slices(self, flat_dense):
        """A dense reduced gradient in the same form as `allgather`'s result:
        every row, once (`tf.cond` needs one structure for both paths)."""
        rows = tf.reshape(flat_dense, [self.num_rows, self.row_elems])
        return rows, tf.range(self.num_rows, dtype=tf.int32)

    def allgather(self, counts, step, label: str, average: bool):
        """Every rank's slices (rows, indices), in rank order, and finite."""
        n = world.size()
        records = tf.concat(
            [tf.bitcast(self.indices, tf.float32)[:, None], self.rows], 1
        )
        gathered, finite = ordered(
            lambda: tf.numpy_function(
                _sparse_host(label, self.row_elems + 1),
                [records, counts, step],
                [tf.float32, tf.bool],
                stateful=True,
            )
        )
        gathered.set_shape([None, self.row_elems + 1])
        index = tf.bitcast(gathered[:, 0], tf.int32)
        rows = gathered[:, 1:]
        if average:
            rows = rows * (1.0 / n)
        return (rows, index), tf.reshape(finite, [])

    def reduced(self, rows, index) -> tf.IndexedSlices:
        """The reduced `(rows, index)` as an IndexedSlices of the variable's
        shape and the gradient's dtype."""
        return tf.IndexedSlices(
            tf.cast(tf.reshape(rows, [-1, *self.shape[1:]]), self.dtype),
            index,
            dense_shape=tf.constant(self.shape.as_list(), tf.int64),
        )
