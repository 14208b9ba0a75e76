"""The TensorFlow bridge: the only module that handles TensorFlow tensors.

It moves gradients between the compiled train step and MPI
(`allreduce_gradients`, implemented in `tf_gradients.py`: fused buckets, the
16-bit wires encoded in-graph (`tf_wire.py`), sparse gradients
(`tf_sparse.py`), DLPack buffers (`tf_path.py`)), and holds
the step's other collectives (initial sync, replica checksums, small-tensor
reductions for metrics). Another backend gets its own module with the same
functions.
"""

from __future__ import annotations

import warnings
import weakref
import zlib

import numpy as np
import tensorflow as tf

from keras_mpfp16.backend.tf_gradients import (  # noqa: F401  (the bridge's API)
    allreduce_gradients,
    dense_bucket_sizes,
    probe_wire,
)
from keras_mpfp16.backend.tf_order import ordered
from keras_mpfp16.backend.tf_path import reduction_path  # noqa: F401  (bridge API)
from keras_mpfp16.backend.tf_steps import check_step_table  # noqa: F401  (bridge API)
from keras_mpfp16.internals.tensorflow import (  # noqa: F401  (bridge API)
    devices_initialized,
    in_xla_context,
)
from keras_mpfp16.runtime.mpi import collectives, world
from keras_mpfp16.runtime.supervision import preemption

_XLA_ASSERT_WARNING = (
    "keras_mpfp16: this train step is compiled with XLA, which cannot raise "
    "errors from inside the step; non-finite steps are still skipped, but "
    "persistent non-finite gradients will not stop training. Compile with "
    "jit_compile=False to get the error."
)


def allreduce_tensors(
    tensors,
    op: str = "sum",
    carry_preemption: bool = False,
    name: str = "allreduce",
    channel: str = "train",
):
    """Reduces a few small tensors of any numeric dtype in one MPI call, in-graph.

    For bookkeeping state such as metric accumulators, not gradients: values
    travel as float64 (exact for counts below 2**53) and come back in their
    own dtypes and shapes.

    Args:
        tensors: list of tensors (or variables).
        op: `"sum"`, `"average"`, `"min"` or `"max"`.
        carry_preemption: Also carry this rank's preemption request in the
            same MPI call (`runtime.preemption.allreduce_carrying`; `"sum"`
            only). Every rank must pass the same value for the same call.
        name: What the call is, for stall reports.
        channel: With `carry_preemption`, the kind of step making the call
            (`"train"` or `"test"`): its communicator
            (`runtime.mpi.world.channel`).

    Returns:
        List of reduced tensors, identical on every rank.
    """
    if carry_preemption and op != "sum":
        raise ValueError(f"carry_preemption needs op='sum', got op={op!r}")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors or world.size() == 1:
        return tensors
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors], 0)

    def reduce(buf):
        if carry_preemption:
            return preemption.allreduce_carrying(buf, name=name, channel=channel)
        return collectives.allreduce(buf, op=op, name=name).astype(np.float64)

    out = ordered(lambda: tf.numpy_function(reduce, [flat], tf.float64, stateful=True))
    out.set_shape(flat.shape)
    parts = tf.split(out, [int(np.prod(t.shape)) for t in tensors])
    return [tf.cast(tf.reshape(p, t.shape), t.dtype) for p, t in zip(parts, tensors)]


def allreduce_sum_differentiable(tensor, name: str = "allreduce (differentiable)"):
    """The sum over ranks of one float64 tensor, in-graph, with a gradient.

    For values computed in the forward pass from each rank's part of the
    global batch (e.g. `SyncBatchNormalization`'s per-feature sums): the
    gradient of the sum is the sum over ranks of the upstream gradients (one
    more allreduce in the backward pass), which is what makes the averaged
    gradients those of one process on the concatenated batch. Every rank
    must make the same calls in the same order (one model on every rank
    does). With one process it is the identity.

    Args:
        tensor: A float64 tensor, the same shape on every rank.
        name: What the call is, for stall reports.

    Returns:
        The sum over ranks, identical on every rank.
    """
    tensor = tf.convert_to_tensor(tensor)
    if tensor.dtype != tf.float64:
        raise TypeError(
            f"allreduce_sum_differentiable expects a float64 tensor, got {tensor.dtype.name}"
        )
    if world.size() == 1:
        return tf.identity(tensor)

    @tf.custom_gradient
    def global_sum(x):
        total = allreduce_tensors([x], op="sum", name=name)[0]

        def grad(upstream):
            return allreduce_tensors(
                [tf.convert_to_tensor(upstream, tf.float64)],
                op="sum",
                name=f"{name} (gradient)",
            )[0]

        return total, grad

    return global_sum(tensor)


def _checksum(arrays) -> int:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1), crc)
    return crc


