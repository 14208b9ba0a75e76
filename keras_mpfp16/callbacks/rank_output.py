"""Deprecated: `keras_mpfp16.callbacks.rank_output` (documented in 0.2) moved to `keras_mpfp16.rank_output`.

Its names keep working until 0.4, each use warning with what to call instead.
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

from keras_mpfp16._deprecation import moved_module

__getattr__ = moved_module(
    __name__,
    "keras_mpfp16.rank_output",
    {
        "print_once": "keras_mpfp16.print_once",
        "root_stdout_only": "keras_mpfp16.root_stdout_only",
    },
)
