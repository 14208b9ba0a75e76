"""Gradient reduction inside a TensorFlow train step (part of the TF bridge).

Per train step, for a list of gradients:

* dense gradients are fused into buckets (planned from the variables'
  shapes, last layers first) and each bucket is reduced with one MPI call
  (float32 wire) or one Alltoall + one Allgather (16-bit wires);
* the first bucket also carries every rank's (epoch, train step) and the row
  counts of the sparse gradients, so the step check and the sparse/dense
  decision cost no MPI call of their own;
* `tf.IndexedSlices` gradients (Embedding) are reduced by an allgather of
  every rank's slices (rows and indices) when that moves fewer bytes than
  the dense tensor, decided from the allgathered slice counts (the same on
  every rank), else densely. Gathered slices reach the inner optimizer as
  the `tf.IndexedSlices` one process would have computed on the whole batch.

Buffers reach MPI in one of two ways, chosen once per process
(`reduction_path()`): on the host through `tf.numpy_function` (numpy views)
and `tf.py_function` (DLPack views of CPU tensors), or, with a CUDA-aware
MPI and a visible GPU, as device memory through DLPack (no CuPy, no host
copy). 16-bit wires are encoded and decoded in the graph; the only host-side
(or device-side) arithmetic left is the owner's float32 sum of its chunk.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from keras_mpfp16.backend.tf_order import ordered
from keras_mpfp16.optimizer.buckets import plan_buckets, sparse_is_cheaper
from keras_mpfp16.runtime import (
    collectives,
    cuda,
    env,
    progress,
    timeline,
    wire,
    world,
)

SPARSE_ENV = "KERAS_MPFP16_SPARSE_GRADIENTS"  # registered in runtime.env
SPARSE_MODES = env.setting("SPARSE_GRADIENTS").choices
_H = wire.HEADER_WORDS


# -- which path buffers take to MPI (decided once) ---------------------------------

_path: dict | None = None


def reduction_path() -> dict:
    """How gradient buffers reach MPI in this process, decided once.

    `"device"`: tensors are handed to MPI where they live, through DLPack
    (GPU memory needs a CUDA-aware MPI). Chosen when MPI reports CUDA support
    and TensorFlow sees a GPU, or when `KERAS_MPFP16_CUDA_AWARE=1` forces it
    (which on a CPU-only machine exercises the same code on host memory).
    `"host"`: buffers are staged through host memory.

    Returns:
        `{"path": "device" | "host", "reason": str, "gpus": int}`.
    """
    global _path
    if _path is None:
        aware, why = cuda.detection()
        forced = why.startswith(cuda.ENV_OVERRIDE)
        gpus = len(tf.config.list_logical_devices("GPU"))
        if aware and (forced or gpus):
            path = "device"
            reason = (
                f"forced by {why}"
                if forced
                else f"CUDA-aware MPI ({why}) and {gpus} GPU(s) visible to TensorFlow"
            )
        else:
            path = "host"
            if forced:
                reason = f"forced by {why}"
            elif not aware:
                reason = f"MPI does not report CUDA support ({why})"
            else:
                reason = f"MPI is CUDA-aware ({why}) but TensorFlow sees no GPU"
        _path = {"path": path, "reason": reason, "gpus": gpus}
    return dict(_path)


def _reset_reduction_path() -> None:
    """Forget the decision (tests change KERAS_MPFP16_CUDA_AWARE)."""
    global _path
    _path = None


def sparse_mode(mode: str | None = None) -> str:
    """`mode`, else `$KERAS_MPFP16_SPARSE_GRADIENTS`, else `"auto"` (validated)."""
    if mode is None:
        return env.get("SPARSE_GRADIENTS")  # validated there
    if mode not in SPARSE_MODES:
        raise ValueError(
            f"sparse={mode!r} is not understood; allowed values are {', '.join(SPARSE_MODES)}."
        )
    return mode


# -- the step check ---------------------------------------------------------------


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


# -- small helpers --------------------------------------------------------------------


def _aligned_empty(n: int) -> np.ndarray:
    """float32 array on a 64-byte boundary.

    TensorFlow adopts an aligned array returned from numpy_function as the
    output tensor's memory instead of copying it: one pass over the bucket
    saved. (It also means a returned buffer must never be reused.)
    """
    raw = np.empty(n * 4 + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + n * 4].view(np.float32)


def _host_finite(x: np.ndarray) -> np.bool_:
    """All finite? Two read passes, no temporary (NaN propagates through min/max)."""
    if x.size == 0:
        return np.bool_(True)
    return np.bool_(np.isfinite(x.min()) and np.isfinite(x.max()))


def _graph_finite(x):
    if x.shape.num_elements() == 0:
        return tf.constant(True)
    return tf.logical_and(
        tf.math.is_finite(tf.reduce_max(x)), tf.math.is_finite(tf.reduce_min(x))
    )


def _on_gpu(tensor) -> bool:
    """For concrete (eager) tensors only: a traced tensor's device is often ''."""
    return "GPU" in (tensor.device or "").upper()


