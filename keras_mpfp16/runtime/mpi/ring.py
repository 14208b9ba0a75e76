"""Ring schedules for the 16-bit wire: reduce-scatter and allgather.

The 16-bit gradient wire ends with an allgather of every owner's encoded
shard (`wire.py`). Over TCP, Open MPI's default allgather for large blocks
measured 1.7x slower than a ring on the emulated 4-node cluster at 1 Gbit/s
(50 MB in all: 524-551 ms against 317-323 ms,
`examples/benchmarks/cluster_transfer.py`; a ring moves the (N-1)/N of the
bytes a rank must receive in N-1 equal steps, each over the same connection
to one neighbour, and reaches the link's rate). Which algorithm Open MPI
picks depends on flags the user may never set
(`coll_tuned_allgather_algorithm`), so the wire runs the ring itself, with
point-to-point `Sendrecv`, where it measured faster: 3 ranks or more and
blocks of at least `RING_MIN_BYTES`. Smaller blocks and 2 ranks use MPI's
`Allgather` (at 2 ranks every algorithm is one exchange).

The ring allgather's result is the same bytes in the same order as
`Allgather`: only the schedule differs, never the numbers.

The first phase, the `Alltoall` that brings every rank's row to its owner,
has a schedule of its own too (`alltoall`): N-1 steps (a few of them as
two half steps), each a permutation in which every rank sends one block to
one rank and receives one block from another, and **no two ranks send to
each other in the same step**. On the emulated cluster's TCP links an
exchange (A -> B while B -> A) moved at about half the link's rate: 4
nodes at 1 Gbit/s, 50 MB, medians of 6 rounds: shifts (one step of
exchanges) 441 ms, every step an exchange 524 ms, Open MPI's `Alltoall`
391 ms (318-509 from round to round), the neighbour ring 321 ms, this
schedule 330 ms (`examples/benchmarks/cluster_transfer.py`). The bytes and
the result are `Alltoall`'s; only the order of the moves differs.

The owner's sum can go around the ring too (`reduce_scatter`): instead of
one `Alltoall` that brings every rank's 16-bit row to its owner, each rank
adds its own row to the running sum it received (float32) and passes the
sum on, re-encoded to 16 bits, N-1 times. Same bytes per rank as the
`Alltoall`, neighbours only (the transfer alone measured 323-339 ms against
Open MPI's `Alltoall`'s 390-519 ms for 50 MB there), but the partial sums
are rounded to 16 bits N-2 more times, so it is a numerics choice, off by
default: `reduce_scatter_schedule` applies the `WIRE_SCHEDULE` setting. In
whole train steps on that cluster it did not pay: the reduction 1.00x and
the step 0.95x the Alltoall's at 1 Gbit/s, 1.13x and 1.14x with the link
unlimited (its N-1 small owner's sums per bucket cost CPU); see
docs/benchmarks.md, "Four emulated nodes: what bounds the 16-bit wire".
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

from keras_mpfp16 import _settings

# Per-rank block size from which the ring is used (smaller blocks are
# latency-bound: N-1 messages cost more than MPI's tuned algorithms).
RING_MIN_BYTES = 1 << 20
# A tag of its own, so the ring's messages never match another sender's.
RING_TAG = 0x6B72


def use_ring(size: int, block_bytes: int, min_bytes: int | None = None) -> bool:
    """Whether an allgather of `block_bytes` per rank over `size` ranks goes
    around the ring (3+ ranks, blocks of at least `min_bytes`, default
    `RING_MIN_BYTES`)."""
    threshold = RING_MIN_BYTES if min_bytes is None else min_bytes
    return size >= 3 and block_bytes >= threshold


def allgather(comm, send, recv, block_bytes: int, min_bytes: int | None = None):
    """`recv` = every rank's `send` (`block_bytes` each), in rank order: around
    the ring where `use_ring(size, block_bytes, min_bytes)`, else MPI's
    `Allgather`.

    Ring step s: rank r passes block (r - s) mod N to rank r + 1 and
    receives block (r - s - 1) mod N from rank r - 1. Step 0 sends from
    `send`; its own block is copied into `recv` through MPI (a self
    `Sendrecv`), which works for device memory as well as host memory.

    Args:
        comm: mpi4py intra-communicator.
        send: this rank's block (any mpi4py buffer: numpy, DLPack).
        recv: N blocks (any mpi4py buffer).
        block_bytes: bytes per block, the same on every rank.
        min_bytes: overrides `RING_MIN_BYTES` (tests use 0).
    """
    if not use_ring(comm.Get_size(), block_bytes, min_bytes):
        comm.Allgather(send, recv)
        return
    from mpi4py import MPI

    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    types = [
        MPI.BYTE.Create_hindexed([block_bytes], [k * block_bytes]).Commit()
        for k in range(n)
    ]
    try:
        send_spec = [send, block_bytes, MPI.BYTE]
        comm.Sendrecv(
            send_spec,
            dest=r,
            sendtag=RING_TAG,
            recvbuf=[recv, 1, types[r]],
            source=r,
            recvtag=RING_TAG,
        )
        for s in range(n - 1):
            out_block = (r - s) % n
            in_block = (r - s - 1) % n
            comm.Sendrecv(
                send_spec if s == 0 else [recv, 1, types[out_block]],
                dest=right,
                sendtag=RING_TAG,
                recvbuf=[recv, 1, types[in_block]],
                source=left,
                recvtag=RING_TAG,
            )
    finally:
        for t in types:
            t.Free()


# -- alltoall without exchanges -------------------------------------------------

WHOLE, FIRST_HALF, SECOND_HALF = 0, 1, 2


@functools.lru_cache(maxsize=16)
def alltoall_schedule(n: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The steps of `alltoall` for `n` ranks (3 or more).

    Each step gives, for every rank r, `(dest, part)`: r sends `part`
    (`WHOLE`, `FIRST_HALF`, `SECOND_HALF`) of its block `dest` to rank
    `dest`. Every step is a permutation without fixed points or 2-cycles
    (no two ranks send to each other at once), and every ordered pair of
    ranks is served once whole or twice by halves, in `n - 1` steps' worth
    of bytes. A pure function of `n`: every rank computes the same list.

    * odd n: the shifts r -> r + k, k = 1 .. n-1 (a shift has 2-cycles
      only when 2k = n);
    * n = 2 (mod 4): the shifts except 1 and n/2, and two steps that mix
      them: even ranks +n/2 and odd ranks +1, then the other way round;
    * n = 0 (mod 4): the shifts except m, 2m, 3m (m = n/4), and six half
      steps that send rank q*m + i to the same i in another quarter,
      along each of the six 4-cycles of the quarters (each quarter pair is
      in two of them: once per half). There is no way with whole blocks
      when n = 4 (Tillson, 1980: the complete directed graph on 4 vertices
      has no decomposition into Hamiltonian cycles).
    """
    if n < 3:
        raise ValueError(f"alltoall_schedule needs 3 or more ranks; received {n}.")
    h = n // 2
    perms: list[tuple[list[int], bool]] = []  # (dest per rank, halves?)
    if n % 2:
        skip = set()
    elif n % 4 == 2:
        skip = {1, h}
        perms.append(([(r + (h if r % 2 == 0 else 1)) % n for r in range(n)], False))
        perms.append(([(r + (h if r % 2 else 1)) % n for r in range(n)], False))
    else:
        m = n // 4
        skip = {m, 2 * m, 3 * m}
        for a, b, c in itertools.permutations((1, 2, 3)):
            nxt = {0: a, a: b, b: c, c: 0}  # a 4-cycle of the quarters
            perms.append(([nxt[r // m] * m + r % m for r in range(n)], True))
    steps = [
        tuple(((r + k) % n, WHOLE) for r in range(n))
        for k in range(1, n)
        if k not in skip
    ]
    seen: set[tuple[int, int]] = set()
    for dest, halves in perms:
        step = []
        for r, d in enumerate(dest):
            part = WHOLE
            if halves:
                part = SECOND_HALF if (r, d) in seen else FIRST_HALF
                seen.add((r, d))
            step.append((d, part))
        steps.append(tuple(step))
    return tuple(steps)


@functools.lru_cache(maxsize=16)
def _alltoall_moves(n: int, r: int) -> tuple[tuple[int, int, int, int], ...]:
    """Rank r's `(dest, part sent, source, part received)` per step."""
    moves = []
    for step in alltoall_schedule(n):
        src = next(s for s, (d, _) in enumerate(step) if d == r)
        moves.append((*step[r], src, step[src][1]))
    return tuple(moves)


def alltoall(comm, send, recv, block_bytes: int, min_bytes: int | None = None):
    """`recv` block j = rank j's block r of `send` (`block_bytes` each), as
    MPI's `Alltoall` gives it: on `alltoall_schedule`'s steps where
    `use_ring(size, block_bytes, min_bytes)`, else by `Alltoall`.

    Args:
        comm: mpi4py intra-communicator.
        send: N blocks, block j for rank j (any mpi4py buffer: numpy, DLPack).
        recv: N blocks (any mpi4py buffer).
        block_bytes: bytes per block, the same on every rank.
        min_bytes: overrides `RING_MIN_BYTES` (tests use 0).
    """
    n = comm.Get_size()
    if not use_ring(n, block_bytes, min_bytes):
        comm.Alltoall(send, recv)
        return
    from mpi4py import MPI

    r = comm.Get_rank()
    half = block_bytes // 2
    extent = {
        WHOLE: (0, block_bytes),
        FIRST_HALF: (0, half),
        SECOND_HALF: (half, block_bytes - half),
    }
    types: dict[tuple[int, int], Any] = {}

    def spec(buf, block, part):
        offset, size = extent[part]
        key = (block * block_bytes + offset, size)
        if key not in types:
            types[key] = MPI.BYTE.Create_hindexed([size], [key[0]]).Commit()
        return [buf, 1, types[key]]

    # Its own block through MPI too (device memory as well as host), then
    # the schedule's steps.
    moves = ((r, WHOLE, r, WHOLE), *_alltoall_moves(n, r))
    try:
        for dest, part, src, src_part in moves:
            comm.Sendrecv(
                spec(send, dest, part),
                dest=dest,
                sendtag=RING_TAG,
                recvbuf=spec(recv, src, src_part),
                source=src,
                recvtag=RING_TAG,
            )
    finally:
        for t in types.values():
            t.Free()


def reduce_scatter_schedule(size: int, row_bytes: int) -> str:
    """`"ring"` or `"alltoall"` for a 16-bit reduction of `row_bytes` per
    owner's row over `size` ranks: the ring where the `WIRE_SCHEDULE`
    setting asks for it, from 3 ranks on, for rows of at least
    `RING_MIN_BYTES` (at 2 ranks both schedules give the same numbers and
    MPI's exchange is one call)."""
    if _settings.get("WIRE_SCHEDULE") == "ring" and use_ring(size, row_bytes):
        return "ring"
    return "alltoall"


def reduce_scatter(
    comm,
    own_row: Callable[[int], Any],
    add: Callable[[Any, int], Any],
    empty_row: Callable[[], Any],
    buffer: Callable[[Any], Any],
):
    """Ring reduce-scatter of encoded rows; returns this rank's owned row.

    Rank r owns chunk r. Step s (0 <= s < N-1): rank r sends its running
    sum to rank r + 1 and receives from rank r - 1 the running sum of chunk
    j = (r - s - 2) mod N, to which it adds its own row j. Step 0 sends the
    rank's own row (r - 1) mod N. After N-1 steps the sum received is chunk
    r's, with every rank's row added once, in the order r+1, r+2, ..., r.

    The arithmetic is the caller's (numpy or a framework), so one schedule
    serves both codecs:

    Args:
        comm: mpi4py intra-communicator.
        own_row: `j -> this rank's encoded row j` (no step slots).
        add: `(received_row, j) -> received_row + own row j`, encoded.
        empty_row: a new receive buffer the size of a row.
        buffer: `row -> an mpi4py buffer over it` (e.g. DLPack; it must wait
            for any pending device work on the row).

    Returns:
        The reduced row of chunk `comm.Get_rank()`, as `add` returned it.
    """
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    partial = own_row((r - 1) % n)
    for s in range(n - 1):
        received = empty_row()
        comm.Sendrecv(
            buffer(partial),
            dest=right,
            sendtag=RING_TAG,
            recvbuf=buffer(received),
            source=left,
            recvtag=RING_TAG,
        )
        partial = add(received, (r - s - 2) % n)
    return partial
