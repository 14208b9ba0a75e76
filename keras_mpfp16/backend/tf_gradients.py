"""Gradient reduction inside a TensorFlow train step (part of the TF bridge).

Per train step, for a list of gradients:

* dense gradients are fused into buckets (planned from the variables'
  shapes, last layers first: `backend/buckets.py`) and each bucket is
  reduced with one MPI call (float32 wire) or one Alltoall (or, for large
  rows at 3+ ranks, a ring of Sendrecv steps: `runtime/mpi/ring.py`) + one
  Allgather (16-bit wires, encoded and decoded in the graph: `tf_wire.py`);
* the first bucket also carries every rank's (epoch, train step) and the row
  counts of the sparse gradients, so the step check and the sparse/dense
  decision cost no MPI call of their own (`tf_steps.py`);
* `tf.IndexedSlices` gradients (Embedding) are reduced by an allgather of
  every rank's slices (rows and indices) when that moves fewer bytes than
  the dense tensor, decided from the allgathered slice counts (the same on
  every rank), else densely (`tf_sparse.py`). Gathered slices reach the
  inner optimizer as the `tf.IndexedSlices` one process would have computed
  on the whole batch.

Buffers reach MPI on the host or as device memory through DLPack, chosen
once per process (`tf_path.reduction_path()`). The only host-side (or
device-side) arithmetic left is the owner's float32 sum of its chunk. This
module composes those pieces: the host functions run inside the step, the
reduction of one bucket, and `allreduce_gradients`.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_mpfp16 import _settings, _validate
from keras_mpfp16.backend.buckets import plan_buckets, sparse_is_cheaper
from keras_mpfp16.backend.tf_order import ordered
from keras_mpfp16.backend.tf_path import (
    aligned_empty,
    aligned_words,
    dlpack_buffer,
    empty_like_device,
    graph_finite,
    host_finite,
    host_tensor,
    on_gpu,
    reduction_path,
    sync_device,
)
from keras_mpfp16.backend.tf_sparse import (
    SparseGradient,
    reduced_as_slices,
    sparse_mode,
)
from keras_mpfp16.backend.tf_steps import (
    check_step_table,
    encoded_slots,
    float_slot_piece,
)
from keras_mpfp16.backend.tf_wire import decode_rows, encode_rows, owner_sum
from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.mpi import (
    collectives,
    cuda,
    observers,
    pipeline,
    ring,
    wire,
    world,
)
from keras_mpfp16.runtime.mpi import overlap as overlap_module
from keras_mpfp16.runtime.supervision import stall

_H = wire.HEADER_WORDS
# 16-bit rows of at most this many values (per rank, per bucket) on the host
# take numpy between the collectives (`_lowp`): numpy's owner's sum was
# faster than the XLA-fused one at every size up to 32Ki values at N = 2, 4
# and 8, and slower at 256Ki (examples/benchmarks/owner_sum_cost.py, a loaded
# 2-core machine; docs/benchmarks.md, "The per-collective cost").
HOST_NUMPY_MAX_ELEMENTS = 2**15


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
    while a timeline records (`runtime.trace`). Off, the only cost is the
    `recorder is None` branch: the step's graph is the same either way."""
    bucket = _bucket_index(label)
    if bucket is None:
        return body
    payload = 4 * length

    def run(buf, step):
        recorder = trace.active()
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
        # (`float_slot_piece`).
        name = f"{label}, train step {int(step)}"
        out = aligned_empty(buf.shape[0])
        collectives.allreduce_sum_into(buf, out, name)
        cuda.path_counts["host"] += 1
        grads = out[:length]
        finite = host_finite(grads)
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
        out = empty_like_device(tf.shape(flat), tf.float32, flat)
        sync_device(flat)
        collectives.allreduce_sum_into(dlpack_buffer(flat), dlpack_buffer(out), name)
        cuda.path_counts["device" if on_gpu(flat) else "host"] += 1
        cuda.path_counts["dlpack"] += 1
        if not first:
            return [out]
        table = wire.slots_from_floats(out[length:].numpy(), n)
        check_step_table(table, label)
        return [out, tf.constant(table, tf.int64)]

    return _timed(reduce, label, length, "float32", "device (DLPack)")


