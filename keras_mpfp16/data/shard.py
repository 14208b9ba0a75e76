"""`shard`: each rank's disjoint part of the training or validation data."""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np

from keras_mpfp16 import _validate
from keras_mpfp16.data.arithmetic import shard_indices, shard_sizes
from keras_mpfp16.data.fingerprint import fingerprint, fingerprint_arrays
from keras_mpfp16.data.py_dataset import ShardedPyDataset
from keras_mpfp16.runtime.mpi import collectives, world


def _is_tf_dataset(x: Any) -> bool:
    # Only a process that imported TensorFlow can hold a tf.data.Dataset;
    # asking this way keeps `shard` usable without TensorFlow.
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def _is_structure(x: Any) -> bool:
    """dicts, and lists/tuples of arrays (multi-input `x`), as Keras reads them;
    a list of numbers is an array-like."""
    if isinstance(x, dict):
        return True
    return (
        isinstance(x, (list, tuple))
        and len(x) > 0
        and all(isinstance(v, (dict, list, tuple)) or np.ndim(v) >= 1 for v in x)
    )


def _leaves(x: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(x, dict):
        return [kv for k in x for kv in _leaves(x[k], f"{path}[{k!r}]")]
    if _is_structure(x):
        return [kv for i, v in enumerate(x) for kv in _leaves(v, f"{path}[{i}]")]
    return [(path, x)]


def _map(x: Any, fn) -> Any:
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    if _is_structure(x):
        return type(x)(_map(v, fn) for v in x)
    return fn(x)


def _as_array(x: Any) -> Any:
    # numpy arrays and anything indexable like one (e.g. jax arrays) pass
    # through; other array-likes become numpy arrays.
    return x if hasattr(x, "shape") and hasattr(x, "__getitem__") else np.asarray(x)


def _take(leaf: Any, index) -> Any:
    if hasattr(leaf, "iloc"):  # pandas: positional rows, not column labels
        return leaf.iloc[index]
    if isinstance(index, slice) or isinstance(leaf, np.ndarray):
        return leaf[index]
    return np.asarray(leaf)[index]  # e.g. tensors without fancy indexing


def _shard_arrays(arrays, rank, size, batch_size, drop_remainder):
    leaves = [
        (path, _as_array(leaf))
        for i, a in enumerate(arrays)
        for path, leaf in _leaves(a, f"argument {i}")
    ]
    for path, leaf in leaves:
        if len(getattr(leaf, "shape", ())) == 0:
            raise ValueError(
                f"shard needs arrays with a first dimension; {path} is a scalar."
            )
    lengths = {path: int(leaf.shape[0]) for path, leaf in leaves}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            "shard needs arrays of the same length (rows are matched by index); "
            "received lengths "
            + ", ".join(f"{p}: {n}" for p, n in lengths.items())
            + "."
        )
    n = next(iter(lengths.values())) if lengths else 0
    sizes = shard_sizes(n, size, batch_size=batch_size, drop_remainder=drop_remainder)
    if min(sizes) == 0:
        raise ValueError(
            f"shard: {n} rows split over {size} ranks "
            f"(batch_size={batch_size}, drop_remainder={drop_remainder}) leave "
            f"rank {sizes.index(0)} without data; every rank needs at least one row."
        )
    index = shard_indices(
        n, rank, size, batch_size=batch_size, drop_remainder=drop_remainder
    )
    out = [_map(a, lambda leaf: _take(_as_array(leaf), index)) for a in arrays]
    return out[0] if len(out) == 1 else tuple(out)


