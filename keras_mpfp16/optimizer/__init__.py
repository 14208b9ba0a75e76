"""Optimizer side: the DistributedOptimizer, loss scaling and bucket planning."""

from keras_mpfp16.optimizer.distributed_optimizer import DistributedOptimizer
from keras_mpfp16.optimizer.loss_scale import LossScaleConfig, LossScaleState, transition

__all__ = ["DistributedOptimizer", "LossScaleConfig", "LossScaleState", "transition"]