def _lowp(
    label: str,
    wire_dtype: str,
    slot_words: int,
    device_buffers: bool,
    length: int,
    schedule: str = "alltoall",
):
    """py_function body: the 16-bit wire (the owner's sum by `Alltoall` or
    around the ring, as `schedule` says; then an Allgather)."""
    n, r = world.size(), world.rank()
    k = slot_words

    def strip_slots(rows):
        return tf.concat([rows[:, :_H], rows[:, _H + k :]], 1) if k else rows

    def ring_owner_row(words, name):
        # Every rank's row j, summed around the ring in float32 by the same
        # owner_sum the Alltoall path uses (2 rows: commutative, exact order).
        def own_row(j):
            return strip_slots(words[j : j + 1])

        def add(got, j):
            return owner_sum(tf.concat([got, own_row(j)], 0), wire_dtype, 0)

        def buffer(row):
            sync_device(row)
            return dlpack_buffer(row)

        width = int(words.shape[1]) - k
        return collectives.ring_reduce_scatter(
            own_row,
            add,
            lambda: empty_like_device([1, width], tf.uint16, words),
            buffer,
            f"{name} (ring)",
        )

    def reduce_small_on_host(words, name):
        # A small bucket on the host: numpy between the two collectives
        # instead of eager TensorFlow (no Empty ops, no XLA launch for the
        # owner's sum; each costs 100s of us to ms of dispatch on a loaded
        # core, more than the transfer). `wire.owner_sum` sums in rank order
        # in float32 like the fused TensorFlow stage: the same bits
        # (tests/test_wire.py), so every rank gets what the eager path gives.
        recv = aligned_words(n, int(words.shape[1]))
        collectives.alltoall_into(
            dlpack_buffer(words),
            recv,
            f"{name} (alltoall)",
            block_bytes=int(words.shape[1]) * 2,  # uint16 words
        )
        outputs = []
        if k:
            table = wire.slots_from_words(recv[:, _H : _H + k])
            check_step_table(table, label)
            outputs.append(tf.constant(table, tf.int64))
        mine = wire.owner_sum(recv, wire_dtype, k)
        gathered = aligned_words(n, mine.shape[1])
        collectives.allgather_into(mine, gathered, name, block_bytes=mine.shape[1] * 2)
        cuda.path_counts["host"] += 1
        cuda.path_counts["dlpack"] += 1
        return [host_tensor(gathered), *outputs]

    def reduce(words, step):
        name = f"{label}, train step {int(step)}"
        if (
            schedule != "ring"
            and int(words.shape[1]) - _H - k <= HOST_NUMPY_MAX_ELEMENTS
            and not on_gpu(words)
        ):
            return reduce_small_on_host(words, name)
        staged = on_gpu(words) and not device_buffers
        if staged:
            with tf.device("/CPU:0"):
                words = tf.identity(words)
        outputs = []
        with tf.device(words.device):
            if schedule == "ring":
                mine = ring_owner_row(words, name)
                if k:  # the slots ride in the allgather instead
                    mine = tf.concat(
                        [mine[:, :_H], words[r : r + 1, _H : _H + k], mine[:, _H:]], 1
                    )
            else:
                recv = empty_like_device(tf.shape(words), tf.uint16, words)
                sync_device(words)
                collectives.alltoall_into(
                    dlpack_buffer(words),
                    dlpack_buffer(recv),
                    f"{name} (alltoall)",
                    block_bytes=int(words.shape[1]) * 2,  # uint16 words
                )
                if k:
                    table = wire.slots_from_words(recv[:, _H : _H + k].numpy())
                    check_step_table(table, label)
                    outputs.append(tf.constant(table, tf.int64))
                mine = owner_sum(recv, wire_dtype, k)
        gathered = empty_like_device([n, mine.shape[1]], tf.uint16, words)
        sync_device(mine)
        collectives.allgather_into(
            dlpack_buffer(mine),
            dlpack_buffer(gathered),
            name,
            block_bytes=int(mine.shape[1]) * 2,  # uint16 words
        )
        if schedule == "ring" and k:
            table = wire.slots_from_words(gathered[:, _H : _H + k].numpy())
            check_step_table(table, label)
            outputs.append(tf.constant(table, tf.int64))
            with tf.device(words.device):
                gathered = strip_slots(gathered)
        kind = "staged" if staged else ("device" if on_gpu(words) else "host")
        cuda.path_counts[kind] += 1
        cuda.path_counts["dlpack"] += 1
        return [gathered, *outputs]

    path = "device (DLPack)" if device_buffers else "host (DLPack)"
    return _timed(reduce, label, length, wire_dtype, path)


