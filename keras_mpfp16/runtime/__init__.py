"""Runtime: the MPI world and numpy-level collectives. Imports no Keras."""

from keras_mpfp16.runtime import failure, preemption, progress, stall
from keras_mpfp16.runtime.collectives import (
    REDUCE_OPS,
    allgather,
    allgather_object,
    allreduce,
    allreduce_flat,
    broadcast,
    broadcast_arrays,
    validate_op,
)
from keras_mpfp16.runtime.cuda import cuda_aware
from keras_mpfp16.runtime.threads import apply_thread_defaults
from keras_mpfp16.runtime.wire import WIRE_DTYPES, validate_wire_dtype
from keras_mpfp16.runtime.world import (
    barrier,
    init,
    is_initialized,
    is_root,
    local_rank,
    local_size,
    mpi_comm,
    rank,
    shutdown,
    size,
)

__all__ = [
    "REDUCE_OPS",
    "WIRE_DTYPES",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_flat",
    "apply_thread_defaults",
    "barrier",
    "broadcast",
    "broadcast_arrays",
    "cuda_aware",
    "failure",
    "preemption",
    "progress",
    "stall",
    "init",
    "is_initialized",
    "is_root",
    "local_rank",
    "local_size",
    "mpi_comm",
    "rank",
    "shutdown",
    "size",
    "validate_op",
    "validate_wire_dtype",
]
