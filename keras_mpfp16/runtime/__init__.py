"""Runtime: the MPI world and numpy-level collectives. Imports no Keras.

Layering inside: `world` (the communicator) is the bottom; `collectives`,
`stall`, `failure`, `preemption`, `timeline` build on it; `services` starts
the job's services from `world.init`'s hooks.
"""

# Names imported here but not in __all__ are re-exported for the library's
# own modules (`runtime.allgather_object`, ...), not as API.
# ruff: noqa: F401

# Registers the job's services (stall inspector, rendezvous, abort on
# failure) with `world.init`.
from keras_mpfp16.runtime import (
    failure,
    preemption,
    progress,
    services,
    stall,
)
from keras_mpfp16.runtime.collectives import (
    REDUCE_OPS,
    allgather,
    allgather_object,
    allreduce,
    allreduce_flat,
    barrier,
    broadcast,
    broadcast_arrays,
    same_on_all_ranks,
    validate_op,
)
from keras_mpfp16.runtime.cuda import cuda_aware
from keras_mpfp16.runtime.threads import apply_thread_defaults
from keras_mpfp16.runtime.wire import WIRE_DTYPES, validate_wire_dtype
from keras_mpfp16.runtime.world import (
    init,
    is_initialized,
    is_root,
    local_rank,
    local_size,
    mpi_comm,
    rank,
    shutdown,
    size,
    warn_once_per_job,
)

# What users call. The other names imported above (the numpy entry points
# the bridges use, the validators, the submodules) stay importable for the
# library itself and for code written against 0.2, but are not the API.
__all__ = [
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "cuda_aware",
    "init",
    "is_initialized",
    "is_root",
    "local_rank",
    "local_size",
    "mpi_comm",
    "rank",
    "shutdown",
    "size",
]
