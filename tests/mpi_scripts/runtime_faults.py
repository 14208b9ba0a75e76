"""Faults at the runtime level (no model): rank 1 is the faulty rank.

  ctrl-c          rank 1 gets SIGINT while rank 0 waits in a barrier
  raise-exit      rank 1 raises SystemExit(3) after train step 2; rank 0 goes on
  stop-mid        rank 1 freezes (SIGSTOP) while rank 0 waits in an allreduce
  stop-after-end  rank 0 reaches the end of its script; then rank 1 freezes
  stop-rank0      rank 0 freezes (SIGSTOP) mid-training; the others wait
  signature       rank 0 ends; rank 1 enters a 'model signature check' alone
  thread-level    MPI initialised with MPI_THREAD_SERIALIZED: the inspector
                  must stay off (and say so once); the job runs normally

Prints "DONE rank R" on a rank that reaches its end.
"""

import os
import signal
import sys
import threading
import time

fault = sys.argv[1]
if fault == "thread-level":
    import mpi4py

    mpi4py.rc.thread_level = "serialized"

import numpy as np  # noqa: E402

from keras_mpfp16 import runtime  # noqa: E402

runtime.init()
rank = runtime.rank()
FAULTY = 1


def train_steps(n, start=0):
    for step in range(start, start + n):
        runtime.allreduce(
            np.ones(4), name=f"gradient allreduce, bucket 1/1, train step {step}"
        )


if fault == "ctrl-c":
    runtime.barrier()
    if rank == FAULTY:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    runtime.barrier()
elif fault == "raise-exit":
    train_steps(3)
    if rank == FAULTY:
        raise SystemExit(3)
    train_steps(3, start=3)
elif fault == "stop-mid":
    train_steps(2)
    if rank == FAULTY:
        os.kill(os.getpid(), signal.SIGSTOP)
    train_steps(2, start=2)
elif fault == "stop-rank0":
    train_steps(2)
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    train_steps(2, start=2)
elif fault == "stop-after-end":
    runtime.barrier()
    if rank == FAULTY:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGSTOP)
elif fault == "signature":
    train_steps(2)
    if rank == FAULTY:
        time.sleep(1.0)
        runtime.allgather_object(("sig",), name="model signature check")
elif fault == "thread-level":
    from mpi4py import MPI

    threads = [t.name for t in threading.enumerate()]
    print(
        f"rank {rank} level {MPI.Query_thread()} inspector "
        f"{'keras_mpfp16-stall' in threads}",
        flush=True,
    )
    train_steps(2)
else:
    raise SystemExit(f"unknown fault {fault!r}")
print(f"DONE rank {rank}", flush=True)
