"""Numpy-level collectives over the library's communicator.

These are what the optimizer, callbacks and data helpers use; none of them
knows about Keras. Device arrays (CuPy, or anything exposing DLPack on a GPU)
are reduced in place on the GPU when MPI is CUDA-aware and staged through host
memory otherwise.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any

import numpy as np

from keras_mpfp16 import _validate
from keras_mpfp16.runtime.mpi import cuda, observers, pipeline, ring
from keras_mpfp16.runtime.mpi import world as world_module
from keras_mpfp16.runtime.mpi.wire import lowp_allreduce_sum, validate_wire_dtype
from keras_mpfp16.runtime.mpi.world import world

REDUCE_OPS = ("average", "sum", "min", "max")


def barrier() -> None:
    """Blocks until every rank has called `barrier()`."""
    with observers.collective("barrier"):
        world().comm.Barrier()


world_module.provide_barrier(barrier)  # for the deprecated world.barrier


def validate_op(op: str) -> str:
    """`op` if it is one of `REDUCE_OPS`; else a `ValueError` naming them."""
    return _validate.one_of("op", op, REDUCE_OPS)


def _mpi_op(MPI, op: str):
    return {"average": MPI.SUM, "sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}[op]


def allreduce(x: Any, op: str = "average", name: str = "allreduce") -> Any:
    """Reduces `x` element-wise over all ranks and returns the result everywhere.

    Args:
        x: A number, a numpy array, or a GPU array (CuPy / DLPack). Every rank
            must pass the same shape and dtype.
        op: `"average"` (default), `"sum"`, `"min"` or `"max"`. Averages of
            integer inputs are returned as float64.
        name: What the call is, for stall reports.

    Returns:
        A new array of the same shape (numpy for host input, CuPy for device
        input); a Python scalar input gives a numpy scalar.

    Example:

    ```python
    import numpy as np
    import keras_mpfp16 as kmp

    mean_loss = kmp.allreduce(np.float64(local_loss))
    ```
    """
    validate_op(op)
    w = world()
    if cuda.is_device_array(x):
        return _allreduce_device(w, x, op)
    arr = np.asarray(x)
    scalar = arr.ndim == 0
    send = np.ascontiguousarray(arr.reshape(-1) if not scalar else arr.reshape(1))
    out = np.empty_like(send)
    if w.comm.Get_size() == 1:
        out[...] = send
    else:
        with observers.collective(name):
            w.comm.Allreduce(send, out, op=_mpi_op(w.mpi, op))
    if op == "average":
        out = _divide(out, w.comm.Get_size())
    out = out.reshape(arr.shape)
    return out[()] if scalar else out


def _divide(out: np.ndarray, n: int) -> np.ndarray:
    if np.issubdtype(out.dtype, np.inexact):
        np.divide(out, n, out=out)
        return out
    return out.astype(np.float64) / n


def _allreduce_device(w, x, op):
    xp_arr = cuda.as_cupy(x)
    if cuda.cuda_aware():
        cuda.synchronize_device()
        out = xp_arr.copy()
        if w.comm.Get_size() > 1:
            with observers.collective("allreduce (device)"):
                w.comm.Allreduce(w.mpi.IN_PLACE, out, op=_mpi_op(w.mpi, op))
        cuda.path_counts["device"] += 1
        if op == "average":
            out /= w.comm.Get_size()
        return out
    cupy = cuda._cupy()
    host = cupy.asnumpy(xp_arr)
    cuda.path_counts["staged"] += 1
    return cupy.asarray(allreduce(host, op=op))


def allreduce_flat(
    buf: np.ndarray,
    op: str = "average",
    wire_dtype: str = "float32",
    out: np.ndarray | None = None,
    name: str = "gradient allreduce",
) -> np.ndarray:
    """Fused reduction of one flat float32 buffer.

    The numpy entry point to the gradient wire formats (the TensorFlow bridge
    encodes 16-bit wires inside the train step instead and calls the
    buffer-level functions below).

    Args:
        buf: 1-D float32 array; it is not modified.
        op: `"average"` or `"sum"`.
        wire_dtype: `"float32"`, `"float16"` or `"bfloat16"` (see `wire.py`).
        out: Optional float32 array of the same shape to write into.
        name: What the call is, for stall reports.

    Returns:
        The reduced values (`out` when given, else a new array).
    """
    w = world()
    n = w.comm.Get_size()
    if wire_dtype == "float32":
        if out is None:
            out = np.empty_like(buf)
        with observers.collective(name):
            w.comm.Allreduce(buf, out, op=w.mpi.SUM)
    else:
        with observers.collective(name):
            result = lowp_allreduce_sum(w.comm, buf, wire_dtype)
        if out is None:
            out = result
        else:
            out[...] = result
    if op == "average":
        divide_by_size(out, n)
    return out


def divide_by_size(out: np.ndarray, n: int) -> None:
    """`out /= n` in place (a multiply when n is a power of two: exact, faster)."""
    if n & (n - 1) == 0:
        np.multiply(out, np.float32(1.0 / n), out=out)
    else:
        np.divide(out, np.float32(n), out=out)


# -- buffer-level collectives for the backend bridges ----------------------------
# `send`/`recv` are anything mpi4py takes as a buffer: numpy arrays, or
# `cuda.DLPackBuffer` views of framework tensors (host or device memory).


# They are the train step's gradient collectives: they run on the "train"
# channel (`world.channel`), where no other kind of collective can match them.


# The communication thread (`overlap.py`) runs the same calls on its own
# channel; `gradient_channel` switches the calling thread's.
_thread = threading.local()


def _gradient_channel():
    return world_module.channel(getattr(_thread, "channel", "train"))


@contextmanager
def gradient_channel(name: str):
    """The gradient collectives this thread issues inside run on channel
    `name` (`world.channel`) instead of `"train"`."""
    world_module.channel(name)  # a bad name raises here
    before = getattr(_thread, "channel", "train")
    _thread.channel = name
    try:
        yield
    finally:
        _thread.channel = before


def allreduce_sum_into(send, recv, name: str) -> None:
    """`recv` = element-wise sum of every rank's `send` (same dtype and size)."""
    w = world()
    with observers.collective(name):
        _gradient_channel().Allreduce(send, recv, op=w.mpi.SUM)