def _lowp_pipelined(
    label: str, wire_dtype: str, slot_words: int, length: int, segments: int
):
    """py_function body: the 16-bit wire on the pipelined schedule
    (`pipeline.reduce_segments`), through host memory. The owners' sums are
    numpy's (`wire.owner_sum`, bit for bit the TensorFlow stage's) for
    segments up to `HOST_NUMPY_MAX_ELEMENTS` values, the fused TensorFlow
    stage above; the first segment's rows carry the step slots."""
    n = world.size()
    k = slot_words

    def reduce(words, step):
        name = f"{label}, train step {int(step)}"
        host = words.numpy()  # no copy for a host tensor; a GPU one is staged
        send = host.reshape(segments, n, host.shape[1])
        width = host.shape[1] - k
        gathered = aligned_words(segments * n, width)
        outputs = []

        def owner(recv, s):
            if s == 0 and k:
                table = wire.slots_from_words(recv[:, _H : _H + k])
                check_step_table(table, label)
                outputs.append(tf.constant(table, tf.int64))
            if width - _H <= HOST_NUMPY_MAX_ELEMENTS:
                return wire.owner_sum(recv, wire_dtype, k)
            return owner_sum(tf.constant(recv), wire_dtype, k).numpy()

        collectives.pipelined_reduce(
            send, owner, gathered.reshape(segments, n, width), name
        )
        cuda.path_counts["host"] += 1
        return [host_tensor(gathered), *outputs]

    return _timed(reduce, label, length, wire_dtype, "host (pipelined)")


# -- one bucket --------------------------------------------------------------------------


def _concat(pieces):
    return tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0]


def _float32_pieces(parts, first, step, counts):
    """The bucket's parts, followed on the first bucket by this rank's slots."""
    n, r = world.size(), world.rank()
    pieces = list(parts)
    if first:
        pieces.append(float_slot_piece(step, counts, n, r))
    return pieces


class _Plan(NamedTuple):
    """One bucket's reduction as graph pieces: the host function `fn` called
    on `inputs` (`numpy`: a numpy_function, else a py_function) with outputs
    `tout`, and `finish(outs)`, which returns `_reduce_bucket`'s result.
    `overlap`: whether the communication thread may run `fn`."""

    fn: object
    inputs: list
    tout: list
    numpy: bool
    finish: object
    overlap: bool


def _host_call(fn, inputs, tout, numpy):
    if numpy:
        return tf.numpy_function(fn, inputs, tout, stateful=True)
    return tf.py_function(fn, inputs, tout)


def _run(plan: _Plan):
    """The bucket reduced synchronously: its host function in the step's
    order of collectives (`ordered`), on the step's thread."""
    return plan.finish(
        ordered(lambda: _host_call(plan.fn, plan.inputs, plan.tout, plan.numpy))
    )


