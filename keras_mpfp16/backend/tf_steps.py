"""The step check carried by the first gradient bucket (step slots).

Every rank's (epoch, train step, sparse row counts) rides in the first
bucket's MPI call -- as float32 pairs on the float32 wire, as uint16 words on
the 16-bit wires (`runtime/wire.py` defines both layouts) -- so every rank
receives every rank's slots and all raise together when they are out of step,
with no MPI call of its own.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_mpfp16.runtime import progress
from keras_mpfp16.runtime.mpi import wire


def check_step_table(table, what: str) -> None:
    """Raises on every rank together when ranks are not at the same step.

    Args:
        table: (ranks, >= 2) integers, row r = rank r's (epoch, train step,
            ...); the epoch is -1 where no callback reports epochs. Every rank
            holds the same table (it came out of a collective).
        what: The collective, for the message.
    """
    table = np.asarray(table)[:, :2].astype(np.int64)
    epochs, steps = table[:, 0], table[:, 1]
    steps_differ = bool((steps != steps[0]).any())
    epochs_differ = bool((epochs != epochs[0]).any())
    if not (steps_differ or epochs_differ):
        return
    rows = ", ".join(
        f"rank {i}: train step {s}" + (f" (epoch {e})" if e >= 0 else "")
        for i, (e, s) in enumerate(table.tolist())
    )
    if steps_differ:
        differs = "their train steps differ" + (
            " (and so do their epochs)" if epochs_differ else ""
        )
        advice = (
            "Every rank must run the same number of batches per epoch (shard the "
            "data with keras_mpfp16.shard) and the same train calls."
        )
    else:
        differs = "they are in different epochs at the same train step"
        advice = (
            "An epoch ended on some ranks but not on others: every rank needs the "
            "same amount of data per epoch (shard the data with keras_mpfp16.shard)."
        )
    raise RuntimeError(
        f"keras_mpfp16: ranks are out of step at a gradient reduction ({what}): "
        f"{differs} — {rows}. {advice}"
    )


_epoch_variable = None


def _set_epoch_variable(epoch: int) -> None:
    """`progress.set_epoch`'s listener: the host variable the step reads,
    made on the first call. Eagerly, even when called inside a trace; `fit`
    sets the epoch before its first step is traced, so the train function
    is not traced again for a variable made in its trace."""
    global _epoch_variable
    with tf.init_scope():
        if _epoch_variable is None:
            with tf.device("/CPU:0"):
                _epoch_variable = tf.Variable(
                    np.int64(epoch), trainable=False, name="keras_mpfp16_epoch"
                )
        else:
            _epoch_variable.assign(epoch)


progress.add_epoch_listener(_set_epoch_variable)


def epoch_tensor():
    """The current epoch as the callbacks reported it (`progress.epoch()`).

    Read from a host variable that `progress.set_epoch` assigns, not by a
    `numpy_function`: the value at the step is the same, and the train step
    saves one crossing into Python (issue 40: docs/scaling.md, "What one
    collective costs")."""
    if _epoch_variable is None:  # no epoch reported yet (-1)
        _set_epoch_variable(progress.epoch())
    return tf.identity(_epoch_variable)


def slot_values(step, counts, epoch=None):
    """This rank's int64 slots: (epoch, step, sparse row counts...)."""
    epoch = epoch_tensor() if epoch is None else epoch
    return tf.concat([tf.stack([epoch, step]), counts], 0)


def encoded_slots(step, counts):
    """This rank's slots as uint16 words for a 16-bit wire (`wire.slot_words`:
    `wire.SLOT_WORDS_PER_VALUE` little-endian words per value)."""
    return tf.reshape(tf.bitcast(slot_values(step, counts), tf.uint16), [-1])


def float_slot_piece(step, counts, n: int, r: int):
    """This rank's (epoch, step, counts) as float32 pairs (`wire.float_slots`),
    at its place in an all-ranks block of zeros: summed over ranks, the block
    is every rank's slots. Built in the graph: the host function must not
    write into its input buffer, whose memory TensorFlow may share (a cached
    zeros constant inside a `cond` branch, as with gradient accumulation,
    kept the previous steps' slots and summed garbage)."""
    vals = slot_values(step, counts)
    split = tf.constant(wire.SLOT_SPLIT, tf.int64)
    offset = wire.SLOT_OFFSET
    pairs = tf.stack([(vals + offset) // split, (vals + offset) % split], 1)
    mine = tf.reshape(tf.cast(pairs, tf.float32), [-1])
    m = int(mine.shape[0])
    return tf.pad(mine, [[r * m, (n - r - 1) * m]])