def _dlpack(tensor) -> cuda.DLPackBuffer:
    return cuda.DLPackBuffer(tf.experimental.dlpack.to_dlpack(tensor))


def _sync(tensor) -> None:
    """GPU kernels run asynchronously: wait for them before MPI reads memory."""
    if _on_gpu(tensor):
        tf.test.experimental.sync_devices()


def _empty(shape, dtype, like):
    with tf.device(like.device):
        return tf.raw_ops.Empty(shape=shape, dtype=dtype, init=False)


def _epoch_tensor():
    """The current epoch as the callbacks reported it (a host read, no MPI)."""
    epoch = tf.numpy_function(
        lambda: np.int64(progress.epoch()), [], tf.int64, stateful=True
    )
    return tf.reshape(epoch, [])


def _slot_values(step, counts, epoch=None):
    epoch = _epoch_tensor() if epoch is None else epoch
    return tf.concat([tf.stack([epoch, step]), counts], 0)


def _float_slot_piece(step, counts, n: int, r: int):
    """This rank's (epoch, step, counts) as float32 pairs (`wire.float_slots`),
    at its place in an all-ranks block of zeros: summed over ranks, the block
    is every rank's slots. Built in the graph: the host function must not
    write into its input buffer, whose memory TensorFlow may share (a cached
    zeros constant inside a `cond` branch, as with gradient accumulation,
    kept the previous steps' slots and summed garbage)."""
    vals = _slot_values(step, counts)
    split = tf.constant(wire.SLOT_SPLIT, tf.int64)
    pairs = tf.stack([(vals + 1) // split, (vals + 1) % split], 1)
    mine = tf.reshape(tf.cast(pairs, tf.float32), [-1])
    m = int(mine.shape[0])
    return tf.pad(mine, [[r * m, (n - r - 1) * m]])


# -- the 16-bit row format in TensorFlow (mirrors runtime/wire.py) ------------------

_TF_WIRE = {"float16": tf.float16, "bfloat16": tf.bfloat16}


def _pow2(exponent):
    """2.0**exponent (int32 tensor, -126..127) as exact float32."""
    return tf.bitcast(tf.bitwise.left_shift(exponent + 127, 23), tf.float32)


def _fp16_exponents(amax):
    bits = tf.bitcast(amax, tf.int32)
    exponent = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 23), 0xFF)
    inexact = tf.cast(tf.bitwise.bitwise_and(bits, 0x7FFFFF) != 0, tf.int32)
    shift = tf.clip_by_value(
        wire.FP16_TARGET_EXP - (exponent - 127 + inexact),
        -wire.MAX_SHIFT,
        wire.MAX_SHIFT,
    )
    ok = tf.logical_and(tf.math.is_finite(amax), amax > 0)
    return tf.where(ok, shift, tf.zeros_like(shift))


