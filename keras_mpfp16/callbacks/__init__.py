"""Callbacks: learning-rate scaling, exact global metrics, atomic checkpoints, traces.

- `LearningRateScaler`: the single-worker learning rate scaled for N workers
  ("linear", "sqrt", "paper", "none"), with warmup, decay and a cap,
  computed inside every train step.
- `GlobalMetrics`: logs (training and validation, per batch and per epoch)
  that are exact over all ranks' data, whatever the callback order — built
  into `fit`/`evaluate` for `DistributedOptimizer` models; this callback
  does it for models compiled with other optimizers.
- `AtomicModelCheckpoint`: `ModelCheckpoint` written by rank 0 only, via a
  temporary file and an atomic rename (stock `ModelCheckpoint` behaves so
  too in a `DistributedOptimizer` model's `fit`).
- `root_only`: run any callback on rank 0 only.
- `Timeline`: a trace-event timeline of `fit` per rank, and a scaling report.

Rank-0-only output (`print_once`, `root_stdout_only`) is at the top level
(`keras_mpfp16.print_once`): it is no callback.
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

from keras_mpfp16._deprecation import moved_names
from keras_mpfp16.callbacks.checkpoint import AtomicModelCheckpoint
from keras_mpfp16.callbacks.global_metrics import GlobalMetrics
from keras_mpfp16.callbacks.lr_scaler import (
    LearningRateScaler,
    ScaledLearningRate,
)
from keras_mpfp16.callbacks.lr_schedule import (
    SCALING_RULES,
    scaled_learning_rate,
)
from keras_mpfp16.callbacks.root_only import RootOnly, root_only
from keras_mpfp16.callbacks.timeline import Timeline

__all__ = [
    "SCALING_RULES",
    "AtomicModelCheckpoint",
    "GlobalMetrics",
    "LearningRateScaler",
    "RootOnly",
    "ScaledLearningRate",
    "Timeline",
    "root_only",
    "scaled_learning_rate",
]

# In 0.2's `__all__`, internal: importable until 0.4, with a warning.
__getattr__ = moved_names(
    __name__,
    {
        "temporary_path": "keras_mpfp16.callbacks.checkpoint",
        "scale_factor": "keras_mpfp16.callbacks.lr_schedule",
        "quiet_non_root_ranks": "keras_mpfp16.rank_output",
        "rank_output": "keras_mpfp16.callbacks.rank_output",
        "print_once": "keras_mpfp16.rank_output",
        "root_stdout_only": "keras_mpfp16.rank_output",
    },
    {
        "print_once": "keras_mpfp16.print_once",
        "root_stdout_only": "keras_mpfp16.root_stdout_only",
    },
)
