"""The package's public names and its import-time work (`import keras_mpfp16`).

`keras_mpfp16/__init__.py` runs this module at import (`from keras_mpfp16._api
import *`), in this order: the per-rank thread defaults and the GPU binding
before anything can start a backend, the non-root ranks' Keras output
silenced before anything can print, the Keras objects registered, the seam
checked and the Keras patches installed. The one exception is the launch
wrapper (`python -m keras_mpfp16.runtime.launch mpirun ...`): a supervisor
that needs none of it, for which this module loads on first use only.
"""

# The order of the steps below is the point: imports follow code on purpose.
# ruff: noqa: E402

# Thread defaults must be in the environment before the backend starts its
# thread pools, i.e. before the first tensor operation: do it first.
from keras_mpfp16.runtime.process import threads as _threads

_threads.apply_thread_defaults()

# Likewise CUDA_VISIBLE_DEVICES, when asked to (KERAS_MPFP16_BIND_GPUS=1):
# before Keras, hence TensorFlow, is imported here.
from keras_mpfp16.backend.devices import bind_gpus
from keras_mpfp16.runtime.process import gpus as _gpus

if _gpus.bind_requested():
    bind_gpus()

# Before anything else can print (e.g. `model.summary()` before the optimizer
# exists): silence the ranks the MPI launcher says are not rank 0 (no MPI call).
from keras_mpfp16 import rank_output as _rank_output

_rank_output.quiet_non_root_ranks_early()

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
from keras_mpfp16.training.patches import install_from_env as _install_from_env

# fit/evaluate of DistributedOptimizer models run as one job on all ranks
# (every Keras patch: training.patches; KERAS_MPFP16_PATCH_KERAS=0 skips them).
_install_from_env()


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