def _encode(rows, wire_dtype: str, flag: bool, slots=None, force_flag=None):
    """float32 rows (R, c) -> uint16 rows [exponent, flags, slots..., values...].

    `flag`: compute the non-finite flag (always for float16, which needs the
    row maxima anyway; for bfloat16 only where asked: owners).
    """
    r = rows.shape[0]
    zeros = tf.zeros([r], tf.uint16)
    bad = None
    if wire_dtype == "float16" or flag:
        amax = tf.maximum(tf.reduce_max(rows, 1), -tf.reduce_min(rows, 1))
        bad = tf.logical_not(tf.math.is_finite(amax))
    if wire_dtype == "float16":
        exp = _fp16_exponents(amax)
        values = tf.cast(rows * _pow2(exp)[:, None], tf.float16)
        exp_words = tf.bitcast(tf.cast(exp, tf.int16), tf.uint16)
    else:
        values = tf.cast(rows, tf.bfloat16)
        exp_words = zeros
        if bad is not None:
            bad = tf.logical_or(bad, amax >= wire.BF16_OVERFLOW)
    if bad is not None and force_flag is not None:
        bad = tf.logical_or(bad, force_flag)
    flags = zeros if bad is None else tf.cast(bad, tf.uint16)
    pieces = [tf.stack([exp_words, flags], 1)]
    if slots is not None:
        # (Tile has no uint16 kernel; int16 has the same bits.)
        tiled = tf.tile(tf.bitcast(slots, tf.int16)[None, :], [r, 1])
        pieces.append(tf.bitcast(tiled, tf.uint16))
    pieces.append(tf.bitcast(values, tf.uint16))
    return tf.concat(pieces, 1)


def _decode(words, wire_dtype: str, scale: float):
    """uint16 rows [exponent, flags, values...] -> (flat float32, finite).

    The flat vector keeps the rows' padding at its end: callers split it off
    (a split is a pass they make anyway; a slice here would be another).
    """
    values = tf.cast(tf.bitcast(words[:, _H:], _TF_WIRE[wire_dtype]), tf.float32)
    if wire_dtype == "float16":
        exp = tf.cast(tf.bitcast(words[:, 0], tf.int16), tf.int32)
        factor = _pow2(-exp)
        if scale != 1.0:
            factor = factor * scale
        values = values * factor[:, None]
    elif scale != 1.0:
        values = values * scale
    flat = tf.reshape(values, [-1])
    flags = tf.bitwise.bitwise_and(words[:, 1], wire.FLAG_NONFINITE)
    return flat, tf.reduce_all(tf.equal(flags, 0))


def _owner_sum(recv, wire_dtype: str, slot_words: int):
    """The owner's step, in eager TensorFlow: float32 sum of the received rows,
    encoded as one row with its own exponent and non-finite flag.

    Eager ops, not a tf.function: called from a py_function, whose thread may
    be the rank's only inter-op thread, a nested function call would wait
    for that thread forever. Eager kernels run inline.
    """
    values = tf.cast(
        tf.bitcast(recv[:, _H + slot_words :], _TF_WIRE[wire_dtype]), tf.float32
    )
    if wire_dtype == "float16":
        exp = tf.cast(tf.bitcast(recv[:, 0], tf.int16), tf.int32)
        weights = _pow2(-exp)
    else:
        weights = tf.ones([recv.shape[0]], tf.float32)
    # sum_r weight_r * row_r as one (1 x N) @ (N x c) product: a single read of
    # the rows (3-4x faster here than scaling, then reducing). The weights are
    # powers of two, so every product is exact; only the sum rounds.
    partial = tf.matmul(weights[None, :], values)[0]
    carried = tf.reduce_any(
        tf.not_equal(tf.bitwise.bitwise_and(recv[:, 1], wire.FLAG_NONFINITE), 0)
    )
    return _encode(partial[None, :], wire_dtype, flag=True, force_flag=carried)


# -- the host functions run inside the step ------------------------------------------

_BUCKET_RE = re.compile(r"gradient allreduce, bucket (\d+)/")


def _bucket_index(label: str) -> int | None:
    """The bucket's 1-based index in the plan, None for other reductions."""
    m = _BUCKET_RE.match(label)
    return int(m.group(1)) if m else None


def _nbytes(buf) -> int:
    """Bytes of a numpy array (numpy_function) or an eager tensor (py_function)."""
    if isinstance(buf, np.ndarray):
        return int(buf.nbytes)
    return int(buf.shape.num_elements()) * buf.dtype.size


def _timed(body, label: str, length: int, wire_dtype: str, path: str):
    """`body` as the host function, recorded as the bucket's reduction span
    while a timeline records (`runtime.timeline`). Off, the only cost is the
    `recorder is None` branch: the step's graph is the same either way."""
    bucket = _bucket_index(label)
    if bucket is None:
        return body
    payload = 4 * length

    def run(buf, step):
        recorder = timeline.active()
        if recorder is None:
            return body(buf, step)
        with recorder.reduction(
            f"{label}, train step {int(step)}",
            bucket=bucket,
            nbytes=_nbytes(buf),
            payload_bytes=payload,
            wire=wire_dtype,
            path=path,
        ):
            return body(buf, step)

    return run


