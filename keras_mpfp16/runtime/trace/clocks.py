"""Each rank's clock aligned to rank 0's, for one timeline across ranks.

Ranks on rank 0's running kernel share its clock; others measure their
offset with ping-pongs (Cristian's method), accurate to half a round trip.
"""

from __future__ import annotations

import time

_TAG = 23
_CLOCK_ROUNDS = 10


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def align_clocks(comm) -> dict:
    """Each rank's offset to rank 0's clock (every rank calls it).

    Ranks on the same running kernel as rank 0 (same boot id) share its
    clock (`time.perf_counter_ns` is CLOCK_MONOTONIC on Linux): offset 0,
    exactly. Others exchange `_CLOCK_ROUNDS` ping-pongs with rank 0 and keep
    the one with the shortest round trip (Cristian's method): offset =
    rank 0's time - the midpoint of the round trip, accurate to half of that
    round trip (`bound_us`).

    Returns:
        `{"offset_ns": int, "bound_us": float, "same_clock": bool}` for this
        rank, plus `"ranks"`: the same for every rank, in rank order.
    """
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    boots = comm.allgather(_boot_id())
    mine = {"offset_ns": 0, "bound_us": 0.0, "same_clock": True}
    buf = np.zeros(1, np.int64)
    for peer in range(1, size):
        if boots[peer] and boots[peer] == boots[0]:
            continue
        if rank == 0:
            for _ in range(_CLOCK_ROUNDS):
                comm.Recv(buf, source=peer, tag=_TAG)
                buf[0] = time.perf_counter_ns()
                comm.Send(buf, dest=peer, tag=_TAG)
        elif rank == peer:
            best = None
            for _ in range(_CLOCK_ROUNDS):
                t0 = time.perf_counter_ns()
                comm.Send(buf, dest=0, tag=_TAG)
                comm.Recv(buf, source=0, tag=_TAG)
                t1 = time.perf_counter_ns()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, int(buf[0]) - (t0 + t1) // 2)
            mine = {
                "offset_ns": best[1],
                "bound_us": best[0] / 2e3,
                "same_clock": False,
            }
    everyone = comm.allgather(mine)
    return {**mine, "ranks": everyone}


__all__ = ["align_clocks"]
