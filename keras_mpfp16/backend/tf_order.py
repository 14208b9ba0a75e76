"""One total order for every host collective of a traced TensorFlow step.

Each collective the bridge issues from inside a step (gradient buckets,
sparse gathers, the metric reduction, replica checksums, the first-step
broadcast) is a `tf.numpy_function`/`tf.py_function`. TensorFlow's automatic
control dependencies run stateful ops in program order only when they share
a resource; a collective inside a `cond` branch (gradient accumulation, the
metric reduction's on/off switch) is an `If` op ordered by the resources it
captures. Two such ops with no resource in common may run in either order,
and the order can differ between ranks: rank 0's gradient Allreduce then
meets rank 1's metric Allreduce, and both sum garbage (seen as a step table
of nonsense values, intermittently, with `gradient_accumulation_steps`).

`ordered` makes every collective read-modify-write one variable before and
after it, so all of them share that resource and run in program order on
every rank.
"""

from __future__ import annotations

import tensorflow as tf

_order: tf.Variable | None = None


def _variable() -> tf.Variable:
    global _order
    if _order is None:
        with tf.init_scope():
            _order = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="keras_mpfp16_collective_order"
            )
    return _order


def ordered(make_call):
    """Creates one collective's ops (`make_call()`) in the step's total order.

    Args:
        make_call: Creates the host function call(s) and returns its outputs
            (a tensor or a structure of tensors).

    Returns:
        What `make_call` returned.
    """
    order = _variable()
    before = order.assign_add(1)
    with tf.control_dependencies([before]):
        outs = make_call()
    done = [t for t in tf.nest.flatten(outs) if tf.is_tensor(t)]
    with tf.control_dependencies(done):
        order.assign_add(1)
    return outs