def check_replicas(variables, step, every: int) -> None:
    """In the train step: every `every` steps, compare a checksum of
    `variables` across ranks and raise, naming the ranks, if replicas differ."""
    variables = list(variables)

    def host(step, *arrays):
        mine = _checksum(arrays)
        # O(1) bytes per rank at any N; the checksums only on a mismatch.
        if collectives.same_on_all_ranks(mine, name="replica checksum"):
            return np.bool_(True)
        sums = collectives.allgather_object(mine, name="replica checksums")
        odd = [r for r, c in enumerate(sums) if c != sums[0]]
        if odd:
            raise RuntimeError(
                f"keras_mpfp16: replicas diverged at train step {int(step)}: the "
                f"weights of ranks {odd} differ from rank 0's (checksums "
                f"{[hex(c) for c in sums]}). Something changed weights on some ranks "
                "only (a rank-dependent layer, manual set_weights, a skipped step)."
            )
        return np.bool_(True)

    def check():
        values = [tf.convert_to_tensor(v) for v in variables]
        ordered(
            lambda: tf.numpy_function(host, [step, *values], tf.bool, stateful=True)
        )

    tf.cond(tf.equal(tf.math.floormod(step, every), 0), check, lambda: None)


def raise_if(condition, message: str, *values) -> None:
    """Stops training with `message` (formatted with tensor `values`) when True.

    Under XLA (only reachable with one process: with more, the XLA guard
    turns compilation off) assertions cannot be compiled; we warn once.
    """
    if in_xla_context():
        warnings.warn(_XLA_ASSERT_WARNING, stacklevel=2)
        return
    text = tf.strings.format(message, values) if values else message
    tf.debugging.Assert(tf.logical_not(condition), [text])


# One "synced" flag per optimizer: a plain tf.Variable that Keras does not
# track, so it is never saved and every new process syncs again.
_sync_flags: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sync_flag(owner) -> tf.Variable:
    flag = _sync_flags.get(owner)
    if flag is None:
        with tf.init_scope():
            flag = tf.Variable(False, trainable=False, name="keras_mpfp16_synced")
        _sync_flags[owner] = flag
    return flag


def mark_synced(owner) -> None:
    """Records that `owner`'s replicas were synced before the step (by `fit`),
    so `sync_on_first_step` does nothing."""
    flag = _sync_flag(owner)
    with tf.init_scope():
        flag.assign(True)


def sync_on_first_step(owner, variables, root: int = 0, check=None) -> None:
    """In the train step: broadcast `variables` from `root` the first time only.

    For training loops outside `fit` (which syncs before its first step and
    calls `mark_synced`). All ranks hold the flag False before their first
    step, so all take the broadcast branch together.

    Args:
        owner: The object the "synced" flag belongs to (the optimizer).
        variables: What to broadcast.
        root: The rank whose values win.
        check: Optional host-side callable run first on every rank (the
            model signature check), which may raise.
    """
    flag = _sync_flag(owner)
    variables = list(variables)

    def broadcast(*arrays):
        if check is not None:
            check()
        return collectives.broadcast_arrays(list(arrays), root=root)

    def sync():
        values = [tf.convert_to_tensor(v) for v in variables]
        new = ordered(
            lambda: tf.numpy_function(
                broadcast, values, [v.dtype for v in values], stateful=True
            )
        )
        for var, value, old in zip(variables, new, values):
            value.set_shape(old.shape)
            var.assign(value)
        flag.assign(True)

    tf.cond(flag, lambda: None, sync)


def broadcast_variables(variables, root: int = 0) -> None:
    """Overwrites `variables` on every rank with their values on `root`.

    Runs eagerly even when called while a function is being traced.
    """
    variables = list(variables)
    if not variables or world.size() == 1:
        return
    with tf.init_scope():
        values = [np.asarray(v.numpy()) for v in variables]
        for v, value in zip(variables, collectives.broadcast_arrays(values, root=root)):
            v.assign(value)


def variable_values(variables) -> list[np.ndarray]:
    """Host copies of variables' values (eager)."""
    with tf.init_scope():
        return [np.asarray(v.numpy()) for v in variables]


def after(dependencies, values: list) -> list:
    """`values`, computed only once every tensor in `dependencies` exists.

    In a traced step, ops with no data dependency on the batch (e.g. reading
    and zeroing metric state) may run before the input iterator produced
    the batch, or even when it raises end-of-data; routing them through
    this makes them wait for the batch.
    """
    deps = [t for t in tf.nest.flatten(dependencies) if tf.is_tensor(t)]
    if not deps:
        return list(values)
    with tf.control_dependencies(deps):
        return [tf.identity(v) for v in values]


def distribution_strategy(model) -> str | None:
    """The `tf.distribute` strategy `model` would run under, if not the default.

    A strategy scope entered now, or the one `model` was built under (Keras
    keeps it and runs every step under it).

    Returns:
        The strategy's class name (e.g. `"MirroredStrategy"`), or None.
    """
    if tf.distribute.has_strategy():
        return type(tf.distribute.get_strategy()).__name__
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and strategy is not tf.distribute.get_strategy():
        return type(strategy).__name__
    return None
