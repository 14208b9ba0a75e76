"""Callbacks: learning-rate scaling, exact global metrics, rank-0 output.

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
"""

from keras_mpfp16.callbacks.checkpoint import (
    AtomicModelCheckpoint,
    temporary_path,
)
from keras_mpfp16.callbacks.global_metrics import GlobalMetrics
from keras_mpfp16.callbacks.lr_scaler import (
    LearningRateScaler,
    ScaledLearningRate,
)
from keras_mpfp16.callbacks.lr_schedule import (
    SCALING_RULES,
    scale_factor,
    scaled_learning_rate,
)
from keras_mpfp16.callbacks.root_only import RootOnly, root_only
from keras_mpfp16.callbacks.timeline import Timeline
from keras_mpfp16.rank_output import (
    print_once,
    quiet_non_root_ranks,
    root_stdout_only,
)

__all__ = [
    "SCALING_RULES",
    "AtomicModelCheckpoint",
    "GlobalMetrics",
    "LearningRateScaler",
    "RootOnly",
    "ScaledLearningRate",
    "Timeline",
    "print_once",
    "quiet_non_root_ranks",
    "root_only",
    "root_stdout_only",
    "scale_factor",
    "scaled_learning_rate",
    "temporary_path",
]
