"""One GPU per local rank: which devices, from the launcher's variables.

The device choice (`select_devices`) and setting `CUDA_VISIBLE_DEVICES`
(`bind`); which physical GPUs a process can use (`gpu_identities`: UUID and
PCI bus id, asked of the CUDA driver, for the doctor's sharing check). Whether it comes too late - a framework has already set up its
devices - is asked of the backend layer (`keras_mpfp16.backend.devices`,
where the public `kmp.bind_gpus` lives): this module imports no framework.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

from keras_mpfp16 import _settings as env
from keras_mpfp16 import _validate
from keras_mpfp16.runtime.process import launcher_env as launcher

ENV_VAR = env.setting("BIND_GPUS").name


def node_gpus() -> int:
    """NVIDIA GPUs in this machine, from the driver (no CUDA initialisation)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _load_cuda_driver():
    return ctypes.CDLL("libcuda.so.1")


# Opens the CUDA driver library; a seam for tests (a fake driver).
cuda_driver: Callable[[], object] = _load_cuda_driver

_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100


def _uuid_text(raw: bytes) -> str:
    """16 bytes as `nvidia-smi` writes a GPU's UUID (`GPU-8-4-4-4-12`)."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_identities() -> list[dict[str, str]] | None:
    """The physical GPUs this process can use, in CUDA's order.

    Asked of the CUDA driver (`cuDeviceGetUuid`, `cuDeviceGetPCIBusId`), so
    it honours `CUDA_VISIBLE_DEVICES` and the device cgroup a launcher put
    the process in: under `srun --gpus-per-task=1` every task sees
    `CUDA_VISIBLE_DEVICES=0`, and this names the one GPU each really has.
    The first entry is the GPU a framework computes on by default.

    Returns:
        `[{"uuid": "GPU-...", "pci_bus_id": "00000000:3B:00.0"}, ...]` (`[]`
        when every GPU is hidden), or None when the driver cannot be asked
        (no NVIDIA driver, or an error).
    """
    try:
        lib = cuda_driver()
    except OSError:
        return None
    status = lib.cuInit(0)
    if status == _CUDA_ERROR_NO_DEVICE:
        return []
    count = ctypes.c_int(0)
    if status != _CUDA_SUCCESS or lib.cuDeviceGetCount(ctypes.byref(count)):
        return None
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(
        lib, "cuDeviceGetUuid", None
    )
    found = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(device), ordinal):
            return None
        one: dict[str, str] = {}
        raw = (ctypes.c_ubyte * 16)()
        if get_uuid is not None and get_uuid(raw, device) == _CUDA_SUCCESS:
            one["uuid"] = _uuid_text(bytes(raw))
        bus = ctypes.create_string_buffer(64)
        if lib.cuDeviceGetPCIBusId(bus, ctypes.c_int(64), device) == _CUDA_SUCCESS:
            one["pci_bus_id"] = bus.value.decode()
        if not one:
            return None
        found.append(one)
    return found


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


def _local_rank_and_size(
    ask_mpi: Callable[[], tuple[int, int]],
) -> tuple[int, int]:
    launch = launcher.detect()
    if launch is not None and launch.local_rank is not None and launch.local_size:
        return launch.local_rank, launch.local_size
    if launch is None:
        return 0, 1  # a process started alone
    # A launcher that does not announce local ranks: ask MPI.
    return ask_mpi()


def bind(
    gpus_per_rank: int,
    framework_initialized: Callable[[], str | None],
    ask_mpi: Callable[[], tuple[int, int]],
) -> list[str]:
    """Sets `CUDA_VISIBLE_DEVICES` for this local rank (see `kmp.bind_gpus`).

    Args:
        gpus_per_rank: Devices per rank.
        framework_initialized: Returns the name of a framework that has
            already set up its devices, or None; supplied by the backend
            layer (this module imports no framework).
        ask_mpi: Returns `(local rank, local size)` from MPI, for a launcher
            that does not announce them; supplied by the caller (this module,
            below the MPI layer, imports no MPI).

    Returns:
        The devices now in `CUDA_VISIBLE_DEVICES` (`[]` without GPUs).
    """
    gpus_per_rank = _validate.positive_int("gpus_per_rank", gpus_per_rank)
    local_rank, local_size = _local_rank_and_size(ask_mpi)
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted = select_devices(
        local_rank, local_size, parse_visible(current), node_gpus(), gpus_per_rank
    )
    if not wanted:
        return []
    value = ",".join(wanted)
    if value == current:
        return wanted
    late = framework_initialized()
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
    bound["CUDA_VISIBLE_DEVICES"] = value
    return wanted


# What `bind` set in this process (the patch registry lists it).
bound: dict[str, str] = {}


def bind_requested() -> bool:
    """`KERAS_MPFP16_BIND_GPUS=1`: `import keras_mpfp16` calls `bind_gpus()`."""
    return env.get("BIND_GPUS")
