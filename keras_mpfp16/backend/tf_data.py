"""Which parts of a `tf.data` pipeline the data check may read.

The data check (`data/fingerprint.py`, for `shard` and the evaluation split)
reads the first elements of a `tf.data.Dataset` and stops. That is harmless
only when nothing outlives the iterator it used. TensorFlow keeps state
between the iterators of one `Dataset` object in a few places, and a read
that stops early changes what every later iterator yields:

- `cache()` in memory: one cache per dataset object, filled by the first
  iterator. An iterator destroyed before the end cancels its input; a
  `prefetch` (and parallel ops) below the cache answers the cancellation
  with end-of-sequence, and the cache's writer takes that end as the end of
  the data and completes the cache with the elements read so far
  (TensorFlow's `MemoryWriterIterator::GetNextInternal`, which finalizes on
  any end-of-sequence; measured on TensorFlow 2.21: a 200-batch
  `map(num_parallel_calls).batch().prefetch().cache().prefetch()` pipeline
  cut to 8-10 batches in 3 of 20 broken-off reads, and in 6 of 30 reads
  through `take(8)`, which ends its read the same way);
- `cache(filename)`: cache files and their lock file, written by the first
  iterator; `snapshot()`: snapshot files;
- `shuffle(..., reshuffle_each_iteration=True)`: a seed generator each new
  iterator advances (one extra read shifts every later epoch's order);
  `Dataset.random`, `sample_from_datasets` and stateful random ops in a
  function likewise;
- generators (`from_generator`) and `py_function`s: Python code whose state
  TensorFlow does not see.

So the check reads only the *pure* parts of a pipeline: the largest
sub-pipelines made of transformations known to keep no state between
iterators (`PURE_DATASETS`, a list: a transformation not on it counts as
stateful), whose functions run no stateful op except read-only lookups
(`READ_ONLY_STATEFUL_OPS`). Such a part is a separate `Dataset` object
whose iterators share nothing with the user's, so reading it cannot change
what the user's pipeline yields. Everything above a stateful step is not
read; its element structure and length still are compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keras_mpfp16.internals import tensorflow as tf_internals

# Dataset classes (tensorflow/python/data/ops) that keep no state between
# iterators: every iterator starts from scratch and yields the same elements.
PURE_DATASETS = frozenset(
    {
        "_TensorSliceDataset",
        "_TensorDataset",
        "_RangeDataset",
        "_SparseTensorSliceDataset",
        "_MapDataset",
        "_ParallelMapDataset",
        "_FilterDataset",
        "_FlatMapDataset",
        "_InterleaveDataset",
        "_ParallelInterleaveDataset",
        "_BatchDataset",
        "_ParallelBatchDataset",
        "_PaddedBatchDataset",
        "_DenseToRaggedDataset",
        "_DenseToSparseBatchDataset",
        "_UnbatchDataset",
        "_RebatchDataset",
        "_PrefetchDataset",
        "_TakeDataset",
        "_SkipDataset",
        "_ShardDataset",
        "_RepeatDataset",
        "_ZipDataset",
        "_ConcatenateDataset",
        "_OptionsDataset",
        "_RestructuredDataset",
        "_AssertCardinalityDataset",
        "_WindowDataset",
        "_ScanDataset",
        "_TakeWhileDataset",
        "_UniqueDataset",
        "_IgnoreErrorsDataset",
        "_MapAndBatchDataset",
        "_ShuffleDataset",  # only with reshuffle_each_iteration=False, see below
        "TFRecordDatasetV2",
        "_TFRecordDataset",
        "TextLineDatasetV2",
        "FixedLengthRecordDatasetV2",
        "_FixedLengthRecordDataset",
        "ParallelInterleaveDataset",
    }
)

# Stateful ops (TensorFlow's registry) that only read: a variable's value,
# a lookup table (TextVectorization, StringLookup), an assertion.
READ_ONLY_STATEFUL_OPS = frozenset(
    {
        "ReadVariableOp",
        "LookupTableFind",
        "LookupTableFindV2",
        "LookupTableSize",
        "LookupTableSizeV2",
        "Assert",
    }
)

# Ops that call a function of the library (checked on their own).
CALL_OPS = frozenset(
    {
        "PartitionedCall",
        "StatefulPartitionedCall",
        "If",
        "StatelessIf",
        "While",
        "StatelessWhile",
        "Case",
        "StatelessCase",
    }
)


def _stateful_ops(dataset) -> list[str]:
    return sorted(
        {
            op
            for op in tf_internals.dataset_function_ops(dataset)
            if op not in CALL_OPS
            and op not in READ_ONLY_STATEFUL_OPS
            and tf_internals.op_is_stateful(op)
        }
    )


@dataclass
class Reading:
    """What the data check may read of a pipeline (`pure_parts`).

    Attributes:
        parts: The datasets that may be read: the whole pipeline when it is
            pure, else the largest pure sub-pipelines below its stateful
            steps, in input order.
        stateful: The stateful steps found (e.g. `"CacheDataset"`), for
            messages and tests.
        unseeded_shuffle: Whether a reshuffling `shuffle` has no seed (each
            process draws its own order, so the ranks' data differ).
    """

    parts: list
    stateful: list[str] = field(default_factory=list)
    unseeded_shuffle: bool = False


def pure_parts(dataset) -> Reading:
    """The parts of `dataset` that reading cannot change (see the module docstring)."""
    notes: list[str] = []
    unseeded = []
    pure: dict[int, bool] = {}

    def is_pure(d) -> bool:
        key = id(d)
        if key in pure:
            return pure[key]
        name = type(d).__name__
        ok = name in PURE_DATASETS
        if name == "_ShuffleDataset":
            reshuffle, seeded = tf_internals.shuffle_settings(d)
            if reshuffle:
                ok = False
                notes.append("shuffle(reshuffle_each_iteration=True)")
                if not seeded:
                    unseeded.append(d)
        elif not ok:
            notes.append(name)
        stateful = _stateful_ops(d)
        if stateful:
            ok = False
            notes.append(f"{name} running {', '.join(stateful)}")
        inputs = tf_internals.dataset_inputs(d)
        ok = all([is_pure(i) for i in inputs]) and ok  # every input visited
        pure[key] = ok
        return ok

    def parts(d) -> list:
        if is_pure(d):
            return [d]
        return [p for i in tf_internals.dataset_inputs(d) for p in parts(i)]

    found = parts(dataset)
    return Reading(found, notes, bool(unseeded))


__all__ = [
    "CALL_OPS",
    "PURE_DATASETS",
    "READ_ONLY_STATEFUL_OPS",
    "Reading",
    "pure_parts",
]
