"""One GPU per local rank: `CUDA_VISIBLE_DEVICES` set before CUDA starts.

CUDA reads `CUDA_VISIBLE_DEVICES` once, when it initialises in the process;
TensorFlow initialises it lazily, at the first operation or device query.
`bind_gpus` sets the variable from the launcher's local rank (no MPI call
needed) and refuses, with an error, when it comes too late to have an
effect. `KERAS_MPFP16_BIND_GPUS=1` makes `import keras_mpfp16` call it.

Nothing here imports a deep-learning framework: whether TensorFlow (or
PyTorch, for Keras's torch backend) has already set up its devices is read
from the modules already loaded (`sys.modules`), never by importing them.
"""

from __future__ import annotations

import os
import sys

from keras_mpfp16 import _validate
from keras_mpfp16.runtime import launcher

ENV_VAR = "KERAS_MPFP16_BIND_GPUS"


def node_gpus() -> int:
    """NVIDIA GPUs in this machine, from the driver (no CUDA initialisation)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def parse_visible(value: str | None) -> list[str] | None:
    """`CUDA_VISIBLE_DEVICES` as a list of entries (None when unset)."""
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def select_devices(
    local_rank: int,
    local_size: int,
    visible: list[str] | None,
    gpus_in_node: int,
    gpus_per_rank: int = 1,
) -> list[str]:
    """The devices local rank `local_rank` should see.

    Args:
        local_rank: The rank among the processes on this node.
        local_size: Processes on this node.
        visible: `CUDA_VISIBLE_DEVICES` as found (indices or UUIDs), or None
            when unset.
        gpus_in_node: GPUs the driver reports (used when `visible` is None).
        gpus_per_rank: Devices each rank gets.

    Returns:
        The entries to put in `CUDA_VISIBLE_DEVICES`; `[]` when there is no
        GPU. A process that already sees exactly `gpus_per_rank` devices
        (the launcher bound it: `srun --gpus-per-task=1`) keeps them.

    Raises:
        ValueError: if the node has fewer GPUs than its ranks need.
    """
    if visible is not None and len(visible) == gpus_per_rank:
        return list(visible)
    pool = visible if visible is not None else [str(i) for i in range(gpus_in_node)]
    if not pool:
        return []
    need = local_size * gpus_per_rank
    if len(pool) < need:
        shown = (
            f"CUDA_VISIBLE_DEVICES={','.join(visible)}"
            if visible is not None
            else "found by the driver"
        )
        raise ValueError(
            f"keras_mpfp16.bind_gpus: {local_size} ranks on this node with "
            f"{gpus_per_rank} GPU(s) each need {need} GPUs, but {len(pool)} are "
            f"visible ({shown}). Start at most {len(pool) // gpus_per_rank} ranks "
            "per node, or set CUDA_VISIBLE_DEVICES per rank yourself."
        )
    start = local_rank * gpus_per_rank
    return pool[start : start + gpus_per_rank]


def framework_gpus_initialized() -> str | None:
    """Which loaded framework has already set up its devices, or None.

    Reads only modules already imported. TensorFlow: its eager context
    exists and has listed its physical devices or started (the first
    operation, `tf.config.list_physical_devices`, building a model).
    PyTorch: `torch.cuda.is_initialized()`.
    """
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is not None:
        ctx = context.context_safe()
        if ctx is not None and (
            getattr(ctx, "_physical_devices", None) is not None
            or getattr(ctx, "_context_handle", None) is not None
        ):
            return "TensorFlow"
    torch_cuda = sys.modules.get("torch.cuda")
    if torch_cuda is not None and torch_cuda.is_initialized():
        return "PyTorch"
    return None


def _local_rank_and_size() -> tuple[int, int]:
    launch = launcher.detect()
    if launch is not None and launch.local_rank is not None and launch.local_size:
        return launch.local_rank, launch.local_size
    if launch is None:
        return 0, 1  # a process started alone
    # A launcher that does not announce local ranks: ask MPI.
    from keras_mpfp16.runtime import world

    return world.local_rank(), world.local_size()


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
            GPUs, so that the variable would have no effect.
        ValueError: if the node has fewer GPUs than its ranks need.

    Example:

    ```python
    import keras_mpfp16 as kmp
    kmp.bind_gpus()
    import keras  # build the model after this point
    ```
    """
    gpus_per_rank = _validate.positive_int("gpus_per_rank", gpus_per_rank)
    local_rank, local_size = _local_rank_and_size()
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted = select_devices(
        local_rank, local_size, parse_visible(current), node_gpus(), gpus_per_rank
    )
    if not wanted:
        return []
    value = ",".join(wanted)
    if value == current:
        return wanted
    late = framework_gpus_initialized()
    if late is not None:
        raise RuntimeError(
            f"keras_mpfp16.bind_gpus() came too late: {late} has already "
            "initialised its devices, so CUDA_VISIBLE_DEVICES (now "
            f"{current!r}, wanted {value!r} for local rank {local_rank}) would "
            "have no effect. Call kmp.bind_gpus() right after `import "
            "keras_mpfp16`, before any tensor operation, device query or model; "
            f"or set {ENV_VAR}=1; or let the launcher bind "
            "(`srun --gpus-per-task=1`)."
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    return wanted


def bind_requested() -> bool:
    """`KERAS_MPFP16_BIND_GPUS=1`: `import keras_mpfp16` calls `bind_gpus()`."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(
        f"{ENV_VAR}={value!r} is not understood; use 1 or 0 (or unset it)."
    )