def _shard_dataset(dataset, rank, size, batch_size, drop_remainder):
    if batch_size is not None:
        raise ValueError(
            "batch_size applies to arrays only; a tf.data.Dataset is sharded by "
            "elements (batch it before sharding to deal whole batches)."
        )
    card = int(dataset.cardinality())
    infinite, unknown = card == -1, card == -2
    if drop_remainder and unknown:
        raise ValueError(
            "shard(..., drop_remainder=True) needs the dataset's length, to give "
            "every rank the same number of elements, and this tf.data.Dataset's "
            "cardinality is unknown. Declare it with "
            "dataset.apply(tf.data.experimental.assert_cardinality(n)), or pass "
            "drop_remainder=False (ranks may then run different numbers of steps, "
            "which training does not allow)."
        )
    if not infinite and not unknown:
        if card < size:
            raise ValueError(
                f"shard: the dataset has {card} elements, fewer than the {size} "
                "ranks; every rank needs at least one."
            )
        if drop_remainder:
            dataset = dataset.take(card // size * size)
    return dataset.shard(size, rank)


def _groups(prints: list) -> list[list[int]]:
    """Ranks grouped by equal fingerprints, in order of first appearance."""
    groups: dict = {}
    for r, p in enumerate(prints):
        groups.setdefault(repr(p), []).append(r)
    return list(groups.values())


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# The fingerprints `check_same_data` computed in this process, in call order:
# part of the job's identity recorded with a preemption backup.
_fingerprints: list = []


def fingerprints() -> tuple:
    """The fingerprints of the data this process passed to `shard` (with its
    check, under more than one process), in call order: the same whatever
    the number of ranks, as they are taken before the data is dealt."""
    return tuple(_fingerprints)


def check_same_data(data: tuple, dataset: bool) -> None:
    """Every rank passed the same data to `shard`.

    One `Allreduce` of a 62-bit digest of the fingerprint (O(1) bytes per
    rank at any N, `runtime.same_on_all_ranks`); only when the ranks differ
    are the fingerprints allgathered, for the message.

    Raises:
        ValueError: on every rank, naming the ranks that hold each version.
    """
    mine = fingerprint(data[0]) if dataset else fingerprint_arrays(*data)
    _fingerprints.append(mine)
    if collectives.same_on_all_ranks(mine, name="shard data fingerprint"):
        return
    prints = collectives.allgather_object(mine, name="shard data fingerprints")
    groups = _groups(prints)
    if len(groups) == 1:
        return
    versions = "; ".join(
        f"{_ranks(g)} hold{'s' if len(g) == 1 else ''} version {i + 1}"
        for i, g in enumerate(groups)
    )
    shapes = {repr(p[:2]) if p[0] != "arrays" else repr(p[1]) for p in prints}
    what = (
        "their shapes or dtypes differ"
        if len(shapes) > 1
        else "same shapes and dtypes, different contents"
    )
    raise ValueError(
        "keras_mpfp16.shard: the ranks were given different data "
        f"({what}): {versions}. shard deals out disjoint parts of ONE data "
        "set, the same on every rank; parts of different data sets overlap "
        "and miss rows (one rank's training rows may be another's validation "
        "rows). Make every rank build the same data: seed the random "
        "generator that makes it (np.random.default_rng(seed), "
        "keras.utils.set_random_seed(seed), a seeded shuffle) or load the same "
        "files. If each rank's data is its own on purpose, pass "
        "shard(..., check=False)."
    )


def shard(
    *data: Any,
    batch_size: int | None = None,
    drop_remainder: bool = True,
    rank: int | None = None,
    num_ranks: int | None = None,
    check: bool = True,
) -> Any:
    """This rank's disjoint part of the data, sized so all ranks run equal steps.

    Call it with the same data on every rank. Each rank gets different rows,
    and together the ranks cover the data once per epoch (see `arithmetic`
    for exactly which rows). Under mpirun it checks that the data is the
    same on every rank (one allreduce of a digest, see `check`) and raises
    on every rank if not.

    - numpy arrays (or nested dicts/lists/tuples of them, e.g. a multi-input
      `x`): rows are dealt round-robin in blocks of `batch_size` rows (1 by
      default); all arrays are split the same way, so `x[i]` stays with
      `y[i]` and `sample_weight[i]`. Strided views when possible (no copy).
    - a `tf.data.Dataset`: elements are dealt round-robin
      (`dataset.shard(N, rank)`); for a batched dataset these are batches.
    - a `keras.utils.PyDataset`: batches are dealt round-robin (a
      `ShardedPyDataset`).

    The remainder: with `drop_remainder=True` (the default, for training)
    every rank gets the same number of rows, so every rank runs the same
    number of steps per epoch (required: all ranks join every gradient
    reduction). The rows left over (fewer than N, or N * batch_size with
    `batch_size`, the last ones) are dropped. With `drop_remainder=False`
    (for validation) nothing is dropped: the leftover is spread over the
    first ranks, whose step counts may then exceed the others' by one, and
    `GlobalMetrics` keeps the validation metrics exact over the whole set.

    With `batch_size=b`, the same `b` as `fit(batch_size=b)`, every rank has
    only full batches (`drop_remainder=True`), and the k-th batches of all
    ranks together are the k-th batch of size N*b of the unsharded data.

    Args:
        *data: One or more arrays (or nested structures of arrays) with the
            same number of rows, or a single dataset.
        batch_size: Rows per dealt block, for arrays (see above).
        drop_remainder: True for training data (equal steps), False for
            validation data (every row kept).
        rank: This rank; defaults to `keras_mpfp16.rank()`.
        num_ranks: N; defaults to `keras_mpfp16.size()`.
        check: Whether to check that every rank passed the same data (when
            `rank` and `num_ranks` are not given and there is more than one
            process): one allreduce of a digest of a fingerprint of the data
            (`keras_mpfp16.data.fingerprint`: shapes, dtypes and a CRC-32 of
            the bytes - of evenly spaced rows beyond 64 MiB per array; for a
            `tf.data.Dataset` its length, structure and first elements, read
            only where reading cannot change what it yields later (below a
            `cache`, a reshuffling `shuffle`, a generator: the pipeline under
            it); for a `PyDataset` its length and first batch). Pass False for data that
            differs across ranks on purpose (each rank loads its own files);
            every rank must pass the same value.

    Returns:
        The shards, in the structure given: one value for one argument, a
        tuple for several.

    Raises:
        ValueError: if the arrays have different lengths (the message lists
            them), if some rank would get no data, for a `tf.data.Dataset`
            of unknown length with `drop_remainder=True`, or (on every rank)
            if the ranks passed different data (the message names which
            ranks hold which version).

    Example:

    ```python
    import keras_mpfp16 as kmp

    x_train, y_train = kmp.shard(x_train, y_train)
    val = kmp.shard(x_val, y_val, drop_remainder=False)
    model.fit(x_train, y_train, batch_size=32, validation_data=val,
              callbacks=[kmp.callbacks.GlobalMetrics()])
    ```
    """
    if not data:
        raise ValueError("shard needs at least one array or dataset.")
    size = world.size() if num_ranks is None else num_ranks
    r = world.rank() if rank is None else rank
    size = _validate.positive_int("num_ranks", size)
    r = _validate.integer("rank", r, minimum=0, maximum=size - 1)
    check = _validate.one_of("check", check, (True, False))
    datasets = [d for d in data if _is_tf_dataset(d) or _is_py_dataset(d)]
    if datasets and len(data) > 1:
        raise ValueError(
            "shard takes either arrays or a single dataset; received "
            f"{len(data)} arguments including a {type(datasets[0]).__name__}. "
            "A dataset yields (x, y) itself."
        )
    if check and rank is None and num_ranks is None and size > 1:
        # Before the errors that depend on the data (lengths, rows per
        # rank): with different data on different ranks, some ranks would
        # raise those and leave the others waiting in this collective.
        check_same_data(data, dataset=bool(datasets))
    if datasets:
        (d,) = data
        if _is_tf_dataset(d):
            return _shard_dataset(d, r, size, batch_size, drop_remainder)
        if batch_size is not None:
            raise ValueError(
                "batch_size applies to arrays only; a PyDataset is sharded by batches."
            )
        total = d.num_batches
        if total is not None and total < size:
            raise ValueError(
                f"shard: the PyDataset has {total} batches, fewer than the {size} "
                "ranks; every rank needs at least one."
            )
        return ShardedPyDataset(d, r, size, drop_remainder=drop_remainder)
    return _shard_arrays(data, r, size, batch_size, drop_remainder)


def _is_py_dataset(x: Any) -> bool:
    return isinstance(x, keras.utils.PyDataset)
