"""Allreduce bandwidth vs message size: ours (each wire dtype) next to raw mpi4py."""

from __future__ import annotations

import time

import numpy as np

from keras_mpfp16.runtime.mpi import collectives, world
from keras_mpfp16.runtime.mpi.wire import WIRE_DTYPES

DEFAULT_SIZES = [2**k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB


def _time_calls(fn, calls: int) -> float:
    """Seconds per call, the slowest rank's view (a collective ends for all)."""
    collectives.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    local = (time.perf_counter() - t0) / calls
    return float(collectives.allreduce(np.float64(local), op="max"))


def _calls_for(nbytes: int) -> int:
    return int(min(200, max(3, 2**24 // max(nbytes, 1))))


def lowp_wire_bytes(num_elements: int, n: int) -> int:
    """Bytes one rank sends for a 16-bit reduction (Alltoall + Allgather)."""
    chunk = -(-num_elements // n)
    return 2 * (n - 1) * (chunk + 1) * 2


def run(sizes=None, rounds: int = 3, graph: bool = True) -> list[dict]:
    """Measures every size; returns one record per (size, variant).

    Variants: `raw_mpi4py` (`comm.Allreduce` float32 sum), `ours_<wire>`
    (`runtime.allreduce_flat`, the numpy entry point, sum: the optimizer
    folds the 1/N of an average into its unscaling pass), and
    `ours_graph_<wire>`: the full in-train-step path (8 gradient tensors
    fused, encoded in-graph for 16-bit wires, reduced, decoded and split
    back) when TensorFlow is available.
    """
    sizes = sizes or DEFAULT_SIZES
    comm = world.mpi_comm()
    from mpi4py import MPI

    n = world.size()
    graph_fn = _graph_path() if graph else None
    records = []
    for nbytes in sizes:
        elems = max(1, nbytes // 4)
        rng = np.random.default_rng(world.rank())
        buf = rng.normal(size=elems).astype(np.float32)
        variants = _variants(comm, MPI, buf, graph_fn if nbytes <= 2**28 else None)
        calls = _calls_for(nbytes)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(rounds):  # interleaved: every variant once per round
            for name, fn in variants.items():
                fn()  # warm (allocations, first trace)
                times[name].append(_time_calls(fn, calls))
        for name, ts in times.items():
            best = min(ts)
            wire = name.split("_")[-1]
            sent = (
                lowp_wire_bytes(elems, n) if wire in ("float16", "bfloat16") else None
            )
            records.append(
                {
                    "bytes": elems * 4,
                    "variant": name,
                    "seconds": best,
                    "seconds_all": ts,
                    "GBps": elems * 4 / best / 1e9,
                    "bytes_sent_per_rank": sent,
                }
            )
    return records


def _variants(comm, MPI, buf: np.ndarray, graph_fn) -> dict:
    """The calls to compare for one buffer, each with a preallocated output."""
    raw_out, ours_out = np.empty_like(buf), np.empty_like(buf)
    variants = {"raw_mpi4py": lambda: comm.Allreduce(buf, raw_out, op=MPI.SUM)}
    for wire in WIRE_DTYPES:
        variants[f"ours_{wire}"] = lambda w=wire: collectives.allreduce_flat(
            buf, "sum", w, out=ours_out
        )
    if graph_fn is not None:
        tensors = graph_fn.make_inputs(buf)
        for wire in WIRE_DTYPES:
            variants[f"ours_graph_{wire}"] = lambda w=wire: graph_fn(tensors, w)
    return variants


def _graph_path():
    """The in-train-step reduction as a tf.function over 8 tensors (or None)."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    from keras_mpfp16.backend import tensorflow as bridge

    def make(wire):
        @tf.function
        def reduce(tensors):
            out, finite = bridge.allreduce_gradients(
                list(tensors),
                shapes=[t.shape for t in tensors],
                op="sum",
                wire_dtype=wire,
                bucket_bytes=2**30,
            )
            return out, finite

        return reduce

    fns = {wire: make(wire) for wire in WIRE_DTYPES}

    def call(tensors, wire="float32"):
        out, _ = fns[wire](tensors)
        return out

    def make_inputs(buf):
        parts = np.array_split(buf, 8)
        return [tf.constant(p) for p in parts]

    call.make_inputs = make_inputs
    return call


def ratios(records: list[dict]) -> list[dict]:
    """Per size: each variant's time relative to raw mpi4py (>1 means faster)."""
    by_size: dict[int, dict[str, float]] = {}
    for r in records:
        by_size.setdefault(r["bytes"], {})[r["variant"]] = r["seconds"]
    out = []
    for size, v in sorted(by_size.items()):
        raw = v["raw_mpi4py"]
        out.append(
            {"bytes": size, **{k: raw / t for k, t in v.items() if k != "raw_mpi4py"}}
        )
    return out