def _float32_host(label: str, first: bool, length: int, average: bool):
    """numpy_function body: float32 Allreduce of a bucket (+ the step slots)."""
    n = world.size()

    def reduce(buf, step):
        # `buf` is read-only here: its tail already holds this rank's slots
        # (`_float_slot_piece`).
        name = f"{label}, train step {int(step)}"
        out = _aligned_empty(buf.shape[0])
        collectives.allreduce_sum_into(buf, out, name)
        cuda.path_counts["host"] += 1
        grads = out[:length]
        finite = _host_finite(grads)
        if first:
            table = wire.slots_from_floats(out[length:], n)
            check_step_table(table, label)
        if average:
            collectives.divide_by_size(grads, n)
        return (out, finite, table) if first else (out, finite)

    return _timed(reduce, label, length, "float32", "host")


def _float32_device(label: str, first: bool, length: int):
    """py_function body: float32 Allreduce of DLPack buffers where they live."""
    n = world.size()

    def reduce(flat, step):
        name = f"{label}, train step {int(step)}"
        out = _empty(tf.shape(flat), tf.float32, flat)
        _sync(flat)
        collectives.allreduce_sum_into(_dlpack(flat), _dlpack(out), name)
        cuda.path_counts["device" if _on_gpu(flat) else "host"] += 1
        cuda.path_counts["dlpack"] += 1
        if not first:
            return [out]
        table = wire.slots_from_floats(out[length:].numpy(), n)
        check_step_table(table, label)
        return [out, tf.constant(table, tf.int64)]

    return _timed(reduce, label, length, "float32", "device (DLPack)")


def _lowp(
    label: str, wire_dtype: str, slot_words: int, device_buffers: bool, length: int
):
    """py_function body: the 16-bit wire (Alltoall, owner's sum, Allgather)."""
    n = world.size()

    def reduce(words, step):
        name = f"{label}, train step {int(step)}"
        staged = _on_gpu(words) and not device_buffers
        if staged:
            with tf.device("/CPU:0"):
                words = tf.identity(words)
        recv = _empty(tf.shape(words), tf.uint16, words)
        _sync(words)
        collectives.alltoall_into(_dlpack(words), _dlpack(recv), f"{name} (alltoall)")
        outputs = []
        if slot_words:
            table = wire.slots_from_words(recv[:, _H : _H + slot_words].numpy())
            check_step_table(table, label)
            outputs.append(tf.constant(table, tf.int64))
        with tf.device(words.device):
            mine = _owner_sum(recv, wire_dtype, slot_words)
        gathered = _empty([n, mine.shape[1]], tf.uint16, words)
        _sync(mine)
        collectives.allgather_into(_dlpack(mine), _dlpack(gathered), name)
        kind = "staged" if staged else ("device" if _on_gpu(words) else "host")
        cuda.path_counts[kind] += 1
        cuda.path_counts["dlpack"] += 1
        return [gathered, *outputs]

    path = "device (DLPack)" if device_buffers else "host (DLPack)"
    return _timed(reduce, label, length, wire_dtype, path)


def _sparse_host(label: str, row_width: int):
    """numpy_function body: allgather of (index, row) records of uneven counts."""

    def gather(records, counts, step):
        name = f"{label}, train step {int(step)}"
        rows = int(counts.sum())
        out = _aligned_empty(rows * row_width).reshape(rows, row_width)
        collectives.allgatherv_bytes(records, out, counts * (row_width * 4), name)
        cuda.path_counts["host"] += 1
        return out, _host_finite(out[:, 1:])

    return gather


# -- one bucket --------------------------------------------------------------------------


