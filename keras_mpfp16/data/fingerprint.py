"""A cheap digest of a data set, for telling whether ranks hold the same data.

Used by `shard` (every rank must pass the same data) and by the evaluation
split (`split`: the same data everywhere, or each rank its own). One value
per rank, gathered in one collective call by the caller.

What it catches, exactly:

- arrays (numpy, and anything `np.asarray` reads, in any nesting): any
  difference in the structure, a shape or a dtype; any difference in the
  bytes of an array up to 64 MiB (CRC-32: two different arrays agree by
  chance with probability about 2^-32); beyond 64 MiB, any difference in
  the rows it reads, which are evenly spaced (every k-th row, k chosen so
  about 64 MiB are read): data generated or shuffled differently on each
  rank differs in every row and is caught; a change confined to rows it
  does not read (an edit to a few rows of a large array) is not;
- a `tf.data.Dataset`: its cardinality, its element structure and the
  bytes of the first elements of its *pure* parts (`backend/tf_data.py`):
  up to `LEADING_ELEMENTS` of them, stopping early once `LEADING_BYTES`
  have been read. The data check never alters the data: a pipeline with a
  step that keeps state between iterators (`cache`, `snapshot`, a shuffle
  that reshuffles each epoch, a generator or `py_function`, stateful random
  ops) is not read above that step, because a read that stops early would
  change what it yields later (a partly read `cache()` can complete with
  only the elements read); the pure pipeline below it (a separate
  `Dataset` object, sharing nothing with the user's iterators) is read
  instead. A reshuffling shuffle without a seed makes the fingerprint
  differ between ranks (each process draws its own order). A dataset
  shuffled differently per rank by a pure step (`reshuffle_each_iteration
  =False`) is caught unless all of the elements read agree by chance: with
  one element read, an unseeded `shuffle(60)` of 60 rows fooled the check
  once in 60 at two ranks; with eight, about once in 10^14;
- elements of every type a dataset yields: strings and bytes (their
  bytes, length-prefixed), ragged tensors (values and row splits), sparse
  tensors (indices, values, shape), in any nesting of dicts and tuples;
- a `keras.utils.PyDataset`: its number of batches and its first batch;
- a generator (in the evaluation split, which reads its first element
  and puts it back): the bytes of its first element;
- anything else: never equal across ranks.
"""

from __future__ import annotations

import sys
import zlib
from typing import Any

import keras
import numpy as np

from keras_mpfp16.runtime.mpi import world

# Arrays above this many bytes are fingerprinted from evenly spaced rows.
FULL_HASH_BYTES = 64 * 2**20
# A tf.data.Dataset is fingerprinted from its first elements: this many at
# most, fewer once this many bytes were read. Small unbatched elements need
# several (one shuffled scalar agrees across ranks often); one large batch
# already almost surely differs, and reading more would run the pipeline
# further for nothing.
LEADING_ELEMENTS = 8
LEADING_BYTES = 2**20


def is_tf_dataset(x: Any) -> bool:
    # Only a process that imported TensorFlow can hold a tf.data.Dataset.
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def leaves(x: Any) -> list:
    return [] if x is None else [v for v in keras.tree.flatten(x) if v is not None]


def array_like(x: Any) -> bool:
    found = leaves(x)
    return bool(found) and all(
        isinstance(leaf, np.ndarray)
        or (hasattr(leaf, "shape") and hasattr(leaf, "__array__"))
        for leaf in found
    )


def _object_crc(arr: np.ndarray, crc: int) -> int:
    # Strings, bytes (tf.string tensors read as numpy object arrays): their
    # bytes, each prefixed with its length (so ["ab", "c"] != ["a", "bc"]).
    for item in arr.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = repr(item).encode("utf-8")
        crc = zlib.crc32(len(item).to_bytes(8, "little"), crc)
        crc = zlib.crc32(item, crc)
    return crc