def _plan_float32_device(parts, length, *, first, step, counts, label, scale):
    """float32 wire, DLPack buffers where they live (a py_function)."""
    flat = _concat(_float32_pieces(parts, first, step, counts))

    def finish(outs):
        out = outs[0]
        out.set_shape(flat.shape)
        finite = graph_finite(out)  # the slots are finite integers
        if scale != 1.0:
            out = out * scale
        tail = int(flat.shape[0]) - length
        return out, tail, finite, (outs[1] if first else None)

    return _Plan(
        _float32_device(label, first, length),
        [flat, step],
        [tf.float32, tf.int64] if first else [tf.float32],
        False,
        finish,
        False,
    )


def _plan_float32_host(parts, length, *, first, step, counts, label, average):
    """float32 wire through host memory (a numpy_function)."""
    # Host: numpy_function is stateful, so tf.function's automatic control
    # dependencies run the buckets' collectives in creation order on
    # every rank (same MPI call sequence everywhere, no deadlock).
    flat = _concat(_float32_pieces(parts, first, step, counts))

    def finish(outs):
        out = outs[0]
        out.set_shape(flat.shape)
        tail = int(flat.shape[0]) - length
        return out, tail, tf.reshape(outs[1], []), (outs[2] if first else None)

    return _Plan(
        _float32_host(label, first, length, average),
        [flat, step],
        [tf.float32, tf.bool] + ([tf.int64] if first else []),
        True,
        finish,
        True,
    )


def _plan_lowp(parts, length, *, first, step, counts, label, wire_dtype, scale, device):
    """16-bit wire: encode in the graph, move bytes, decode in the graph.

    One `Alltoall` (or ring) + allgather per bucket as N rows of a chunk
    each; or, on the pipelined schedule (`runtime/mpi/pipeline.py`), the
    bucket as `segments` x N rows of `seg` values (each row with its own
    exponent), moved and summed segment by segment on the host. Either way
    the flat order is the rows' order, so the decoded vector needs no
    reordering."""
    n = world.size()
    chunk = wire.chunk_length(length, n)
    schedule = ring.reduce_scatter_schedule(n, (_H + chunk) * 2)
    segments, seg = pipeline.plan(length, n)
    if segments > 1 and schedule != "ring" and not device:
        rows, width = segments * n, seg

        def body(k):
            return _lowp_pipelined(label, wire_dtype, k, length, segments)

    else:
        rows, width = n, chunk

        def body(k):
            return _lowp(label, wire_dtype, k, device, length, schedule)

    return _encoded_reduction(
        parts,
        length,
        rows,
        width,
        body,
        first=first,
        step=step,
        counts=counts,
        wire_dtype=wire_dtype,
        scale=scale,
        overlap=not device,
    )


def _encoded_reduction(
    parts,
    length,
    rows,
    width,
    body,
    *,
    first,
    step,
    counts,
    wire_dtype,
    scale,
    overlap,
):
    """The 16-bit wire's graph around its host function: the bucket padded
    to `rows` x `width` values, encoded (the first bucket's rows carry the
    step slots), moved by `body(slot_words)` (a py_function body), decoded.
    Returns what `_reduce_bucket` returns."""
    pieces = list(parts)
    if rows * width > length:
        pieces.append(tf.zeros([rows * width - length], tf.float32))
    flat = _concat(pieces)
    slots = encoded_slots(step, counts) if first else None
    words = encode_rows(
        tf.reshape(flat, [rows, width]), wire_dtype, flag=False, slots=slots
    )
    k = 0 if slots is None else int(slots.shape[0])

    def finish(outs):
        gathered = outs[0]
        gathered.set_shape([rows, _H + width])
        out, finite = decode_rows(gathered, wire_dtype, scale)
        return out, rows * width - length, finite, (outs[1] if first else None)

    return _Plan(
        body(k),
        [words, step],
        [tf.uint16, tf.int64] if first else [tf.uint16],
        False,
        finish,
        overlap,
    )


