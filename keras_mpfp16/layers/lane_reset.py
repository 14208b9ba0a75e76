"""Per-lane reset of stateful recurrent state, for truncated BPTT over lanes.

In truncated backpropagation through time over long sequences, each batch row
("lane") carries one long sequence chunk after chunk in a stateful layer. When
one lane's sequence ends and the next begins, only that lane's state must be
zeroed; Keras's `reset_state()` zeroes every lane. `reset_lanes` does it per
lane, for every stateful recurrent layer of a model, Keras's own included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import keras
import numpy as np
from keras import ops

from keras_mpfp16.internals.keras import read_uncast


def lane_reset_mask(lanes, batch_size: int) -> np.ndarray:
    """Normalises `lanes` to a boolean vector of shape `(batch_size,)`.

    Args:
        lanes: A boolean mask of shape `(batch_size,)` (True = reset), or a
            sequence of integer lane indices in `[0, batch_size)`.
        batch_size: The number of lanes.

    Returns:
        A numpy boolean array, True for each lane to reset.
    """
    array = np.asarray(lanes)
    if array.dtype == bool:
        if array.shape != (batch_size,):
            raise ValueError(
                f"A boolean `lanes` mask must have shape ({batch_size},), one "
                f"entry per lane; received shape {array.shape}."
            )
        return array
    if array.size == 0:
        return np.zeros((batch_size,), dtype=bool)
    if array.ndim > 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            "`lanes` must be a boolean mask of shape (batch_size,) or a "
            f"sequence of integer lane indices; received {lanes!r}."
        )
    array = array.reshape(-1)
    bad = array[(array < 0) | (array >= batch_size)]
    if bad.size:
        raise ValueError(
            f"Lane indices {bad.tolist()} are out of range; the layer has "
            f"{batch_size} lanes, valid indices are 0..{batch_size - 1}."
        )
    mask = np.zeros((batch_size,), dtype=bool)
    mask[array] = True
    return mask


def reset_state_lanes(state_variables: Sequence, lanes) -> None:
    """Zeroes the rows `lanes` of each state variable (shape `(batch, ...)`)."""
    for variable in state_variables:
        reset = lane_reset_mask(lanes, variable.shape[0])
        if not reset.any():
            continue
        keep = ~reset.reshape((-1,) + (1,) * (len(variable.shape) - 1))
        value = read_uncast(variable)
        # `where`, not a multiply: a lane whose state went non-finite must
        # come back as exact zeros.
        variable.assign(ops.where(keep, value, ops.zeros_like(value)))


def _recurrent_layers(layer) -> Iterator[keras.layers.RNN]:
    if isinstance(layer, keras.layers.Bidirectional):
        yield layer.forward_layer
        yield layer.backward_layer
    elif isinstance(layer, keras.layers.RNN):
        yield layer
    for sublayer in getattr(layer, "layers", None) or ():
        yield from _recurrent_layers(sublayer)


def reset_lanes(model: keras.layers.Layer, lanes) -> list[keras.layers.Layer]:
    """Resets the given lanes in every stateful recurrent layer of `model`.

    Works for `keras_mpfp16.layers.LSTM`/`GRU` and for any Keras `RNN` layer
    (including inside `Bidirectional` and nested models) built with
    `stateful=True`.

    Args:
        model: A model or layer containing stateful recurrent layers.
        lanes: A boolean mask of shape `(batch_size,)` (True = reset this
            lane) or a sequence of lane indices, e.g. the `reset` field of a
            `LaneBatcher` chunk.

    Returns:
        The recurrent layers whose states were reset.

    Example:

    >>> for chunk in batcher:
    ...     reset_lanes(model, chunk.reset)
    ...     model.train_on_batch(chunk.x, chunk.y, sample_weight=chunk.sample_weight)
    """
    layers = [
        layer
        for layer in _recurrent_layers(model)
        if getattr(layer, "stateful", False) and layer.states is not None
    ]
    if not layers:
        raise ValueError(
            f"{getattr(model, 'name', model)!r} has no built stateful recurrent "
            "layer; build the model with `stateful=True` recurrent layers and a "
            "fixed batch size (call it once) before resetting lanes."
        )
    for layer in layers:
        reset_state_lanes(keras.tree.flatten(layer.states), lanes)
    return layers
