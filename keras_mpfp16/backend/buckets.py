"""Bucket planning for fused gradient reduction (pure arithmetic)."""

from __future__ import annotations

from keras_mpfp16 import _validate

DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's default bucket size


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Groups gradients into buckets for fused allreduce.

    Gradients are taken in *reverse* order (backprop produces the last
    layer's gradients first) and packed greedily: a bucket is closed when the
    next gradient would overflow it. A gradient larger than the bucket gets a
    bucket of its own. When everything fits, there is exactly one bucket, so
    one MPI call per step.

    Args:
        sizes: Byte size of each gradient, in variable order.
        bucket_bytes: Target bucket size in bytes (> 0).

    Returns:
        Lists of indices into `sizes`, in the order the buckets are reduced.
        Within a bucket indices are ascending.
    """
    _validate.number("bucket_bytes", bucket_bytes, minimum=0, min_inclusive=False)
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in reversed(range(len(sizes))):
        if current and filled + sizes[i] > bucket_bytes:
            buckets.append(sorted(current))
            current, filled = [], 0
        current.append(i)
        filled += sizes[i]
    if current:
        buckets.append(sorted(current))
    return buckets


INDEX_BYTES = 4  # int32 row index, sent with every gathered row
VALUE_BYTES = 4  # gathered rows travel as float32


def sparse_is_cheaper(total_rows, row_elems: int, num_rows: int, wire_itemsize: int):
    """Whether an allgather of rows moves fewer bytes than the dense tensor.

    The gather moves every rank's (deduplicated) rows with their indices,
    `total_rows * (row_elems * 4 + 4)` bytes; the dense reduction moves the
    whole `num_rows * row_elems` tensor in the wire format. Both sides are
    known identically on every rank once the row counts are allgathered, so
    every rank takes the same path.

    Works on Python integers and on integer tensors (operators only).

    Args:
        total_rows: Rows contributed by all ranks together.
        row_elems: Elements per row (e.g. the embedding width).
        num_rows: Rows of the variable (e.g. the vocabulary size).
        wire_itemsize: Bytes per element of the dense wire (4 or 2).

    Returns:
        True when gathering is cheaper (a bool, or a boolean tensor).
    """
    gathered = total_rows * (row_elems * VALUE_BYTES + INDEX_BYTES)
    return gathered < num_rows * row_elems * wire_itemsize
