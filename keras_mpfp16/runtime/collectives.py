"""Deprecated: `keras_mpfp16.runtime.collectives` (documented in 0.2) moved to `keras_mpfp16.runtime.mpi.collectives`.

Its names keep working until 0.4, each use warning with what to call instead.
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

from keras_mpfp16._deprecation import moved_module

__getattr__ = moved_module(
    __name__,
    "keras_mpfp16.runtime.mpi.collectives",
    {
        "barrier": "keras_mpfp16.barrier",
        "allreduce": "keras_mpfp16.allreduce",
        "allgather": "keras_mpfp16.allgather",
        "broadcast": "keras_mpfp16.broadcast",
        "allgather_object": "keras_mpfp16.runtime.allgather_object",
    },
)
