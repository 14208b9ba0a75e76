"""The evaluate rendezvous with KERAS_MPFP16_EVALUATE_WAIT=inf (no clock).

Run as `mpirun -np N python rendezvous_wait.py SLEEP`. Rank 0 enters
`SLEEP` seconds after the others: with an infinite wait they are together
all the same. Then the other ranks finish (exit) and rank 0 enters again: it
is alone at once. Rank 0 prints one JSON line.
"""

import json
import sys
import time

import keras_mpfp16 as kmp
from keras_mpfp16.runtime.supervision import rendezvous

sleep = float(sys.argv[1])
rank = kmp.rank()
kmp.barrier()
if rank == 0:
    time.sleep(sleep)
first = rendezvous.enter("evaluate")
if rank == 0:
    start = time.monotonic()
    second = rendezvous.enter("evaluate")  # the others exit meanwhile
    print(
        json.dumps(
            {
                "rank": 0,
                "first_together": first.together,
                "second_together": second.together,
                "second_seconds": time.monotonic() - start,
            }
        ),
        flush=True,
    )
