"""Callbacks: learning-rate scaling, exact global metrics, rank-0 output.

- `LearningRateScaler`: the single-worker learning rate scaled for N workers
  ("linear", "sqrt", "paper", "none"), with warmup, decay and a cap,
  computed inside every train step.
- `GlobalMetrics`: logs (training and validation, per batch and per epoch)
  that are exact over all ranks' data, whatever the callback order — built
  into `fit`/`evaluate` for `DistributedOptimizer` models; for others.
- `AtomicModelCheckpoint`: `ModelCheckpoint` written by rank 0 only, via a
  temporary file and an atomic rename (stock `ModelCheckpoint` behaves so
  too in a `DistributedOptimizer` model's `fit`).
- `root_only`: run any callback on rank 0 only.
- `Timeline`: a trace-event timeline of `fit` per rank, and a scaling report.
"""

from keras_mpfp16.callbacks import rank_output as _rank_output

# Before anything else can print (e.g. `model.summary()` before the optimizer
# exists): silence ranks that the MPI launcher says are not rank 0. No MPI
# call; `import keras_mpfp16` runs this because the optimizer imports
# `rank_output`.
_rank_output.quiet_non_root_ranks_early()

from keras_mpfp16.callbacks.checkpoint import (  # noqa: E402
    AtomicModelCheckpoint,
    temporary_path,
)
from keras_mpfp16.callbacks.global_metrics import GlobalMetrics  # noqa: E402
from keras_mpfp16.callbacks.lr_scaler import (  # noqa: E402
    LearningRateScaler,
    ScaledLearningRate,
)
from keras_mpfp16.callbacks.lr_schedule import (  # noqa: E402
    SCALING_RULES,
    scale_factor,
    scaled_learning_rate,
)
from keras_mpfp16.callbacks.rank_output import (  # noqa: E402
    print_once,
    quiet_non_root_ranks,
    root_stdout_only,
)
from keras_mpfp16.callbacks.root_only import RootOnly, root_only  # noqa: E402
from keras_mpfp16.callbacks.timeline import Timeline  # noqa: E402

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
