"""The TensorFlow bridge: the only module that handles TensorFlow tensors.

It moves gradients between the compiled train step and the numpy-level
runtime: fuse them into flat float32 buckets, hand each bucket to MPI from a
`tf.numpy_function` (host-staged) or, for GPU tensors with a CUDA-aware MPI,
from a `tf.py_function` through DLPack (no host copy), and split the result
back. Another backend gets its own module with the same functions.
"""

from __future__ import annotations

import warnings
import weakref
import zlib

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from keras_mpfp16.optimizer.buckets import plan_buckets
from keras_mpfp16.runtime import collectives, cuda, progress, world


def in_xla_context() -> bool:
    """True while tracing a function compiled with XLA (`jit_compile=True`)."""
    graph = tf_ops.get_default_graph()
    return control_flow_util.GraphOrParentsInXlaContext(graph)


def _aligned_empty(n: int) -> np.ndarray:
    """float32 array on a 64-byte boundary.

    TensorFlow adopts an aligned array returned from numpy_function as the
    output tensor's memory instead of copying it: one pass over the bucket
    saved. (It also means a returned buffer must never be reused.)
    """
    raw = np.empty(n * 4 + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + n * 4].view(np.float32)


def check_same_step(step: int, what: str) -> None:
    """Host side: all ranks must be at the same (epoch, train step).

    One tiny allreduce of per-rank slots; every rank sees the same table, so
    every rank raises the same error together (no rank is left waiting).
    """
    n, r = world.size(), world.rank()
    slots = np.zeros((n, 2), dtype=np.int64)
    slots[r] = (progress.epoch(), step)
    table = collectives.allreduce(slots, op="sum", name=f"step check before {what}")
    if (table == table[0]).all():
        return
    rows = ", ".join(
        f"rank {i}: train step {s}" + (f" (epoch {e})" if e >= 0 else "")
        for i, (e, s) in enumerate(table.tolist())
    )
    raise RuntimeError(
        "keras_mpfp16: ranks are out of step at a gradient reduction — "
        f"{rows}. Every rank must run the same number of steps per epoch "
        "(shard the data with keras_mpfp16.shard) and the same train calls."
    )


def _host_reduce(op: str, wire_dtype: str, label: str, check_step: bool):
    def reduce(buf: np.ndarray, step):
        step = int(step)
        name = f"{label}, train step {step}"
        if check_step:
            check_same_step(step, name)
        out = collectives.allreduce_flat(
            buf,
            op=op,
            wire_dtype=wire_dtype,
            out=_aligned_empty(buf.shape[0]),
            name=name,
        )
        return out, np.bool_(np.isfinite(out).all())

    return reduce


def _device_reduce(op: str, wire_dtype: str):
    """Reduction of a GPU-resident bucket, handed to MPI as a device buffer."""

    def reduce(buf: tf.Tensor):
        import cupy

        dev = cupy.from_dlpack(tf.experimental.dlpack.to_dlpack(buf))
        if wire_dtype == "float32":
            cuda.synchronize_device()
            out = dev.copy()
            w = world.world()
            w.comm.Allreduce(w.mpi.IN_PLACE, out, op=w.mpi.SUM)
            if op == "average":
                out /= w.comm.Get_size()
            cuda.path_counts["device"] += 1
        else:  # 16-bit wires reduce on the host (see runtime/wire.py)
            out = cupy.asarray(
                collectives.allreduce_flat(cupy.asnumpy(dev), op, wire_dtype)
            )
            cuda.path_counts["staged"] += 1
        finite = bool(cupy.isfinite(out).all())
        return tf.experimental.dlpack.from_dlpack(out.toDlpack()), finite

    return reduce


def _on_gpu(tensor: tf.Tensor) -> bool:
    return "GPU" in (tensor.device or "").upper()


