"""The pipelined 16-bit reduction: segments in flight while one is summed.

Unpipelined, a 16-bit bucket is `Alltoall` -> owner's float32 sum ->
allgather, one after another (`wire.py`). With `WIRE_PIPELINE_SEGMENT` set
(values per owner's row per segment), a bucket whose owner's row is longer
is cut into S segments, laid out in the flat vector as

    segment s = flat[s*N*seg : (s+1)*N*seg], owner j's part the j-th `seg`

so each segment is N whole encoded rows, contiguous: `(S, N, words)`. The
schedule, the same on every rank by construction (S and the order of calls
depend only on the bucket's length, N and the setting):

    post Ialltoall(0), ..., Ialltoall(depth-1)
    for s in 0..S-1:
        wait Ialltoall(s); post Ialltoall(s + depth)
        owner's float32 sum of segment s (the caller's codec)
        post Iallgather(s); wait Iallgather(s - depth)
    wait the Iallgathers left

so segment s+1's rows are on the wire while segment s is summed, and the
owners' rows of earlier segments are gathered meanwhile. Non-blocking
collectives, one thread (no MPI thread level needed beyond the default);
Open MPI progresses them inside its calls, so the overlap is what the
kernel's socket buffers and the eager protocol move on their own between
calls -- measured, not assumed: docs/benchmarks.md, "The pipelined 16-bit
reduction".

Numerics: each owner's float32 sum is the same rank-order sum of the same
16-bit inputs; the rows are shorter, so each carries its own power-of-two
exponent (float16; finer scaling, never coarser) -- bfloat16 rows travel
unscaled and give bit for bit the unpipelined result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from keras_mpfp16 import _settings

# Alltoalls in flight ahead of the segment being summed.
DEPTH = 2


def segment_length() -> int:
    """The `WIRE_PIPELINE_SEGMENT` setting (0: the pipeline is off)."""
    return int(_settings.get("WIRE_PIPELINE_SEGMENT"))


def plan(length: int, n: int, segment: int | None = None) -> tuple[int, int]:
    """`(segments, seg)` for a bucket of `length` values over `n` owners:
    `segments` = 1 (not pipelined) where the setting is 0 or the owner's row
    fits one segment; else the fewest segments of at most `segment` values
    per owner's row, `seg` evened out so the padding stays under N*S."""
    segment = segment_length() if segment is None else segment
    chunk = -(-length // n)
    if segment <= 0 or chunk <= segment:
        return 1, chunk
    count = -(-chunk // segment)
    return count, -(-length // (n * count))


def reduce_segments(
    comm,
    send: np.ndarray,
    owner_sum: Callable[[np.ndarray, int], np.ndarray],
    gathered: np.ndarray,
) -> None:
    """The pipelined schedule over `comm` (see the module docstring).

    Args:
        comm: mpi4py intra-communicator.
        send: `(S, N, words)` uint16, C-contiguous: segment s's N rows.
        owner_sum: `(recv (N, words), s) -> this owner's (1, out_words) row`
            (uint16) for segment s; `recv` holds every rank's row this rank
            owns, in rank order.
        gathered: `(S, N, out_words)` uint16, C-contiguous: filled with every
            owner's row of every segment, in rank order.
    """
    from mpi4py import MPI

    count = send.shape[0]
    recv = np.empty_like(send)
    pending = [comm.Ialltoall(send[s], recv[s]) for s in range(min(DEPTH, count))]
    gathers = []
    rows = []  # the owners' rows stay alive until their Iallgather ends
    try:
        for s in range(count):
            pending[s].Wait()
            if s + DEPTH < count:
                pending.append(comm.Ialltoall(send[s + DEPTH], recv[s + DEPTH]))
            mine = np.ascontiguousarray(owner_sum(recv[s], s))
            rows.append(mine)
            gathers.append(comm.Iallgather(mine, gathered[s]))
            if s >= DEPTH:
                # At most DEPTH + 1 gathers in flight: Open MPI's progress
                # engine walks every active request on each call.
                gathers[s - DEPTH].Wait()
                rows[s - DEPTH] = None
        MPI.Request.Waitall(gathers)
    except BaseException:
        # An error in a segment's sum (it raises on every rank alike: the
        # same inputs everywhere) must not leave requests writing into
        # buffers being freed: finish what was posted, then raise.
        MPI.Request.Waitall([*pending, *gathers])
        raise
