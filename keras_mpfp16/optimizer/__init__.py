"""Optimizer side: the DistributedOptimizer and its loss scaling."""

from keras_mpfp16._deprecation import moved_names
from keras_mpfp16.optimizer.distributed_optimizer import (
    DistributedOptimizer,
    broadcast_variables,
)
from keras_mpfp16.optimizer.loss_scale import LossScaleConfig

__all__ = [
    "DistributedOptimizer",
    "LossScaleConfig",
    "broadcast_variables",
]

# In 0.2's `__all__`, internal: importable until 0.4, with a warning.
__getattr__ = moved_names(
    __name__,
    {
        "LossScaleState": "keras_mpfp16.optimizer.loss_scale",
        "transition": "keras_mpfp16.optimizer.loss_scale",
    },
)
