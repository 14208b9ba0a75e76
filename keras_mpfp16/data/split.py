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

Every input whose batches can be numbered is dealt this way: arrays (and
nested structures of them), `tf.data.Dataset`s of known or unknown length
(`dataset.shard(N, r)`: every rank iterates the pipeline and keeps its
batches), `keras.utils.PyDataset`s and Python generators (every rank runs
the generator and keeps its batches). A rank may end with fewer batches than
another, or none at all (fewer batches than ranks): it joins the other
ranks' reductions with zeros until they are done (`MetricReduction`), so
the summed states are still the one-process states over the whole set.

Only inputs that cannot be fingerprinted (anything else, e.g. a torch
`DataLoader`) are taken as each rank's own data. A generator or a dataset
whose *first* batch differs between ranks is taken as each rank's own data
too (e.g. shuffled without a common seed): each rank's batches count once.
The fingerprint never changes what the data yields afterwards
(`data/fingerprint.py`, `backend/tf_data.py`).
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from keras_mpfp16.data.arithmetic import shard_indices
from keras_mpfp16.data.fingerprint import array_like as _array_like
from keras_mpfp16.data.fingerprint import fingerprint as _fingerprint
from keras_mpfp16.data.fingerprint import first_element_crc
from keras_mpfp16.data.fingerprint import is_tf_dataset as _is_tf_dataset
from keras_mpfp16.data.fingerprint import leaves as _leaves
from keras_mpfp16.data.py_dataset import ShardedPyDataset
from keras_mpfp16.runtime.mpi import collectives, world

KERAS_DEFAULT_BATCH = 32  # Keras's batch_size when None is given for arrays


@dataclass
class EvaluationPart:
    """This rank's part of an evaluation input, ready for Keras.

    Attributes:
        x, y, sample_weight: What to pass to Keras (`y`/`sample_weight` None
            for datasets).
        steps: `steps` to pass to Keras (None: until the data ends).
        how: `"split"` (batches dealt over ranks) or `"own"` (each rank's
            own data).
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


def fingerprint(x: Any, y: Any = None, sample_weight: Any = None) -> tuple:
    """`data.fingerprint.fingerprint`, and for a generator (pass a `_Peeked`
    generator, see `_peek`) a CRC of its first element."""
    if isinstance(x, _Peeked):
        return ("generator", first_element_crc(x.first))
    return _fingerprint(x, y, sample_weight)


class _Peeked:
    """A generator whose first element was read (to fingerprint it)."""

    def __init__(self, first: list, rest):
        self.first = first  # [] when the generator was empty
        self.rest = rest

    def batches(self, limit: int | None):
        """A generator of all the batches (at most `limit`), first included."""
        return _generate(
            itertools.islice(itertools.chain(self.first, self.rest), limit)
        )

    def dealt(self, rank: int, num_ranks: int, limit: int | None):
        """A generator of this rank's batches: those numbered `rank (mod N)`."""
        everything = itertools.islice(itertools.chain(self.first, self.rest), limit)
        return _generate(b for i, b in enumerate(everything) if i % num_ranks == rank)


def _generate(iterable):
    # Keras takes `types.GeneratorType`, not any iterator.
    yield from iterable


def _peek(generator) -> _Peeked:
    return _Peeked(list(itertools.islice(generator, 1)), generator)


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

    Makes one collective call (an allreduce of a digest of the data's
    fingerprint: O(1) bytes per rank).

    Args:
        x, y, sample_weight: As given to `evaluate` (or `fit`'s validation data).
        batch_size: The evaluation batch size (arrays; default 32, as Keras).
        steps: `evaluate`'s `steps` (only the first `steps` batches count).

    Returns:
        An `EvaluationPart`.
    """
    batch_size = batch_size or KERAS_DEFAULT_BATCH
    if isinstance(x, types.GeneratorType):
        x = _peek(x)
    # One O(1)-byte agreement, not an allgather of every rank's fingerprint.
    same = collectives.same_on_all_ranks(
        fingerprint(x, y, sample_weight), name="evaluation data fingerprint"
    )
    n, r = world.size(), world.rank()
    if not same:
        if isinstance(x, _Peeked):
            x = x.batches(steps)
        return EvaluationPart(x, y, sample_weight, steps, "own")
    if isinstance(x, _Peeked):
        return EvaluationPart(x.dealt(r, n, steps), None, None, None, "split")
    total = _known_batches(x, batch_size, steps)
    if _array_like(x):
        rows = min(_num_rows(x), total * batch_size)
        arrays = [a for a in (x, y, sample_weight) if a is not None]
        # Batches dealt round-robin, as `shard` deals them; a rank may get
        # none (fewer batches than ranks).
        index = shard_indices(rows, r, n, batch_size=batch_size, drop_remainder=False)
        parts = [_map_rows(a, index) for a in arrays]
        out = iter(parts)
        xs = next(out)
        ys = next(out) if y is not None else None
        sws = next(out) if sample_weight is not None else None
        return EvaluationPart(xs, ys, sws, None, "split")
    if _is_tf_dataset(x):
        # Unknown length too: every rank iterates the pipeline and keeps
        # every N-th element (a rank may end up with one batch fewer, or none).
        dataset = x if total is None else x.take(total)
        return EvaluationPart(dataset.shard(n, r), None, None, None, "split")
    if isinstance(x, keras.utils.PyDataset):
        # This rank's batches among the first `total` (all, if infinite).
        mine = None if total is None else len(range(r, total, n))
        if mine == 0:
            # Keras refuses a PyDataset of length 0: no rows of the same
            # structure instead (a rank without a batch, fewer than N).
            empty = [
                None if part is None else _map_rows(part, slice(0, 0))
                for part in keras.utils.unpack_x_y_sample_weight(x[0])
            ]
            return EvaluationPart(*empty, None, "split")
        part = ShardedPyDataset(x, r, n, drop_remainder=False)
        return EvaluationPart(part, None, None, mine, "split")
    return EvaluationPart(x, y, sample_weight, steps, "own")


def _map_rows(structure: Any, index) -> Any:
    def take(leaf):
        if hasattr(leaf, "iloc"):  # pandas: positional rows, not column labels
            return leaf.iloc[index]
        return leaf[index]

    return keras.tree.map_structure(take, structure)
