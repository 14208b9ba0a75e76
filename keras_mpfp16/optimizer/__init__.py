"""Optimizer side: the DistributedOptimizer and its loss scaling."""

from keras_mpfp16.optimizer.distributed_optimizer import (
    DistributedOptimizer,
    broadcast_variables,
)
from keras_mpfp16.optimizer.loss_scale import (
    LossScaleConfig,
    LossScaleState,
    transition,
)

__all__ = [
    "DistributedOptimizer",
    "LossScaleConfig",
    "LossScaleState",
    "broadcast_variables",
    "transition",
]
