"""keras-mpfp16: mixed-precision data-parallel training of Keras 3 models over MPI.

Add three lines to a Keras script and launch it with `mpirun -np N`:

```python
import keras_mpfp16 as kmp

x, y = kmp.shard(x, y)
model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss=...)
```

Importing the package registers its Keras objects for `.keras` files. The
`runtime` subpackage itself never imports Keras.
"""

# The one source of the version (pyproject.toml reads it from here).
__version__ = "0.2.0"

# Thread defaults must be in the environment before the backend starts its
# thread pools, i.e. before the first tensor operation: do it first.
from keras_mpfp16.runtime.process import threads as _threads

_threads.apply_thread_defaults()

# Likewise CUDA_VISIBLE_DEVICES, when asked to (KERAS_MPFP16_BIND_GPUS=1):
# before Keras, hence TensorFlow, is imported here.
from keras_mpfp16.backend.devices import bind_gpus  # noqa: E402
from keras_mpfp16.runtime.process import gpus as _gpus  # noqa: E402

if _gpus.bind_requested():
    bind_gpus()

# Before anything else can print (e.g. `model.summary()` before the optimizer
# exists): silence the ranks the MPI launcher says are not rank 0 (no MPI call).
from keras_mpfp16 import rank_output as _rank_output  # noqa: E402

_rank_output.quiet_non_root_ranks_early()

from keras_mpfp16 import (  # noqa: E402
    callbacks,
    config,
    data,
    layers,
    optimizer,
    runtime,
    training,
)
from keras_mpfp16.callbacks import print_once, root_stdout_only  # noqa: E402
from keras_mpfp16.data import shard  # noqa: E402
from keras_mpfp16.optimizer import DistributedOptimizer, broadcast_variables  # noqa: E402
from keras_mpfp16.runtime import (  # noqa: E402
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
from keras_mpfp16.runtime.supervision.preemption import PREEMPTED_EXIT_CODE, Preempted  # noqa: E402
from keras_mpfp16.training import (  # noqa: E402
    distributed_evaluate,
    distributed_fit,
    split_predict,
)
from keras_mpfp16.training import install as install_keras_patches  # noqa: E402
from keras_mpfp16.training import uninstall as uninstall_keras_patches  # noqa: E402
from keras_mpfp16.training.patches import install_from_env as _install_from_env  # noqa: E402

# fit/evaluate of DistributedOptimizer models run as one job on all ranks
# (every Keras patch: training.patches; KERAS_MPFP16_PATCH_KERAS=0 skips them).
_install_from_env()


__all__ = [
    "PREEMPTED_EXIT_CODE",
    "DistributedOptimizer",
    "Preempted",
    "callbacks",
    "config",
    "data",
    "layers",
    "shard",
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
    "is_root",
    "local_rank",
    "local_size",
    "optimizer",
    "print_once",
    "rank",
    "root_stdout_only",
    "runtime",
    "size",
    "split_predict",
    "training",
    "uninstall_keras_patches",
]