def _reduce_bucket(parts, length, **kwargs):
    """Reduces the concatenation of float32 `parts` (`length` elements).

    Returns `(flat, tail, finite, table)`: the reduced float32 vector (averaged
    when `average`) followed by `tail` elements to drop (slots, padding: the
    caller's split drops them, so no pass is spent slicing), whether it is all
    finite (identical on all ranks), and for the first bucket the
    (ranks, 2 + sparse) slot table (else None).
    """
    return _run(_plan_bucket(parts, length, **kwargs))


def _plan_bucket(
    parts, length, *, first, step, counts, label, wire_dtype, average, device
):
    """`_reduce_bucket`'s graph pieces (`_Plan`), not yet called."""
    scale = 1.0 / world.size() if average else 1.0
    common = dict(first=first, step=step, counts=counts, label=label)
    if wire_dtype == "float32" or length == 0:
        if device and length:
            return _plan_float32_device(parts, length, scale=scale, **common)
        return _plan_float32_host(parts, length, average=average, **common)
    return _plan_lowp(
        parts, length, wire_dtype=wire_dtype, scale=scale, device=device, **common
    )


def _split(flat, sizes, tail):
    """`flat` cut into `sizes`, the `tail` dropped (one split, no extra slice)."""
    if tail:
        return tf.split(flat, [*sizes, tail])[:-1]
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]


# -- the pieces of allreduce_gradients ---------------------------------------------------


def _checked_arguments(grads, shapes, op, wire_dtype, step):
    """Validated `(step, shapes, wire_dtype)`; raises on bad arguments."""
    step = tf.constant(-1, tf.int64) if step is None else tf.cast(step, tf.int64)
    shapes = [tf.TensorShape(s) for s in shapes]
    if len(shapes) != len(grads) or not all(s.is_fully_defined() for s in shapes):
        raise ValueError(
            "allreduce_gradients needs one fully known variable shape per "
            f"gradient; received {len(shapes)} shapes for {len(grads)} gradients "
            f"({[s.as_list() for s in shapes]})."
        )
    wire_dtype = wire.validate_wire_dtype(wire_dtype)
    _validate.one_of("op", op, ("sum", "average"))
    return step, shapes, wire_dtype


def _sort_gradients(grads, shapes, mode):
    """`(dense, sparse)`: {index: dense tensor of the variable's shape} and the
    gradients kept as slices (`SparseGradient`). `None` entries are in neither."""
    dense: dict[int, tf.Tensor] = {}
    sparse_grads: list[SparseGradient] = []
    for i, (g, shape) in enumerate(zip(grads, shapes)):
        if g is None:
            continue
        if reduced_as_slices(g, shape, mode):
            sparse_grads.append(SparseGradient(i, g, shape))
        else:
            # IndexedSlices -> dense; the variable's static shape, whatever
            # the gradient's own static shape says.
            dense[i] = tf.reshape(tf.convert_to_tensor(g), shape)
    return dense, sparse_grads


def _reduce_dense(
    dense,
    shapes,
    reduced,
    finite_flags,
    *,
    bucket_bytes,
    has_sparse,
    overlap=False,
    **reduction,
):
    """Reduces the dense gradients bucket by bucket into `reduced` (by index),
    appending each bucket's finite flag. Returns the first bucket's slot table
    (None without buckets); with sparse gradients there is always a first
    bucket, since their row counts travel in its slots. `overlap`: the
    buckets go to the communication thread (`_overlapped`)."""
    present = sorted(dense)
    sizes = [shapes[i].num_elements() * 4 for i in present]
    buckets = plan_buckets(sizes, bucket_bytes) if present else []
    if has_sparse and not buckets:
        buckets = [[]]  # the slots still need their call
    plans, members = [], []
    for b, bucket in enumerate(buckets):
        idx = [present[j] for j in bucket]
        parts = [tf.reshape(tf.cast(dense[i], tf.float32), [-1]) for i in idx]
        length = sum(shapes[i].num_elements() for i in idx)
        plans.append(
            _plan_bucket(
                parts,
                length,
                first=b == 0,
                label=f"gradient allreduce, bucket {b + 1}/{len(buckets)}",
                **reduction,
            )
        )
        members.append(idx)
    if overlap and plans and all(p.overlap for p in plans):
        results = _overlapped(plans, reduction["step"])
    else:
        results = [_run(p) for p in plans]
    table = None
    for b, (idx, (flat, tail, finite, tbl)) in enumerate(zip(members, results)):
        if b == 0:
            table = tbl
        finite_flags.append(finite)
        if idx:
            pieces = _split(flat, [shapes[i].num_elements() for i in idx], tail)
            for i, piece in zip(idx, pieces):
                reduced[i] = tf.cast(tf.reshape(piece, shapes[i]), dense[i].dtype)
    return table


