"""Runtime: everything below Keras, by job. Imports no Keras.

Sub-packages, lowest first (each imports only those before it):

- `process`: facts about this process before MPI starts (the launcher's
  variables, thread defaults, GPU binding);
- `mpi`: the communicator (`world`), the numpy collectives, the 16-bit wire
  format, CUDA-aware MPI;
- `trace`: the per-rank timeline and the scaling report;
- `supervision`: the stall inspector, abort on failure, the rendezvous, the
  preemption agreement, atomic files, the launch wrapper; `services` starts
  them from `world.init`'s hooks.

`progress` (where training is) stands alone. This package's `__init__`
gathers the names users call (`__all__`).
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

# Names imported here but not in __all__ are re-exported for the library's
# own modules (`runtime.allgather_object`, ...), not as API.
# ruff: noqa: F401

from keras_mpfp16.runtime import progress
from keras_mpfp16.runtime.mpi.collectives import (
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
from keras_mpfp16.runtime.mpi.cuda import cuda_aware
from keras_mpfp16.runtime.mpi.wire import WIRE_DTYPES, validate_wire_dtype
from keras_mpfp16.runtime.mpi.world import (
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
from keras_mpfp16.runtime.process.threads import apply_thread_defaults
from keras_mpfp16.runtime.progress import set_epoch

# Registers the job's services (stall inspector, rendezvous, abort on
# failure) with `world.init`.
from keras_mpfp16.runtime.supervision import services
from keras_mpfp16.runtime.supervision.stall import configure as configure_stall

# What users call. The other names imported above (the numpy entry points
# the bridges use, the validators, the submodules) stay importable for the
# library itself and for code written against 0.2, but are not the API.
__all__ = [
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "configure_stall",
    "cuda_aware",
    "init",
    "is_initialized",
    "is_root",
    "local_rank",
    "local_size",
    "mpi_comm",
    "rank",
    "set_epoch",
    "shutdown",
    "size",
]

# 0.2's module paths (`keras_mpfp16.runtime.world.init`, ...), deprecated:
# small modules at the old paths forward with a warning.
_MOVED = ("collectives", "cuda", "stall", "world")


def __getattr__(name: str):
    if name in _MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