def alltoall_into(
    send, recv, name: str, block_bytes: int | None = None, ring_min_bytes=None
) -> None:
    """Rank r receives every rank's r-th equal block of `send`, in rank order.

    With `block_bytes` (one block's size) given, large blocks at 3+ ranks
    move on `ring.alltoall`'s schedule (same bytes, no two ranks sending to
    each other at once); otherwise MPI's `Alltoall`. `ring_min_bytes`
    overrides `ring.RING_MIN_BYTES` (tests use 0).
    """
    comm = _gradient_channel()
    with observers.collective(name):
        if block_bytes is None:
            comm.Alltoall(send, recv)
        else:
            ring.alltoall(comm, send, recv, block_bytes, ring_min_bytes)


def allgather_into(
    send, recv, name: str, block_bytes: int | None = None, ring_min_bytes=None
) -> None:
    """`recv` = every rank's `send` (same size everywhere), in rank order.

    With `block_bytes` (the size of `send`) given, large blocks at 3+ ranks
    go around a ring of `Sendrecv` steps (`ring.py`: same bytes, a schedule
    that keeps TCP links busy); otherwise MPI's `Allgather`.
    `ring_min_bytes` overrides `ring.RING_MIN_BYTES` (tests use 0).
    """
    comm = _gradient_channel()
    with observers.collective(name):
        if block_bytes is None:
            comm.Allgather(send, recv)
        else:
            ring.allgather(comm, send, recv, block_bytes, ring_min_bytes)


def ring_reduce_scatter(own_row, add, empty_row, buffer, name: str):
    """This rank's owned row of a ring reduce-scatter (`ring.reduce_scatter`:
    the caller's codec adds, this moves the rows between neighbours)."""
    with observers.collective(name):
        return ring.reduce_scatter(_gradient_channel(), own_row, add, empty_row, buffer)