# -- the communication thread (KERAS_MPFP16_OVERLAP) ------------------------------------


def _on_comm_thread(job):
    # The thread's collectives: on their own communicator, watched by no
    # observer (the step's thread, waiting for them, is).
    with observers.unobserved(), collectives.gradient_channel("overlap"):
        return job()


def _submit_body(plan: _Plan, index: int, total: int):
    """Host function of bucket `index`'s submit op: hands the bucket to the
    communication thread (a copy of numpy inputs: TensorFlow may reuse their
    memory once the op returns; eager tensors are immutable) and returns its
    ticket at once."""

    def submit(*args):
        if plan.numpy:
            args = [np.array(a, copy=True) for a in args]
        ticket = overlap_module.comm_thread(_on_comm_thread).submit(
            (index, total), functools.partial(plan.fn, *args)
        )
        if index == total:  # every gradient exists: the backward pass is over
            recorder = trace.active()
            if recorder is not None:
                recorder.gradients_ready()
        return np.int64(ticket)

    return submit


def _wait_body(label: str):
    """Host function of a bucket's wait op: its result from the
    communication thread. The stall inspector sees this thread waiting in
    the bucket's reduction, under the name the synchronous path uses."""

    def wait(ticket, step):
        with stall.collective(f"{label}, train step {int(step)}"):
            outs = overlap_module.comm_thread(_on_comm_thread).wait(int(ticket))
        return list(outs) if isinstance(outs, (tuple, list)) else [outs]

    return wait


def _overlapped(plans, step):
    """The buckets reduced on the communication thread while the backward
    pass runs: one submit op per bucket, in bucket order (the step's order
    of collectives, `ordered`: never blocked, so each runs once its
    bucket's gradients exist), then one wait op per bucket after the last
    submit. Each bucket runs the same host function as the synchronous path
    on the same inputs: the same bits."""
    total = len(plans)
    tickets = [
        ordered(
            lambda p=p, b=b: _host_call(
                _submit_body(p, b + 1, total), p.inputs, tf.int64, p.numpy
            )
        )
        for b, p in enumerate(plans)
    ]
    results = []
    for b, (p, ticket) in enumerate(zip(plans, tickets)):
        label = f"gradient allreduce, bucket {b + 1}/{total}"
        outs = ordered(
            lambda p=p, t=ticket, label=label: _host_call(
                _wait_body(label), [t, step], p.tout, p.numpy
            )
        )
        results.append(p.finish(outs))
    return results


def overlap_enabled() -> bool:
    """Whether this step's dense buckets go to the communication thread:
    `KERAS_MPFP16_OVERLAP` on, 2+ ranks and MPI_THREAD_MULTIPLE on every
    rank (else the synchronous path, with a warning on rank 0 once)."""
    global _warned_thread_level
    if not _settings.get("OVERLAP") or world.size() < 2:
        return False
    if world.thread_multiple():
        return True
    if world.rank() == 0 and not _warned_thread_level:
        _warned_thread_level = True
        warnings.warn(
            "KERAS_MPFP16_OVERLAP=1 needs MPI_THREAD_MULTIPLE on every rank "
            "(the communication thread calls MPI while the step's thread "
            "may); this MPI runs below it, so the gradient buckets are "
            "reduced synchronously.",
            RuntimeWarning,
            stacklevel=2,
        )
    return False


