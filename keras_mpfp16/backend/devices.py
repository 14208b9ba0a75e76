"""`kmp.bind_gpus()`: one GPU per local rank, before the backend starts CUDA.

CUDA reads `CUDA_VISIBLE_DEVICES` once, when it initialises in the process;
TensorFlow initialises it lazily, at the first operation or device query.
The device choice is `keras_mpfp16.runtime.process.gpus`; this module adds what only
the backend layer can tell: whether it is already too late.
"""

from __future__ import annotations

import importlib
import sys

from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.process import gpus


def framework_initialized() -> str | None:
    """Which loaded framework has already set up its devices, or None.

    Only frameworks already imported are asked (importing one here would be
    the wrong way round): TensorFlow through the bridge's
    `devices_initialized()`, PyTorch through `torch.cuda.is_initialized()`.
    """
    if "tensorflow" in sys.modules:
        bridge = importlib.import_module("keras_mpfp16.backend.tensorflow")
        if bridge.devices_initialized():
            return "TensorFlow"
    torch_cuda = sys.modules.get("torch.cuda")
    if torch_cuda is not None and torch_cuda.is_initialized():
        return "PyTorch"
    return None


def bind_gpus(gpus_per_rank: int = 1) -> list[str]:
    """Gives each local rank its own GPU(s), before TensorFlow starts CUDA.

    Sets `CUDA_VISIBLE_DEVICES` from the launcher's local rank (Open MPI's
    `OMPI_COMM_WORLD_LOCAL_RANK`, Slurm's `SLURM_LOCALID`, Hydra's
    `MPI_LOCALRANKID`, ...; MPI's own local rank for launchers that announce
    none): local rank `r` gets the `r`-th device of those visible (of
    `CUDA_VISIBLE_DEVICES` if set, else of the node's). A process that
    already sees exactly `gpus_per_rank` devices keeps them, so the call is
    harmless under `srun --gpus-per-task=1`. Without GPUs it does nothing.

    Call it right after `import keras_mpfp16`, before building a model or
    running any tensor operation; `KERAS_MPFP16_BIND_GPUS=1` has the import
    do it. Inside TensorFlow the rank's GPU is then `/GPU:0`.

    Args:
        gpus_per_rank: Devices per rank (default 1).

    Returns:
        The devices now in `CUDA_VISIBLE_DEVICES` (`[]` without GPUs).

    Raises:
        RuntimeError: if TensorFlow (or PyTorch) has already initialised its
            devices, so that the variable would have no effect.
        ValueError: if the node has fewer GPUs than its ranks need.

    Example:

    ```python
    import keras_mpfp16 as kmp
    kmp.bind_gpus()
    import keras  # build the model after this point
    ```
    """
    return gpus.bind(gpus_per_rank, framework_initialized, _mpi_local_rank_and_size)


def _mpi_local_rank_and_size() -> tuple[int, int]:
    return world.local_rank(), world.local_size()


def _tensorflow_gpus() -> list[str] | None:
    """The GPUs TensorFlow will compute on, or None when it is not installed.

    Imports TensorFlow (the doctor's question is what the training will see)
    and asks `tf.config.list_physical_devices("GPU")`, which initialises its
    devices: call it where that is harmless.
    """
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return [d.name for d in tf.config.list_physical_devices("GPU")]


def _tensorflow_built_with_cuda() -> bool | None:
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return bool(tf.test.is_built_with_cuda())


# The seams: tests (and a machine without a GPU) set these to say what the
# framework would report.
gpu_query = _tensorflow_gpus
cuda_build_query = _tensorflow_built_with_cuda


def framework_gpus() -> list[str] | None:
    """GPU devices the framework (TensorFlow) computes on in this process.

    Returns:
        Device names such as `["/physical_device:GPU:0"]`, `[]` when
        TensorFlow sees no GPU (it computes on the CPU), or None when
        TensorFlow is not installed.
    """
    return gpu_query()


def framework_built_with_cuda() -> bool | None:
    """Whether the installed TensorFlow can use CUDA at all (None: no TensorFlow)."""
    return cuda_build_query()