def pipelined_reduce(send, owner_sum, gathered, name: str) -> None:
    """The pipelined 16-bit reduction of one bucket (`pipeline.reduce_segments`:
    the caller's codec sums each segment, this moves the segments)."""
    with observers.collective(f"{name} (pipelined)"):
        pipeline.reduce_segments(_gradient_channel(), send, owner_sum, gathered)


def allgatherv_bytes(send: np.ndarray, recv: np.ndarray, counts, name: str) -> None:
    """Uneven allgather of raw bytes: rank r contributes `counts[r]` bytes."""
    w = world()
    counts = [int(c) for c in counts]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    byte = w.mpi.BYTE
    recv_bytes = recv.view(np.uint8).reshape(-1)
    if sum(counts) > recv_bytes.size or counts[w.comm.Get_rank()] != send.nbytes:
        # mpi4py passes explicit counts as they are: MPI would write past
        # the end of `recv`.
        raise ValueError(
            f"allgatherv_bytes: counts {counts} do not fit a receive buffer of "
            f"{recv_bytes.size} bytes and a send of {send.nbytes} bytes."
        )
    with observers.collective(name):
        _gradient_channel().Allgatherv(
            [send.view(np.uint8).reshape(-1), byte],
            [recv_bytes, (counts, displs), byte],
        )


def allreduce_step_sum(buf: np.ndarray, channel: str, name: str) -> np.ndarray:
    """The sum over ranks of a float64 buffer made in a train or test step
    (the metric reduction), on that step's channel (`world.channel`)."""
    send = np.ascontiguousarray(np.asarray(buf, np.float64).reshape(-1))
    out = np.empty_like(send)
    comm = world_module.channel(channel)
    if comm.Get_size() == 1:
        out[...] = send
        return out
    with observers.collective(name):
        comm.Allreduce(send, out, op=world().mpi.SUM)
    return out


def allgather(x: Any) -> np.ndarray:
    """Concatenates every rank's array along the first axis, in rank order.

    Ranks may contribute different numbers of rows; the other dimensions and
    the dtype must agree. A scalar counts as one row.

    Args:
        x: A number or numpy array.

    Returns:
        The concatenation, identical on every rank.

    Raises:
        ValueError: if ranks disagree on the trailing shape or dtype (the
            message names the ranks).
    """
    w = world()
    arr = np.ascontiguousarray(np.asarray(x))
    if arr.ndim == 0:
        arr = arr.reshape(1)
    with observers.collective("allgather (shapes)"):
        metas = w.comm.allgather((arr.shape, arr.dtype.str))
    first_shape, first_dtype = metas[0][0][1:], metas[0][1]
    for r, (shape, dtype) in enumerate(metas):
        if shape[1:] != first_shape or dtype != first_dtype:
            raise ValueError(
                "allgather needs the same trailing shape and dtype on every rank: "
                f"rank 0 has {first_shape}/{np.dtype(first_dtype)}, "
                f"rank {r} has {shape[1:]}/{np.dtype(dtype)}."
            )
    rows = [m[0][0] for m in metas]
    row_elems = int(np.prod(first_shape, dtype=np.int64))
    out = np.empty((sum(rows),) + tuple(first_shape), dtype=arr.dtype)
    if w.comm.Get_size() == 1:
        out[...] = arr
        return out
    counts = [r * row_elems * arr.dtype.itemsize for r in rows]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    byte = w.mpi.BYTE
    with observers.collective("allgather"):
        w.comm.Allgatherv(
            [arr.view(np.uint8).reshape(-1), byte],
            [out.view(np.uint8).reshape(-1), (counts, displs), byte],
        )
    return out


def allgather_object(obj: Any, name: str = "allgather (objects)") -> list:
    """Every rank's picklable `obj`, as a list in rank order."""
    w = world()
    if w.comm.Get_size() == 1:
        return [obj]
    with observers.collective(name):
        return w.comm.allgather(obj)


_DIGEST_MASK = (1 << 62) - 1


