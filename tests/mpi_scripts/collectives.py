"""Runtime collectives on a real MPI job (no Keras used).

Prints one JSON line per rank with the observations; the test asserts on them.
"""

import json

import numpy as np

from keras_mpfp16 import runtime
from keras_mpfp16.runtime.mpi import collectives

runtime.init()
runtime.init()  # idempotent
rank, n = runtime.rank(), runtime.size()
out = {
    "rank": rank,
    "size": n,
    "local_rank": runtime.local_rank(),
    "local_size": runtime.local_size(),
}

x = np.arange(6, dtype=np.float32) + rank
out["average"] = runtime.allreduce(x).tolist()
out["sum"] = runtime.allreduce(x, op="sum").tolist()
out["max"] = runtime.allreduce(np.int64(rank), op="max").item()
out["int_average"] = runtime.allreduce(np.int32(rank)).item()

# Uneven allgather: rank r contributes r+1 rows.
rows = np.full((rank + 1, 2), rank, dtype=np.int16)
out["allgather"] = runtime.allgather(rows).tolist()
out["allgather_scalar"] = runtime.allgather(float(rank)).tolist()

out["bcast_obj"] = runtime.broadcast({"from": rank, "list": [1, 2]}, root=n - 1)
arr = np.arange(5, dtype=np.float64) * (rank + 1) if rank == 1 else None
out["bcast_array"] = runtime.broadcast(arr, root=1).tolist()
out["bcast_arrays"] = [
    a.tolist()
    for a in collectives.broadcast_arrays(
        [np.float32(rank), np.full((2, 2), rank, dtype=np.int64)], root=0
    )
]

# Fused gradient buffer in every wire format: results must be identical on all
# ranks bit for bit, and close to the float64 truth.
rng = np.random.default_rng(100 + rank)
grads = (rng.normal(size=10_001) * 10.0 ** rng.integers(-6, 2, size=10_001)).astype(
    np.float32
)
truth = runtime.allreduce(grads.astype(np.float64), op="sum") / n
for wire in ("float32", "float16", "bfloat16"):
    got = collectives.allreduce_flat(grads, op="average", wire_dtype=wire)
    digests = runtime.allgather(np.frombuffer(got.tobytes(), dtype=np.uint8)[None])
    out[f"wire_{wire}_identical"] = bool(all((d == digests[0]).all() for d in digests))
    # Normwise relative error: the 16-bit formats round the inputs once.
    out[f"wire_{wire}_rel_err"] = float(
        np.linalg.norm(got - truth) / np.linalg.norm(truth)
    )
    # Tiny gradients must survive (plain float16 flushes |x| < 6e-8 to zero)
    # and huge ones must not overflow (float16 tops out at 65504).
    for label, magnitude in (("tiny", 1e-9), ("huge", 1e6)):
        vals = (np.linspace(1.0, 2.0, 257) * magnitude * (rank + 1)).astype(np.float32)
        want = np.linspace(1.0, 2.0, 257) * magnitude * sum(range(1, n + 1)) / n
        got_v = collectives.allreduce_flat(vals, op="average", wire_dtype=wire)
        out[f"wire_{wire}_{label}_rel_err"] = float(np.max(np.abs(got_v - want) / want))

# The ring allgather (runtime/mpi/ring.py) against MPI's Allgather: the same
# bytes, for an odd block size; and the 16-bit numpy wire on rows large enough
# for the ring by default equals the same reduction with the ring turned off.
from keras_mpfp16.runtime.mpi import ring, world  # noqa: E402

block = np.random.default_rng(7 + rank).integers(0, 255, size=1001, dtype=np.uint8)
via_ring = np.empty((n, 1001), np.uint8)
collectives.allgather_into(block, via_ring, "test", block_bytes=1001, ring_min_bytes=0)
via_mpi = np.empty_like(via_ring)
world.world().comm.Allgather(block, via_mpi)
out["ring_allgather_equal"] = bool(np.array_equal(via_ring, via_mpi))
# Rows over RING_MIN_BYTES: at 3+ ranks the allgather goes around the ring,
# and with WIRE_SCHEDULE=ring the owner's sum too. Both within the float16
# wire's tolerance of the truth.
import keras_mpfp16.config as kmp_config  # noqa: E402

big = rng.normal(size=n * (ring.RING_MIN_BYTES // 2 + 5)).astype(np.float32)
big_truth = runtime.allreduce(big.astype(np.float64), op="sum")
for schedule in ("ring", "alltoall"):
    kmp_config.set("WIRE_SCHEDULE", schedule)
    got = collectives.allreduce_flat(big, op="sum", wire_dtype="float16")
    out[f"big_{schedule}_rel_err"] = float(
        np.linalg.norm(got - big_truth) / np.linalg.norm(big_truth)
    )
    out[f"big_{schedule}_crc"] = int(np.frombuffer(got.tobytes(), np.uint32).sum())
kmp_config.set("WIRE_SCHEDULE", "ring")
out["ring_wire_used"] = ring.reduce_scatter_schedule(n, (len(big) // n + 2) * 2)
kmp_config.set("WIRE_SCHEDULE", "alltoall")

try:
    runtime.allreduce(x, op="median")
except ValueError as e:
    out["bad_op"] = str(e)
try:
    runtime.broadcast(1, root=n)
except ValueError as e:
    out["bad_root"] = str(e)
try:
    runtime.allgather(np.zeros((1, rank + 1)))
    out["bad_gather"] = None
except ValueError as e:
    out["bad_gather"] = str(e)
runtime.barrier()
print(json.dumps(out), flush=True)
