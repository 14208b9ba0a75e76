"""Shard arithmetic: which rows (or batches) each rank gets. Pure functions.

Rows are dealt to ranks round-robin in blocks of `batch_size` rows (1 by
default): block k (rows [k*b, (k+1)*b)) goes to rank k mod N. Every rank
keeps its rows in their original order, so the k-th batch of size b of all
ranks together is exactly rows [k*N*b, (k+1)*N*b): the batch a single
process with batch size N*b sees at step k. (Without `batch_size`, blocks
are single rows and the same holds for any per-rank batch size.)

`drop_remainder=True` (training) keeps only complete rounds of N blocks:
every rank gets the same number of rows, hence the same number of steps per
epoch for any batch size, and with `batch_size` only full batches. At most
N*b - 1 rows are dropped (N - 1 without `batch_size`): the *last* rows, the
same ones every epoch, so shuffle the arrays once beforehand if their order
is meaningful (e.g. sorted by label).

`drop_remainder=False` (validation) keeps every row: the leftover blocks go
to ranks 0, 1, ... in turn, so row counts, and batch counts, differ by at
most one block between ranks. `keras_mpfp16.callbacks.GlobalMetrics` keeps
the metrics exact over the whole set with such unequal step counts.
"""

from __future__ import annotations

import numpy as np

from keras_mpfp16 import _validate


def _check(num_samples, num_shards, batch_size, shard=None) -> int:
    _validate.non_negative_int("num_samples", num_samples)
    num_shards = _validate.positive_int("num_shards", num_shards)
    if shard is not None:
        _validate.integer("shard", shard, minimum=0, maximum=num_shards - 1)
    batch_size = _validate.positive_int("batch_size", batch_size, allow_none=True)
    return 1 if batch_size is None else batch_size


def shard_sizes(
    num_samples: int,
    num_shards: int,
    *,
    batch_size: int | None = None,
    drop_remainder: bool = True,
) -> list[int]:
    """Rows each shard (rank) gets.

    Args:
        num_samples: Rows in the full data.
        num_shards: N, the number of ranks.
        batch_size: Rows per block (the per-rank batch size), or None for 1.
        drop_remainder: Keep only complete rounds of N blocks (equal sizes),
            or keep every row (sizes differ by at most one block).

    Returns:
        A list of N row counts.

    Example:

    >>> shard_sizes(10, 3)
    [3, 3, 3]
    >>> shard_sizes(10, 3, drop_remainder=False)
    [4, 3, 3]
    >>> shard_sizes(100, 3, batch_size=16, drop_remainder=False)
    [36, 32, 32]
    """
    b = _check(num_samples, num_shards, batch_size)
    rounds, rest = divmod(num_samples, num_shards * b)
    sizes = [rounds * b] * num_shards
    if not drop_remainder:
        for r in range(num_shards):
            take = min(b, rest)
            sizes[r] += take
            rest -= take
    return sizes


def shard_indices(
    num_samples: int,
    shard: int,
    num_shards: int,
    *,
    batch_size: int | None = None,
    drop_remainder: bool = True,
) -> slice | np.ndarray:
    """The rows of shard (rank) `shard`, in their original order.

    Args:
        num_samples: Rows in the full data.
        shard: This rank, in [0, num_shards).
        num_shards: N, the number of ranks.
        batch_size: Rows per block, or None for 1.
        drop_remainder: As for `shard_sizes`.

    Returns:
        A `slice` when the rows form a strided range (blocks of one row; numpy
        then returns a view, no copy), else an int64 array of row indices.
    """
    b = _check(num_samples, num_shards, batch_size, shard)
    count = shard_sizes(
        num_samples, num_shards, batch_size=batch_size, drop_remainder=drop_remainder
    )[shard]
    if b == 1:
        return slice(shard, shard + count * num_shards, num_shards)
    starts = np.arange(shard * b, num_samples, num_shards * b, dtype=np.int64)
    rows = (starts[:, None] + np.arange(b, dtype=np.int64)[None, :]).reshape(-1)
    return rows[rows < num_samples][:count]


def steps_per_epoch(num_rows: int, batch_size: int) -> int:
    """Batches Keras makes from `num_rows` rows (the last one may be partial)."""
    return -(-num_rows // batch_size)


__all__ = ["shard_indices", "shard_sizes", "steps_per_epoch"]