def allreduce_gradients(
    grads, *, shapes, op: str, wire_dtype: str, bucket_bytes: int, step=None
):
    """Reduces a list of gradients across ranks inside a (compiled) train step.

    Gradients are cast to float32, concatenated into buckets of about
    `bucket_bytes` (planned in reverse order, so the last layers' gradients,
    which backprop produces first, can be sent while earlier ones are still
    being computed), reduced with one MPI call per bucket, and split back to
    their shapes and dtypes. `None` entries pass through.

    `shapes` are the variables' shapes, one per gradient. Buckets are planned
    from them, never from the gradients' static shapes, which can be partly
    unknown (a recurrent layer traced with an unknown batch size may give a
    gradient of static shape `(None, units)`); every gradient is reshaped to
    its variable's shape, so the plan and the split are the same on all ranks
    and at every step.

    `step` (an integer tensor, the optimizer's train-step counter) names the
    collective in stall reports, and before the first bucket all ranks check
    that they are at the same step (see `check_same_step`).

    Returns:
        `(reduced_grads, finite)`: the reduced gradients and a boolean scalar
        tensor, True when every reduced value is finite. Both are identical on
        all ranks, so decisions taken from them are global.
    """
    step = tf.constant(-1, tf.int64) if step is None else tf.cast(step, tf.int64)
    shapes = [tf.TensorShape(s) for s in shapes]
    if len(shapes) != len(grads) or not all(s.is_fully_defined() for s in shapes):
        raise ValueError(
            "allreduce_gradients needs one fully known variable shape per "
            f"gradient; received {len(shapes)} shapes for {len(grads)} gradients "
            f"({[s.as_list() for s in shapes]})."
        )
    dense = [
        None
        if g is None
        # IndexedSlices -> dense; the variable's static shape, whatever the
        # gradient's own static shape says.
        else tf.reshape(tf.convert_to_tensor(g), shape)
        for g, shape in zip(grads, shapes)
    ]
    present = [i for i, g in enumerate(dense) if g is not None]
    sizes = [shapes[i].num_elements() * 4 for i in present]
    reduced = list(dense)
    finite_flags = []
    use_device = cuda.cuda_aware() and any(_on_gpu(dense[i]) for i in present)
    buckets = plan_buckets(sizes, bucket_bytes)
    for b, bucket in enumerate(buckets):
        idx = [present[j] for j in bucket]
        label = f"gradient allreduce, bucket {b + 1}/{len(buckets)}"
        flat = tf.concat(
            [tf.reshape(tf.cast(dense[i], tf.float32), [-1]) for i in idx], 0
        )
        if use_device:
            out, finite = tf.py_function(
                _device_reduce(op, wire_dtype), [flat], [tf.float32, tf.bool]
            )
        else:
            # numpy_function is stateful, so tf.function's automatic control
            # dependencies run the buckets' collectives in creation order on
            # every rank: same MPI call sequence everywhere, no deadlock.
            out, finite = tf.numpy_function(
                _host_reduce(op, wire_dtype, label, check_step=b == 0),
                [flat, step],
                [tf.float32, tf.bool],
                stateful=True,
            )
        out.set_shape(flat.shape)
        finite_flags.append(tf.reshape(finite, []))
        parts = tf.split(out, [shapes[i].num_elements() for i in idx])
        for i, part in zip(idx, parts):
            reduced[i] = tf.cast(tf.reshape(part, dense[i].shape), dense[i].dtype)
    finite = (
        tf.reduce_all(tf.stack(finite_flags)) if finite_flags else tf.constant(True)
    )
    return reduced, finite


_XLA_ASSERT_WARNING = (
    "keras_mpfp16: this train step is compiled with XLA, which cannot raise "
    "errors from inside the step; non-finite steps are still skipped, but "
    "persistent non-finite gradients will not stop training. Compile with "
    "jit_compile=False to get the error."
)


def allreduce_tensors(tensors, op: str = "sum"):
    """Reduces a few small tensors of any numeric dtype in one MPI call, in-graph.

    For bookkeeping state such as metric accumulators, not gradients: values
    travel as float64 (exact for counts below 2**53) and come back in their
    own dtypes and shapes.

    Args:
        tensors: list of tensors (or variables).
        op: `"sum"`, `"average"`, `"min"` or `"max"`.

    Returns:
        List of reduced tensors, identical on every rank.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors or world.size() == 1:
        return tensors
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors], 0)

    def reduce(buf):
        return collectives.allreduce(buf, op=op).astype(np.float64)

    out = tf.numpy_function(reduce, [flat], tf.float64, stateful=True)
    out.set_shape(flat.shape)
    parts = tf.split(out, [int(np.prod(t.shape)) for t in tensors])
    return [tf.cast(tf.reshape(p, t.shape), t.dtype) for p, t in zip(parts, tensors)]


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
        sums = collectives.allgather_object(_checksum(arrays), name="replica checksum")
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
        tf.numpy_function(host, [step, *values], tf.bool, stateful=True)

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


def sync_on_first_step(owner, variables, root: int = 0) -> None:
    """In the train step: broadcast `variables` from `root` the first time only.

    All ranks hold the flag False before their first step, so all take the
    broadcast branch together.
    """
    flag = _sync_flags.get(owner)
    if flag is None:
        with tf.init_scope():
            flag = tf.Variable(False, trainable=False, name="keras_mpfp16_synced")
        _sync_flags[owner] = flag
    variables = list(variables)

    def broadcast(*arrays):
        return collectives.broadcast_arrays(list(arrays), root=root)

    def sync():
        values = [tf.convert_to_tensor(v) for v in variables]
        new = tf.numpy_function(
            broadcast, values, [v.dtype for v in values], stateful=True
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
