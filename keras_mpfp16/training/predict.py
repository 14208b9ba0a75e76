"""`split_predict`: one input's predictions, computed by all ranks together."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from keras_mpfp16.data.arithmetic import shard_sizes
from keras_mpfp16.runtime.mpi import collectives, world


def _rows(structure: Any, start: int, stop: int) -> Any:
    return keras.tree.map_structure(lambda leaf: leaf[start:stop], structure)


def _gather(structure: Any) -> Any:
    return keras.tree.map_structure(
        lambda leaf: collectives.allgather(np.asarray(leaf)), structure
    )


def split_predict(model, x: Any, batch_size: int | None = None, **kwargs) -> Any:
    """`model.predict(x)` computed by all ranks together, returned on every rank.

    `model.predict` on its own predicts on each rank the input it is given,
    as in Keras (no collective, so one rank may call it alone). Call this on
    every rank with the same `x` instead to share the work: rank r predicts
    a contiguous block of the rows, and the blocks are gathered in order, so
    every rank returns what one process's `model.predict(x)` returns (up to
    float rounding).

    Args:
        model: A Keras model (any optimizer, or none).
        x: Arrays, or a dict/list/tuple of arrays, with the same number of
            rows on every rank.
        batch_size: As for `predict`.
        **kwargs: Other `predict` arguments (`verbose`, `callbacks`).

    Returns:
        The predictions for all of `x`, the same on every rank.

    Example:

    ```python
    import keras_mpfp16 as kmp

    probabilities = kmp.split_predict(model, x_test, batch_size=256)
    ```
    """
    leaves = keras.tree.flatten(x)
    if not leaves or not all(hasattr(leaf, "shape") for leaf in leaves):
        raise TypeError(
            "split_predict takes arrays (or a dict/list/tuple of arrays); "
            f"received {type(x).__name__}. For a dataset, call model.predict "
            "on each rank's keras_mpfp16.shard(dataset, drop_remainder=False)."
        )
    n_rows = int(np.shape(leaves[0])[0])
    sizes = shard_sizes(n_rows, world.size(), drop_remainder=False)
    start = sum(sizes[: world.rank()])
    mine = _rows(x, start, start + sizes[world.rank()])
    if sizes[world.rank()] == 0:
        # Predict one row for the output structure, contribute none of it.
        out = model.predict(_rows(x, 0, 1), batch_size=batch_size, **kwargs)
        out = _rows(out, 0, 0)
    else:
        out = model.predict(mine, batch_size=batch_size, **kwargs)
    return _gather(out)