def _reduce_bucket(
    parts, length, *, first, step, counts, label, wire_dtype, average, device
):
    """Reduces the concatenation of float32 `parts` (`length` elements).

    Returns `(flat, tail, finite, table)`: the reduced float32 vector (averaged
    when `average`) followed by `tail` elements to drop (slots, padding: the
    caller's split drops them, so no pass is spent slicing), whether it is all
    finite (identical on all ranks), and for the first bucket the
    (ranks, 2 + sparse) slot table (else None).
    """
    n, r = world.size(), world.rank()
    scale = 1.0 / n if average else 1.0
    if wire_dtype == "float32" or length == 0:
        if device and length:
            pieces = list(parts)
            if first:
                pieces.append(_float_slot_piece(step, counts, n, r))
            flat = tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0]
            outs = ordered(
                lambda: tf.py_function(
                    _float32_device(label, first, length),
                    [flat, step],
                    [tf.float32, tf.int64] if first else [tf.float32],
                )
            )
            out = outs[0]
            out.set_shape(flat.shape)
            finite = _graph_finite(out)  # the slots are finite integers
            if scale != 1.0:
                out = out * scale
            tail = int(flat.shape[0]) - length
            return out, tail, finite, (outs[1] if first else None)
        # Host: numpy_function is stateful, so tf.function's automatic control
        # dependencies run the buckets' collectives in creation order on
        # every rank (same MPI call sequence everywhere, no deadlock).
        pieces = list(parts)
        if first:
            pieces.append(_float_slot_piece(step, counts, n, r))
        flat = tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0]
        inputs = [flat, step]
        outs = ordered(
            lambda: tf.numpy_function(
                _float32_host(label, first, length, average),
                inputs,
                [tf.float32, tf.bool] + ([tf.int64] if first else []),
                stateful=True,
            )
        )
        out = outs[0]
        out.set_shape(flat.shape)
        tail = int(flat.shape[0]) - length
        return out, tail, tf.reshape(outs[1], []), (outs[2] if first else None)
    # 16-bit wire: encode in the graph, move bytes, decode in the graph.
    chunk = wire.chunk_length(length, n)
    pieces = list(parts)
    if n * chunk > length:
        pieces.append(tf.zeros([n * chunk - length], tf.float32))
    flat = tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0]
    slots = None
    if first:
        slots = tf.reshape(tf.bitcast(_slot_values(step, counts), tf.uint16), [-1])
    words = _encode(tf.reshape(flat, [n, chunk]), wire_dtype, flag=False, slots=slots)
    k = 0 if slots is None else int(slots.shape[0])
    outs = ordered(
        lambda: tf.py_function(
            _lowp(label, wire_dtype, k, device, length),
            [words, step],
            [tf.uint16, tf.int64] if first else [tf.uint16],
        )
    )
    gathered = outs[0]
    gathered.set_shape([n, _H + chunk])
    out, finite = _decode(gathered, wire_dtype, scale)
    return out, n * chunk - length, finite, (outs[1] if first else None)


def _split(flat, sizes, tail):
    """`flat` cut into `sizes`, the `tail` dropped (one split, no extra slice)."""
    if tail:
        return tf.split(flat, [*sizes, tail])[:-1]
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]


# -- sparse gradients ----------------------------------------------------------------------


class _SparseGradient:
    """An IndexedSlices gradient, reduced as the slices one process would see.

    Every rank contributes its slices as they are (one per lookup, repeated
    indices included) and receives every rank's, so the inner optimizer gets
    the `tf.IndexedSlices` one process computes on the concatenated batch.
    That matters beyond the sum: Keras's optimizers square the *slices* of a
    sparse gradient (Adam's second moment adds the squares of repeated
    rows, not the square of their sum), so densifying or deduplicating the
    gradient would change the training trajectory (measured: the IMDB
    stand-in's Adam run collapses within an epoch with a densified Embedding
    gradient, also in one process). The slice count depends only on the
    indices (known after the forward pass), so the first bucket can carry
    it while backprop still runs.
    """

    def __init__(self, index: int, grad: tf.IndexedSlices, shape: tf.TensorShape):
        self.index = index
        self.shape = shape
        self.dtype = grad.values.dtype
        self.num_rows = int(shape[0])
        self.row_elems = int(shape[1:].num_elements())
        self.rows = tf.reshape(tf.cast(grad.values, tf.float32), [-1, self.row_elems])
        self.indices = tf.cast(grad.indices, tf.int32)
        self.count = tf.cast(tf.size(self.indices), tf.int64)

    def local_dense(self):
        """This rank's gradient as a dense float32 vector (repeats summed)."""
        dense = tf.math.unsorted_segment_sum(self.rows, self.indices, self.num_rows)
        return tf.reshape(dense, [-1])

    def as_slices(self, flat_dense):
        """A dense reduced gradient in the same form as `allgather`'s result:
        every row, once (`tf.cond` needs one structure for both paths)."""
        rows = tf.reshape(flat_dense, [self.num_rows, self.row_elems])
        return rows, tf.range(self.num_rows, dtype=tf.int32)

    def allgather(self, counts, step, label: str, average: bool):
        """Every rank's slices (rows, indices), in rank order, and finite."""
        n = world.size()
        records = tf.concat(
            [tf.bitcast(self.indices, tf.float32)[:, None], self.rows], 1
        )
        gathered, finite = ordered(
            lambda: tf.numpy_function(
                _sparse_host(label, self.row_elems + 1),
                [records, counts, step],
                [tf.float32, tf.bool],
                stateful=True,
            )
        )
        gathered.set_shape([None, self.row_elems + 1])
        index = tf.bitcast(gathered[:, 0], tf.int32)
        rows = gathered[:, 1:]
        if average:
            rows = rows * (1.0 / n)
        return (rows, index), tf.reshape(finite, [])