def _crc(arr: np.ndarray, crc: int = 0) -> int:
    if arr.dtype == object:
        return _object_crc(arr, crc)
    if arr.nbytes > FULL_HASH_BYTES and arr.ndim > 0 and arr.shape[0] > 1:
        # Sample before copying: a strided view of a large array would
        # otherwise be copied whole first.
        step = max(1, int(arr.nbytes // FULL_HASH_BYTES) + 1)
        arr = arr[::step]
    arr = np.ascontiguousarray(arr)
    return zlib.crc32(arr.view(np.uint8).reshape(-1), crc)


def _arrays(leaf: Any) -> list[np.ndarray]:
    """The numpy arrays that hold a leaf's values: a ragged tensor's values
    and row splits, a sparse tensor's indices, values and shape, or the
    leaf itself."""
    if hasattr(leaf, "flat_values") and hasattr(leaf, "nested_row_splits"):
        return [np.asarray(leaf.flat_values)] + [
            np.asarray(s) for s in leaf.nested_row_splits
        ]
    if all(hasattr(leaf, a) for a in ("indices", "values", "dense_shape")):
        return [np.asarray(a) for a in (leaf.indices, leaf.values, leaf.dense_shape)]
    return [np.asarray(leaf)]


def fingerprint_arrays(*structures) -> tuple:
    """Shapes, dtypes and a CRC-32 of the bytes of every array in `structures`."""
    crc, shapes = 0, []
    for leaf in (leaf for s in structures for leaf in leaves(s)):
        for arr in _arrays(leaf):
            shapes.append((arr.shape, arr.dtype.str))
            crc = _crc(arr, crc)
    return ("arrays", tuple(shapes), crc)


def first_element_crc(iterable) -> int:
    return leading_elements_crc(iterable, max_elements=1)[0]


def leading_elements_crc(
    iterable, max_elements: int = LEADING_ELEMENTS, max_bytes: int = LEADING_BYTES
) -> tuple[int, int]:
    """CRC-32 of the first elements of `iterable` and how many were read.

    Reads at least one element and stops after `max_elements`, or earlier
    once `max_bytes` have been hashed. Never given a `tf.data.Dataset` that
    is not pure (`dataset_crc` reads those).
    """
    crc, count, nbytes = 0, 0, 0
    for element in iterable:
        for leaf in leaves(element):
            for arr in _arrays(leaf):
                crc = _crc(arr, crc)
                nbytes += arr.nbytes
        count += 1
        if count >= max_elements or nbytes >= max_bytes:
            break
    return crc, count


def dataset_crc(dataset) -> tuple:
    """What the fingerprint reads of a `tf.data.Dataset`, without altering it.

    The first elements of its pure parts (`backend/tf_data.py`), each read
    through `take` so that the read ends where the part's iterator ends; the
    stateful steps above them are named, not read.
    """
    from keras_mpfp16.backend import tf_data  # TensorFlow is loaded: x is a Dataset

    reading = tf_data.pure_parts(dataset)
    crcs, left = [], LEADING_ELEMENTS
    for part in reading.parts:
        if left <= 0:
            break
        crc, count = leading_elements_crc(part.take(left), max_elements=left)
        crcs.append((repr(part.element_spec), crc, count))
        left -= max(count, 1)
    unseeded = ("unseeded shuffle", world.rank()) if reading.unseeded_shuffle else ()
    return (tuple(crcs), tuple(reading.stateful), unseeded)


def fingerprint(x: Any, y: Any = None, sample_weight: Any = None) -> tuple:
    """A value equal on two ranks when they were (almost surely) given the same data.

    See the module docstring for what differences it catches.
    """
    if array_like(x):
        return fingerprint_arrays(x, y, sample_weight)
    if is_tf_dataset(x):
        card = int(x.cardinality())
        return ("tf.data", card, repr(x.element_spec), dataset_crc(x))
    if isinstance(x, keras.utils.PyDataset):
        n = x.num_batches
        first = first_element_crc([x[0]]) if n else 0
        return ("PyDataset", n, first)
    return ("other", type(x).__name__, world.rank())
