"""CUDA-aware MPI detection and GPU buffer handling.

When the MPI library can read GPU memory ("CUDA-aware"), device buffers go to
MPI as they are (mpi4py understands `__cuda_array_interface__` and DLPack);
otherwise they are staged through host memory. Only CuPy is used to wrap
device memory, and only when a device array actually arrives, so CPU-only
installations never import it.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter

ENV_OVERRIDE = "KERAS_MPFP16_CUDA_AWARE"

# How many collectives ran on each path; examples/gpu_check.py prints it.
path_counts: Counter = Counter()

_detected: bool | None = None


def _loaded_libmpi_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return sorted(
                {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
            )
    except OSError:
        return []


def _query_library() -> bool:
    """Asks the loaded MPI library whether it was built with CUDA support."""
    from mpi4py import MPI  # noqa: F401  (loads libmpi into the process)

    for path in _loaded_libmpi_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("MPIX_Query_cuda_support", "MPIX_GPU_query_support"):
            fn = getattr(lib, symbol, None)
            if fn is None:
                continue
            if symbol == "MPIX_GPU_query_support":  # MPICH: (gpu_type, *is_supported)
                out = ctypes.c_int(0)
                if (
                    fn(ctypes.c_int(1), ctypes.byref(out)) == 0
                ):  # 1 = MPIX_GPU_SUPPORT_CUDA
                    return bool(out.value)
                continue
            # Open MPI: only meaningful when its CUDA component is present,
            # which it reports at run time.
            return bool(fn())
    return False


def cuda_aware() -> bool:
    """Whether collectives hand GPU buffers straight to MPI.

    The environment variable `KERAS_MPFP16_CUDA_AWARE` (`1`/`0`) overrides the
    detection, for MPI builds that do not report their CUDA support or to
    force host staging while debugging.

    Returns:
        True if the MPI library accepts device pointers.
    """
    global _detected
    override = os.environ.get(ENV_OVERRIDE, "").strip().lower()
    if override in ("1", "true", "yes", "on"):
        return True
    if override in ("0", "false", "no", "off"):
        return False
    if override:
        raise ValueError(
            f"{ENV_OVERRIDE}={override!r} is not understood; use 1 or 0 (or unset it)."
        )
    if _detected is None:
        try:
            _detected = _query_library()
        except Exception:  # a query failure must not break CPU training
            _detected = False
    return _detected


def is_device_array(x) -> bool:
    """True for arrays living in GPU memory (CuPy, JAX/torch on GPU via DLPack)."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] != 1  # 1 == kDLCPU
    except Exception:
        return False


def as_cupy(x):
    """Zero-copy CuPy view of a device array."""
    import cupy

    if hasattr(x, "__cuda_array_interface__"):
        return cupy.asarray(x)
    return cupy.from_dlpack(x)


def synchronize_device() -> None:
    """Waits for queued GPU work so MPI reads finished data."""
    import cupy

    cupy.cuda.get_current_stream().synchronize()
