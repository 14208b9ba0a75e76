"""The input spec Keras's own `fit` traces its first train step with.

Keras (TensorFlow backend, no `tf.distribute` strategy) builds a model that
is not built yet - a subclassed model, a `Sequential` without an `Input` -
while it traces the first train step, from the element spec of the
`tf.data` pipeline its data adapter makes. That spec is what the model's
`inputs`, `get_build_config()` and saved `.keras` file then record. Its
batch dimension is `None` wherever Keras cannot fix it: arrays whose last
batch is partial, a `tf.data.Dataset` batched without `drop_remainder`, a
`PyDataset` or a Python generator (Keras relaxes it); it is the batch size
only for arrays that split into full batches and datasets batched with
`drop_remainder=True`.

`replica.build_before_fit` builds from this spec, so the model comes out
exactly as Keras's own `fit` would have built it from the same input
(issue 28: it used to take the first batch's shape, batch dimension
included, and a `.keras` file saved after a multi-process `fit` could not
be called with another batch size).

How: the spec is read from Keras's own data adapter for `fit`'s arguments.
For arrays (numpy, tensors, pandas, lists and dicts of them) the adapter is
made for the leading rows only - one full batch, plus one row where the
whole input ends with a partial batch - so the pipeline that gives the spec
does not copy the whole input; its spec is the whole input's (the batch
dimension depends only on whether a partial batch exists). A Python
generator's first batches, read by the adapter, are put back in front.
"""

from __future__ import annotations

import types
from typing import Any

import keras

from keras_mpfp16.internals import keras as keras_internals


def _leading_rows(leaf: Any, rows: int) -> Any:
    """The first `rows` rows of an array-like, of the same kind."""
    if leaf is None:
        return None
    if hasattr(leaf, "iloc"):  # pandas: positional rows
        return leaf.iloc[:rows]
    return leaf[:rows]


def _array_rows(adapter: Any) -> int:
    """How many leading rows have the whole array input's batch spec."""
    batch = adapter.batch_size
    if not adapter.has_partial_batch:
        return batch  # full batches only: the batch dimension is `batch`
    if adapter.num_batches > 1:
        return batch + 1  # a full batch and a partial one: None
    return adapter.partial_batch_size  # one partial batch: the whole input


def _restore_generator(arguments: dict) -> Any:
    """Replaces a generator `x` by one that first yields what was read of it.

    Returns:
        A generator to read the user's instead: what is read through it is
        yielded again first by the generator now in `arguments["x"]`.
    """
    source = arguments["x"]
    read: list = []

    def tap():
        for item in source:
            read.append(item)
            yield item

    def restored():
        yield from read
        yield from source

    arguments["x"] = restored()
    return tap()


def traced_input_spec(arguments: dict) -> Any:
    """The `(x, y, sample_weight)` spec Keras's first train step is traced with.

    Args:
        arguments: `fit`'s bound arguments (after `validation_split` was
            turned into `validation_data`); a Python generator `x` is
            replaced by one that yields the batches read here first.

    Returns:
        A structure of `tf.TensorSpec`s (or sparse/ragged specs), as the
        element spec of the `tf.data` pipeline Keras's `fit` makes.

    Raises:
        Whatever Keras's data adapter raises for this input (`fit` would
        raise it too).
    """
    x = arguments.get("x")
    y = arguments.get("y")
    sample_weight = arguments.get("sample_weight")
    batch_size = arguments.get("batch_size")
    steps = arguments.get("steps_per_epoch")
    class_weight = arguments.get("class_weight")
    if isinstance(x, types.GeneratorType):
        x = _restore_generator(arguments)
    adapter = keras_internals.fit_data_adapter(
        x, y, sample_weight, batch_size, steps, class_weight
    )
    array_adapter = keras_internals.array_data_adapter()
    if array_adapter is not None and isinstance(adapter, array_adapter):
        rows = _array_rows(adapter)

        def lead(v):
            return _leading_rows(v, rows)

        x, y, sample_weight = keras.tree.map_structure(lead, (x, y, sample_weight))
        adapter = keras_internals.fit_data_adapter(
            x, y, sample_weight, adapter.batch_size, None, class_weight
        )
    return adapter.get_tf_dataset().element_spec
