"""Deprecated: `keras_mpfp16.runtime.world` (documented in 0.2) moved to `keras_mpfp16.runtime.mpi.world`.

Its names keep working until 0.4, each use warning with what to call instead.
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

from keras_mpfp16._deprecation import moved_module

__getattr__ = moved_module(
    __name__,
    "keras_mpfp16.runtime.mpi.world",
    {
        "init": "keras_mpfp16.init",
        "size": "keras_mpfp16.size",
        "rank": "keras_mpfp16.rank",
        "local_size": "keras_mpfp16.local_size",
        "local_rank": "keras_mpfp16.local_rank",
        "is_root": "keras_mpfp16.is_root",
        "barrier": "keras_mpfp16.barrier",
        "is_initialized": "keras_mpfp16.runtime.is_initialized",
        "mpi_comm": "keras_mpfp16.runtime.mpi_comm",
        "shutdown": "keras_mpfp16.runtime.shutdown",
    },
)