_warned_thread_level = False


def _reduce_sparse(sparse_grads, table, reduced, finite_flags, *, mode, **reduction):
    """Reduces each sparse gradient into `reduced` (by index): gathered, or
    densely where that moves fewer bytes (`mode="auto"`, decided from the
    slot table's counts, the same on every rank), appending its finite flag."""
    step, average = reduction["step"], reduction["average"]
    itemsize = wire.wire_itemsize(reduction["wire_dtype"])
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
                label=label + " (dense allreduce)",
                **reduction,
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
        reduced[s.index] = s.reduced(rows, index)


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
    step, shapes, wire_dtype = _checked_arguments(grads, shapes, op, wire_dtype, step)
    mode = sparse_mode(sparse)
    dense, sparse_grads = _sort_gradients(grads, shapes, mode)
    counts = (
        tf.stack([s.count for s in sparse_grads])
        if sparse_grads
        else tf.zeros([0], tf.int64)
    )
    # What every bucket reduction of this step shares.
    reduction = dict(
        step=step,
        counts=counts,
        wire_dtype=wire_dtype,
        average=op == "average",
        device=reduction_path()["path"] == "device",
    )
    reduced = [None] * len(grads)
    finite_flags = []
    table = _reduce_dense(
        dense,
        shapes,
        reduced,
        finite_flags,
        bucket_bytes=bucket_bytes,
        has_sparse=bool(sparse_grads),
        overlap=overlap_enabled(),
        **reduction,
    )
    _reduce_sparse(sparse_grads, table, reduced, finite_flags, mode=mode, **reduction)
    finite = (
        tf.reduce_all(tf.stack(finite_flags)) if finite_flags else tf.constant(True)
    )
    return reduced, finite


# -- wire_dtype="auto": what goes on the dense wire, and its timing ------------------------


def dense_bucket_sizes(grads, shapes, bucket_bytes: int, sparse: str | None = None):
    """Elements per dense bucket `allreduce_gradients` would send for `grads`
    (trace-time Python: the plan, not the data). Gradients gathered as rows
    are not on the dense wire; with `sparse="auto"` they may still be
    densified at run time, which this does not count."""
    shapes = [tf.TensorShape(s) for s in shapes]
    present = [
        i
        for i, (g, s) in enumerate(zip(grads, shapes))
        if g is not None and not reduced_as_slices(g, s, sparse_mode(sparse))
    ]
    sizes = [shapes[i].num_elements() for i in present]
    plan = plan_buckets([4 * s for s in sizes], bucket_bytes) if present else []
    return [sum(sizes[j] for j in bucket) for bucket in plan]


def probe_wire(sizes, wires, pairs: int) -> dict:
    """This rank's time to reduce one bucket of each size on each wire, as the
    train step does it (fused, encoded, reduced, decoded, split), `pairs`
    interleaved rounds after a warm-up call (the trace). Collective: every
    rank calls it with the same arguments.

    Returns:
        `{elements: {wire: [seconds per round]}}`.
    """
    out = {}
    for elements in sizes:
        flat = tf.random.stateless_normal([elements], seed=[world.rank(), 7]) * 1e-3
        calls = {}
        for w in wires:

            @tf.function(autograph=False)
            def call(t, w=w, elements=elements):
                reduced, _ = allreduce_gradients(
                    [t],
                    shapes=[(elements,)],
                    op="sum",
                    wire_dtype=w,
                    bucket_bytes=4 * elements + 1,
                )
                return reduced[0]

            call(flat).numpy()  # trace and warm
            calls[w] = call
        times = {w: [] for w in wires}
        for r in range(pairs):
            for w in wires if r % 2 == 0 else wires[::-1]:
                t0 = time.perf_counter()
                calls[w](flat).numpy()
                times[w].append(time.perf_counter() - t0)
        out[int(elements)] = times
    return out
