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

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from keras_mpfp16 import runtime
from keras_mpfp16.data.fingerprint import array_like as _array_like
from keras_mpfp16.data.fingerprint import fingerprint
from keras_mpfp16.data.fingerprint import is_tf_dataset as _is_tf_dataset
from keras_mpfp16.data.fingerprint import leaves as _leaves
from keras_mpfp16.data.py_dataset import ShardedPyDataset
from keras_mpfp16.data.shard import shard

KERAS_DEFAULT_BATCH = 32  # Keras's batch_size when None is given for arrays


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


def _num_rows(x: Any) -> int:
    return int(np.shape(_leaves(x)[0])[0])


def _batches(num_rows: int, batch_size: int) -> int:
    return -(-num_rows // batch_size)


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
