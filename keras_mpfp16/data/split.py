"""Splitting evaluation data over ranks: which batches each rank evaluates.

Used by `fit` (its `validation_data`) and `evaluate` when all ranks run them
together. Every rank was given the same data (the usual case: the same
`x_val, y_val` on every rank) or its own part of it (`kmp.shard(...)` done
by the user). A fingerprint of the data, gathered from all ranks, tells the
two apart:

- the same data everywhere: the ranks deal its *batches* round-robin
  (rank r evaluates batches r, r + N, ...), every batch on exactly one rank,
  the remainder included, so with the metric states summed the result is the
  one-process result over the whole set;
- different data on different ranks: each rank evaluates what it was given
  and the summed metric states describe the union.

Only inputs whose batches can be dealt are split: arrays (and nested
structures of them), `tf.data.Dataset`s of known length and
`keras.utils.PyDataset`s of known length, when there are at least as many
batches as ranks (so no rank is left without one). Anything else (a Python
generator, a dataset of unknown length, a set smaller than N batches) is
evaluated whole on every rank: the summed states then count every sample N
times, which leaves means, accuracies, AUC and every ratio-type metric
unchanged, only without the speed-up.
"""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from keras_mpfp16 import runtime
from keras_mpfp16.data.py_dataset import ShardedPyDataset
from keras_mpfp16.data.shard import shard

KERAS_DEFAULT_BATCH = 32  # Keras's batch_size when None is given for arrays
# Arrays above this many bytes are fingerprinted from evenly spaced rows.
_FULL_HASH_BYTES = 64 * 2**20


@dataclass
class EvaluationPart:
    """This rank's part of an evaluation input, ready for Keras.

    Attributes:
        x, y, sample_weight: What to pass to Keras (`y`/`sample_weight` None
            for datasets).
        steps: `steps` to pass to Keras (None: until the data ends).
        how: `"split"` (batches dealt over ranks), `"own"` (each rank's own
            data) or `"whole"` (the same data evaluated whole on every rank).
    """

    x: Any
    y: Any
    sample_weight: Any
    steps: int | None
    how: str


def _is_tf_dataset(x: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def _leaves(x: Any) -> list:
    return [] if x is None else [v for v in keras.tree.flatten(x) if v is not None]


def _array_like(x: Any) -> bool:
    leaves = _leaves(x)
    return bool(leaves) and all(
        isinstance(leaf, np.ndarray)
        or (hasattr(leaf, "shape") and hasattr(leaf, "__array__"))
        for leaf in leaves
    )


def _crc(arr: np.ndarray, crc: int = 0) -> int:
    arr = np.ascontiguousarray(arr)
    if arr.nbytes > _FULL_HASH_BYTES and arr.ndim > 0 and arr.shape[0] > 1:
        step = max(1, int(arr.nbytes // _FULL_HASH_BYTES) + 1)
        arr = np.ascontiguousarray(arr[::step])
    return zlib.crc32(arr.view(np.uint8).reshape(-1), crc)


def _fingerprint_arrays(*structures) -> tuple:
    crc, shapes = 0, []
    for leaf in (leaf for s in structures for leaf in _leaves(s)):
        arr = np.asarray(leaf)
        shapes.append((arr.shape, arr.dtype.str))
        crc = _crc(arr, crc)
    return ("arrays", tuple(shapes), crc)


def _first_element_crc(iterable) -> int:
    crc = 0
    for element in iterable:
        for leaf in _leaves(element):
            crc = _crc(np.asarray(leaf), crc)
        break
    return crc


def _num_rows(x: Any) -> int:
    return int(np.shape(_leaves(x)[0])[0])


def _batches(num_rows: int, batch_size: int) -> int:
    return -(-num_rows // batch_size)


def fingerprint(x: Any, y: Any = None, sample_weight: Any = None) -> tuple:
    """A value equal on two ranks when they were (almost surely) given the same data.

    Arrays: shapes, dtypes and a CRC-32 of their bytes (of evenly spaced rows
    beyond 64 MiB). Datasets: their length, element structure and a CRC of the
    first element. Other inputs: their type and the rank (never equal).
    """
    if _array_like(x):
        return _fingerprint_arrays(x, y, sample_weight)
    if _is_tf_dataset(x):
        card = int(x.cardinality())
        return ("tf.data", card, repr(x.element_spec), _first_element_crc(x))
    if isinstance(x, keras.utils.PyDataset):
        n = x.num_batches
        first = _first_element_crc([x[0]]) if n else 0
        return ("PyDataset", n, first)
    return ("other", type(x).__name__, runtime.rank())


def _known_batches(x: Any, batch_size: int, steps: int | None) -> int | None:
    if _array_like(x):
        total = _batches(_num_rows(x), batch_size)
    elif _is_tf_dataset(x):
        card = int(x.cardinality())
        total = None if card < 0 else card  # infinite (-1) or unknown (-2)
    elif isinstance(x, keras.utils.PyDataset):
        total = x.num_batches
    else:
        return None
    if steps is not None:
        total = steps if total is None else min(total, steps)
    return total


def split_for_evaluation(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    batch_size: int | None = None,
    steps: int | None = None,
) -> EvaluationPart:
    """This rank's part of an evaluation input (call it on every rank together).

    Makes one collective call (an allgather of a fingerprint of the data).

    Args:
        x, y, sample_weight: As given to `evaluate` (or `fit`'s validation data).
        batch_size: The evaluation batch size (arrays; default 32, as Keras).
        steps: `evaluate`'s `steps` (only the first `steps` batches count).

    Returns:
        An `EvaluationPart`.
    """
    batch_size = batch_size or KERAS_DEFAULT_BATCH
    prints = runtime.allgather_object(
        fingerprint(x, y, sample_weight), name="evaluation data fingerprint"
    )
    n, r = runtime.size(), runtime.rank()
    if any(p != prints[0] for p in prints):
        return EvaluationPart(x, y, sample_weight, steps, "own")
    total = _known_batches(x, batch_size, steps)
    if total is None or total < n:
        return EvaluationPart(x, y, sample_weight, steps, "whole")
    if _array_like(x):
        rows = min(_num_rows(x), total * batch_size)
        arrays = [a for a in (x, y, sample_weight) if a is not None]
        arrays = [_take_rows(a, rows) for a in arrays]
        parts = shard(
            *arrays,
            batch_size=batch_size,
            drop_remainder=False,
            rank=r,
            num_ranks=n,
        )
        parts = list(parts) if len(arrays) > 1 else [parts]
        out = iter(parts)
        xs = next(out)
        ys = next(out) if y is not None else None
        sws = next(out) if sample_weight is not None else None
        return EvaluationPart(xs, ys, sws, None, "split")
    if _is_tf_dataset(x):
        return EvaluationPart(x.take(total).shard(n, r), None, None, None, "split")
    # PyDataset: this rank's batches among the first `total`.
    part = ShardedPyDataset(x, r, n, drop_remainder=False)
    mine = len(range(r, total, n))
    return EvaluationPart(part, None, None, mine, "split")


def _take_rows(structure: Any, rows: int) -> Any:
    return keras.tree.map_structure(lambda leaf: leaf[:rows], structure)
