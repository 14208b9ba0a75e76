"""Optimizer side: the DistributedOptimizer and loss scaling."""

from keras_mpfp16 import _keras_compat
from keras_mpfp16.optimizer.distributed_optimizer import (
    DistributedOptimizer,
    broadcast_variables,
)
from keras_mpfp16.optimizer.loss_scale import (
    LossScaleConfig,
    LossScaleState,
    transition,
)

_keras_compat.install_jit_guard()

__all__ = [
    "DistributedOptimizer",
    "LossScaleConfig",
    "LossScaleState",
    "broadcast_variables",
    "transition",
]
