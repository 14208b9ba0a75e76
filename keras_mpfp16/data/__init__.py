"""Data sharding: each rank's disjoint part of the data, equal steps per epoch."""

from keras_mpfp16.data.arithmetic import shard_indices, shard_sizes, steps_per_epoch
from keras_mpfp16.data.py_dataset import ShardedPyDataset
from keras_mpfp16.data.shard import shard

__all__ = [
    "ShardedPyDataset",
    "shard",
    "shard_indices",
    "shard_sizes",
    "steps_per_epoch",
]