def digest_of(obj: Any) -> int:
    """A 62-bit digest of `repr(obj)` (the same on every rank for equal values
    of plain types: tuples, numbers, strings)."""
    import hashlib

    raw = hashlib.blake2b(repr(obj).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") & _DIGEST_MASK


def same_on_all_ranks(value: Any, name: str = "agreement") -> bool:
    """Whether every rank passed an equal `value` (compared by `digest_of`).

    One `Allreduce(MAX)` of two int64 (the digest and its negation: the
    maximum and minus the minimum at once), so each rank sends and receives
    O(1) bytes whatever the number of ranks, where an allgather of the values
    moves O(N) bytes to every rank. The answer is the same on every rank, so
    callers that need the values for an error message can then allgather them
    together, on the failure path only.
    """
    w = world()
    if w.comm.Get_size() == 1:
        return True
    from mpi4py import MPI

    d = digest_of(value)
    send = np.array([d, -d], np.int64)
    out = np.empty_like(send)
    with observers.collective(name):
        w.comm.Allreduce(send, out, op=MPI.MAX)
    return int(out[0]) == -int(out[1])


def _check_root(root: int, n: int) -> None:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < n:
        raise ValueError(f"root must be a rank in [0, {n - 1}]; received {root!r}.")


def broadcast(obj: Any, root: int = 0) -> Any:
    """Sends `obj` from rank `root` to every rank.

    Numpy arrays travel as raw buffers (receivers need not know the shape);
    anything else is pickled.

    Args:
        obj: The value on `root`; ignored on other ranks.
        root: The sending rank.

    Returns:
        `root`'s value, on every rank.
    """
    w = world()
    _check_root(root, w.comm.Get_size())
    if w.comm.Get_size() == 1:
        return obj
    is_array = isinstance(obj, np.ndarray)
    meta = (obj.shape, obj.dtype.str) if is_array else None
    with observers.collective("broadcast (header)"):
        meta = w.comm.bcast(meta if w.comm.Get_rank() == root else None, root=root)
    if meta is None:
        with observers.collective("broadcast (object)"):
            return w.comm.bcast(obj, root=root)
    shape, dtype = meta
    buf = (
        np.require(obj, requirements="C")
        if w.comm.Get_rank() == root
        else np.empty(shape, dtype)
    )
    with observers.collective("broadcast"):
        w.comm.Bcast(buf.view(np.uint8).reshape(-1), root=root)
    return buf


def broadcast_arrays(arrays: list[np.ndarray], root: int = 0) -> list[np.ndarray]:
    """Broadcasts a list of arrays in one fused call (shapes must already agree).

    Used for the initial weight sync: one `Bcast` of all the bytes instead of
    one per variable.
    """
    w = world()
    _check_root(root, w.comm.Get_size())
    if w.comm.Get_size() == 1 or not arrays:
        return list(arrays)
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    arrays = [np.require(a, requirements="C") for a in arrays]
    nbytes = [a.nbytes for a in arrays]
    buf = np.empty(sum(nbytes), dtype=np.uint8)
    if w.comm.Get_rank() == root:
        offset = 0
        for a, nb in zip(arrays, nbytes):
            buf[offset : offset + nb] = a.reshape(-1).view(np.uint8)
            offset += nb
    with observers.collective("broadcast (initial sync)"):
        w.comm.Bcast(buf, root=root)
    out, offset = [], 0
    for a, nb in zip(arrays, nbytes):
        out.append(buf[offset : offset + nb].view(a.dtype).reshape(a.shape).copy())
        offset += nb
    return out


__all__ = [
    "REDUCE_OPS",
    "allgather",
    "allgather_object",
    "allreduce",
    "allgather_into",
    "allgatherv_bytes",
    "allreduce_flat",
    "allreduce_step_sum",
    "allreduce_sum_into",
    "alltoall_into",
    "ring_reduce_scatter",
    "pipelined_reduce",
    "broadcast",
    "digest_of",
    "same_on_all_ranks",
    "broadcast_arrays",
    "divide_by_size",
    "validate_op",
    "validate_wire_dtype",
]
