"""`ring.alltoall` against MPI's `Alltoall` on a real job (numpy and mpi4py
only: no TensorFlow, so it runs at 4 and 6 ranks in seconds).

For block sizes that split into uneven halves (1001 bytes) and even ones,
every rank's result must equal MPI's `Alltoall` byte for byte, and the
Sendrecv count must be the schedule's (its own block + one per step).
Prints one JSON line per rank.
"""

import json

import numpy as np
from mpi4py import MPI

from keras_mpfp16.runtime.mpi import ring

comm = MPI.COMM_WORLD
n, r = comm.Get_size(), comm.Get_rank()
out = {"rank": r, "size": n}
for block in (1, 1001, 4096):
    send = np.random.default_rng(100 * r + block).integers(
        0, 256, size=(n, block), dtype=np.uint8
    )
    want = np.empty_like(send)
    comm.Alltoall(send, want)
    got = np.full_like(send, 7)
    calls = {"Sendrecv": 0, "Alltoall": 0}

    class Counting:
        # Counts the calls the schedule makes on the communicator.
        def __getattr__(self, name):
            if name in calls:
                calls[name] += 1
            return getattr(comm, name)

    ring.alltoall(Counting(), send, got, block, min_bytes=0)
    out[f"equal_{block}"] = bool(np.array_equal(got, want))
    out[f"sendrecv_{block}"] = calls["Sendrecv"]
    out[f"alltoall_{block}"] = calls["Alltoall"]
    # The default threshold: small blocks stay on MPI's Alltoall.
    calls.update(Sendrecv=0, Alltoall=0)
    ring.alltoall(Counting(), send, got, block)
    out[f"default_alltoall_{block}"] = calls["Alltoall"]
out["steps"] = len(ring.alltoall_schedule(n)) if n >= 3 else 0
print(json.dumps(out), flush=True)
