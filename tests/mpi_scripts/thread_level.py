"""What a job gets below MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level =
"serialized"): the chosen behaviour is to say so loudly, once, at the start.

`mpirun -np 2 python thread_level.py MODE`:

- `stop`: a few steps, then rank 1 freezes (SIGSTOP: silent, as a lost
  node); rank 0 waits in the next allreduce. Heartbeats are off at this
  level, so nothing ends the job (the test ends it).
- `evaluate`: `model.evaluate` on every rank, each rank with its own half of
  the data (`kmp.shard`). Not split at this level: each rank evaluates its
  own half alone. Prints one JSON line per rank: its result and the result
  of a plain Keras evaluate of its half.
- `overlap`: `fit` with KERAS_MPFP16_OVERLAP=1 (set by the test): the
  gradient buckets are reduced synchronously (the communication thread
  needs MULTIPLE), with a warning. Prints one JSON line per rank: whether
  the thread was started, and the weights' digest.
"""

import json
import os
import signal
import sys
import time

import mpi4py

mpi4py.rc.thread_level = "serialized"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

mode = sys.argv[1]


def data_and_model(rows):
    """`rows` samples of 5 features, and a seeded linear model compiled with
    the library's optimizer (the same on every rank)."""
    import keras
    import numpy as np

    import keras_mpfp16 as kmp

    rng = np.random.default_rng(3)
    x = rng.normal(size=(rows, 5)).astype("float32")
    y = rng.normal(size=(rows, 1)).astype("float32")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD()), loss="mse"
    )
    return x, y, model


if mode == "stop":
    import numpy as np

    from keras_mpfp16 import runtime

    runtime.init()
    rank = runtime.rank()
    for step in range(3):
        runtime.allreduce(np.ones(4), name=f"train step {step}")
    print(f"STEPS DONE rank {rank} {time.time()}", flush=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    runtime.allreduce(np.ones(4), name="train step 3")
    print(f"FINISHED rank {rank}", flush=True)
elif mode == "overlap":
    import hashlib

    import keras
    import numpy as np

    import keras_mpfp16 as kmp
    from keras_mpfp16.runtime.mpi import overlap

    rank = kmp.rank()
    x, y, model = data_and_model(32)
    model.fit(*kmp.shard(x, y), batch_size=8, epochs=1, verbose=0)
    digest = hashlib.sha256(
        b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    ).hexdigest()
    print(
        json.dumps(
            {"rank": rank, "thread": overlap._thread is not None, "digest": digest}
        ),
        flush=True,
    )
else:
    import keras
    import numpy as np

    import keras_mpfp16 as kmp

    rank = kmp.rank()
    x, y, model = data_and_model(40)
    xs, ys = kmp.shard(x, y)
    got = model.evaluate(xs, ys, batch_size=8, verbose=0)
    plain = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
    plain.set_weights(model.get_weights())
    plain.compile(loss="mse")
    # What one process gets on this rank's half, and on all the data.
    own = plain.evaluate(xs, ys, batch_size=8, verbose=0)
    whole = plain.evaluate(x, y, batch_size=8, verbose=0)
    print(
        json.dumps({"rank": rank, "got": got, "own": own, "whole": whole}), flush=True
    )
