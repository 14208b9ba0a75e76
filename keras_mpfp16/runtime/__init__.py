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
states the names users call (`__all__`) and the deprecation shims.
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

# The public API only (`__all__`): the library's own modules import the
# sub-packages they use (`runtime.mpi.world`, ...), never this facade
# (tests/test_front_door.py checks it).

from keras_mpfp16._deprecation import moved_names
from keras_mpfp16.runtime.mpi.collectives import (
    allgather,
    allgather_object,
    allreduce,
    barrier,
    broadcast,
)
from keras_mpfp16.runtime.mpi.cuda import cuda_aware
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
)
from keras_mpfp16.runtime.progress import set_epoch

# Registers the job's services (stall inspector, rendezvous, abort on
# failure) with `world.init`: any import of a runtime module runs this
# package's `__init__` first, so every process that can call `init` has them.
from keras_mpfp16.runtime.supervision import services  # noqa: F401
from keras_mpfp16.runtime.supervision.stall import configure as configure_stall

# What users call.
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

# Re-exported here until 0.3 for the library's own modules, never the API:
# importable until 0.4, with a warning naming where each lives.
_moved_names = moved_names(
    __name__,
    {
        "REDUCE_OPS": "keras_mpfp16.runtime.mpi.collectives",
        "allreduce_flat": "keras_mpfp16.runtime.mpi.collectives",
        "broadcast_arrays": "keras_mpfp16.runtime.mpi.collectives",
        "same_on_all_ranks": "keras_mpfp16.runtime.mpi.collectives",
        "validate_op": "keras_mpfp16.runtime.mpi.collectives",
        "WIRE_DTYPES": "keras_mpfp16.runtime.mpi.wire",
        "validate_wire_dtype": "keras_mpfp16.runtime.mpi.wire",
        "warn_once_per_job": "keras_mpfp16.runtime.mpi.world",
        "apply_thread_defaults": "keras_mpfp16.runtime.process.threads",
    },
)


def __getattr__(name: str):
    if name in _MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    return _moved_names(name)
