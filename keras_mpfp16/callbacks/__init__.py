"""Callbacks: learning-rate scaling, exact metric averaging, rank-0 output."""

from keras_mpfp16.callbacks.rank_output import quiet_non_root_ranks

__all__ = ["quiet_non_root_ranks"]
