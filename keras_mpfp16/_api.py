"""The package's public names (`keras_mpfp16.__all__`).

Names only, no import-time work: `keras_mpfp16._bootstrap` imports this
module in its `public_api` step (after the thread defaults, the GPU binding,
the seam check and the quiet non-root ranks, before the Keras patches) and
binds these names on the package. Importing it registers the package's Keras
objects (their modules use `keras.saving.register_keras_serializable`).
"""

# The subpackages, as attributes (`kmp.config.set(...)`, `kmp.layers.LSTM`).
from keras_mpfp16 import (  # noqa: F401
    callbacks,
    config,
    data,
    layers,
    optimizer,
    runtime,
    training,
)
from keras_mpfp16.backend.devices import bind_gpus
from keras_mpfp16.data import ShardedPyDataset, shard, shard_sizes
from keras_mpfp16.optimizer import (
    DistributedOptimizer,
    LossScaleConfig,
    broadcast_variables,
)
from keras_mpfp16.rank_output import print_once, root_stdout_only
from keras_mpfp16.runtime import (
    allgather,
    allreduce,
    barrier,
    broadcast,
    cuda_aware,
    init,
    is_root,
    local_rank,
    local_size,
    rank,
    size,
)
from keras_mpfp16.runtime.supervision.preemption import PREEMPTED_EXIT_CODE, Preempted
from keras_mpfp16.training import (
    distributed_evaluate,
    distributed_fit,
    split_predict,
)
from keras_mpfp16.training import install as install_keras_patches
from keras_mpfp16.training import installed as installed_keras_patches
from keras_mpfp16.training import uninstall as uninstall_keras_patches

# What users call (docs/api.md documents each); the subpackages
# (`kmp.callbacks`, `kmp.layers`, `kmp.config`, `kmp.runtime`, ...) are
# attributes, not part of `from keras_mpfp16 import *`.
__all__ = [
    "PREEMPTED_EXIT_CODE",
    "DistributedOptimizer",
    "LossScaleConfig",
    "Preempted",
    "ShardedPyDataset",
    "allgather",
    "allreduce",
    "barrier",
    "bind_gpus",
    "broadcast",
    "broadcast_variables",
    "cuda_aware",
    "distributed_evaluate",
    "distributed_fit",
    "init",
    "install_keras_patches",
    "installed_keras_patches",
    "is_root",
    "local_rank",
    "local_size",
    "print_once",
    "rank",
    "root_stdout_only",
    "shard",
    "shard_sizes",
    "size",
    "split_predict",
    "uninstall_keras_patches",
]