# -- the entry point --------------------------------------------------------------------------


# Plain Python building a graph: nothing for AutoGraph to convert (it would
# otherwise try to convert mpi4py's methods and warn).
@tf.autograph.experimental.do_not_convert
def allreduce_gradients(
    grads,
    *,
    shapes,
    op: str,
    wire_dtype: str,
    bucket_bytes: int,
    step=None,
    sparse: str | None = None,
):
    """Reduces a list of gradients across ranks inside a (compiled) train step.

    Dense gradients are cast to float32, concatenated into buckets of about
    `bucket_bytes` (planned in reverse order, so the last layers' gradients,
    which backprop produces first, can be sent while earlier ones are still
    being computed), reduced with one MPI call per bucket (two for a 16-bit
    wire: Alltoall + Allgather, encoded and decoded in the graph), and split
    back to their shapes and dtypes. `None` entries pass through.

    `shapes` are the variables' shapes, one per gradient. Buckets are planned
    from them, never from the gradients' static shapes, which can be partly
    unknown (a recurrent layer traced with an unknown batch size may give a
    gradient of static shape `(None, units)`); every gradient is reshaped to
    its variable's shape, so the plan and the split are the same on all ranks
    and at every step.

    The first bucket's MPI call also carries every rank's (epoch, `step`) --
    all ranks raise the same error together when they differ (see
    `check_step_table`) -- and the row counts of the sparse gradients.

    `tf.IndexedSlices` gradients: with `sparse="auto"` (default) each is
    reduced by an allgather of every rank's (index, row) slices when that
    moves fewer bytes than the dense tensor on the wire, else densely
    (decided in the step from the allgathered counts, so the same on every
    rank); `"sparse"` always gathers, `"dense"` densifies them into the
    buckets. `$KERAS_MPFP16_SPARSE_GRADIENTS` sets the default. Gathered rows
    travel as float32 whatever `wire_dtype` is. A gathered gradient comes
    back as the `tf.IndexedSlices` one process would have (all ranks'
    slices, values averaged), so the inner optimizer treats it exactly as
    in one process; a densely reduced one as the sum over ranks, every row
    once (an IndexedSlices over all rows under `"auto"`, a dense tensor
    under `"dense"`). For optimizers linear in the gradient (SGD) both are
    the same update; Adam-like optimizers square the slices, so there the
    dense form is a different (the pre-0.2, Horovod `sparse_as_dense`)
    trajectory: `"sparse"` always gives one process's.

    Args:
        grads: Gradients (tensors, `tf.IndexedSlices` or None).
        shapes: The variables' shapes, one per gradient.
        op: `"sum"` or `"average"`.
        wire_dtype: `"float32"`, `"float16"` or `"bfloat16"`.
        bucket_bytes: Bucket size in float32 bytes.
        step: Integer tensor, the train step (named in stall reports and
            checked across ranks); -1 when None.
        sparse: `"auto"`, `"sparse"`, `"dense"` or None (environment/default).

    Returns:
        `(reduced_grads, finite)`: the reduced (dense) gradients and a boolean
        scalar tensor, True when every reduced value is finite. Both are
        identical on all ranks, so decisions taken from them are global.
    """
    step = tf.constant(-1, tf.int64) if step is None else tf.cast(step, tf.int64)
    shapes = [tf.TensorShape(s) for s in shapes]
    if len(shapes) != len(grads) or not all(s.is_fully_defined() for s in shapes):
        raise ValueError(
            "allreduce_gradients needs one fully known variable shape per "
            f"gradient; received {len(shapes)} shapes for {len(grads)} gradients "
            f"({[s.as_list() for s in shapes]})."
        )
    wire_dtype = wire.validate_wire_dtype(wire_dtype)
    if op not in ("sum", "average"):
        raise ValueError(f"Unknown op {op!r}; allowed values are 'sum', 'average'.")
    mode = sparse_mode(sparse)
    device = reduction_path()["path"] == "device"
    average = op == "average"

    dense: dict[int, tf.Tensor] = {}
    sparse_grads: list[_SparseGradient] = []
    for i, (g, shape) in enumerate(zip(grads, shapes)):
        if g is None:
            continue
        if (
            isinstance(g, tf.IndexedSlices)
            and mode != "dense"
            and shape.rank >= 1
            and shape[0] < 2**31
        ):
            sparse_grads.append(_SparseGradient(i, g, shape))
        else:
            # IndexedSlices -> dense; the variable's static shape, whatever
            # the gradient's own static shape says.
            dense[i] = tf.reshape(tf.convert_to_tensor(g), shape)
    present = sorted(dense)
    sizes = [shapes[i].num_elements() * 4 for i in present]
    buckets = plan_buckets(sizes, bucket_bytes) if present else []
    if sparse_grads and not buckets:
        buckets = [[]]  # the slots still need their call
    counts = (
        tf.stack([s.count for s in sparse_grads])
        if sparse_grads
        else tf.zeros([0], tf.int64)
    )

    reduced = [None] * len(grads)
    finite_flags = []
    table = None
    for b, bucket in enumerate(buckets):
        idx = [present[j] for j in bucket]
        parts = [tf.reshape(tf.cast(dense[i], tf.float32), [-1]) for i in idx]
        length = sum(shapes[i].num_elements() for i in idx)
        flat, tail, finite, tbl = _reduce_bucket(
            parts,
            length,
            first=b == 0,
            step=step,
            counts=counts,
            label=f"gradient allreduce, bucket {b + 1}/{len(buckets)}",
            wire_dtype=wire_dtype,
            average=average,
            device=device,
        )
        if b == 0:
            table = tbl
        finite_flags.append(finite)
        if idx:
            pieces = _split(flat, [shapes[i].num_elements() for i in idx], tail)
            for i, piece in zip(idx, pieces):
                reduced[i] = tf.cast(tf.reshape(piece, shapes[i]), dense[i].dtype)

    itemsize = wire.wire_itemsize(wire_dtype)
    for j, s in enumerate(sparse_grads):
        label = f"sparse gradient {j + 1}/{len(sparse_grads)}"
        counts_j = table[:, 2 + j]

        # Branches of tf.cond: plain Python, not for AutoGraph to convert.
        @tf.autograph.experimental.do_not_convert
        def gather(s=s, counts_j=counts_j, label=label):
            return s.allgather(counts_j, step, label + " (allgather)", average)

        @tf.autograph.experimental.do_not_convert
        def dense_reduce(s=s, label=label):
            size = s.num_rows * s.row_elems
            out, tail, fin, _ = _reduce_bucket(
                [s.local_dense()],
                size,
                first=False,
                step=step,
                counts=counts,
                label=label + " (dense allreduce)",
                wire_dtype=wire_dtype,
                average=average,
                device=device,
            )
            return s.as_slices(_split(out, [size], tail)[0]), fin

        if mode == "sparse":
            (rows, index), fin = gather()
        else:
            use_sparse = sparse_is_cheaper(
                tf.reduce_sum(counts_j), s.row_elems, s.num_rows, itemsize
            )
            (rows, index), fin = tf.cond(use_sparse, gather, dense_reduce)
        finite_flags.append(fin)
        reduced[s.index] = tf.IndexedSlices(
            tf.cast(tf.reshape(rows, [-1, *s.shape[1:]]), s.dtype),
            index,
            dense_shape=tf.constant(s.shape.as_list(), tf.int64),
        )
    finite = (
        tf.reduce_all(tf.stack(finite_flags)) if finite_flags else tf.constant(True)
    )
    return reduced, finite
