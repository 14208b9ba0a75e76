"""CUDA-aware MPI detection and device buffers for MPI.

When the MPI library can read GPU memory ("CUDA-aware"), device buffers go to
MPI as they are; otherwise they are staged through host memory. Buffers reach
mpi4py through DLPack (`DLPackBuffer`), which mpi4py 4 reads for host and
device memory alike -- no array library is needed for that. CuPy is used only
by the numpy-level collectives when the caller hands them a CuPy (or other
GPU) array.
"""

from __future__ import annotations

import ctypes
import warnings
from collections import Counter

from keras_mpfp16 import _settings as env

ENV_OVERRIDE = env.setting("CUDA_AWARE").name

# How many gradient collectives ran on each path: "device" (GPU memory handed
# to MPI), "staged" (GPU tensors copied to the host first), "host" (host
# memory); "dlpack" counts the buffers that reached MPI through DLPack.
# examples/gpu_check.py prints it.
path_counts: Counter = Counter()

_detected: tuple[bool, str] | None = None

# DLPack device types (dlpack.h).
KDL_CPU = 1
KDL_CUDA = 2


def _loaded_libmpi_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return sorted(
                {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
            )
    except OSError:
        return []


# `MPIX_GPU_query_support(gpu_type, &is_supported)`'s first argument, as the
# MPIs' own headers define it: MPICH's mpi.h (5.0.2 from PyPI) and Intel
# MPI's (2021.19, `impi-devel`) both say `MPIX_GPU_SUPPORT_CUDA (0)`,
# `MPIX_GPU_SUPPORT_ZE (1)`, MPICH's `MPIX_GPU_SUPPORT_HIP (2)`. Open MPI's
# mpi-ext.h (5.0.x) has no such call: `MPIX_Query_cuda_support(void)`
# (mpiext_cuda_c.h). tests/test_runtime.py reads the installed MPI's header
# and checks these.
MPIX_GPU_SUPPORT_CUDA = 0
MPIX_GPU_SUPPORT_ZE = 1

# The queries, in the order asked: the CUDA-only call first (Open MPI; MPICH
# >= 4.1 and Intel MPI export it too), then MPICH's generic one (all MPICH
# 4.x builds).
QUERIES = ("MPIX_Query_cuda_support", "MPIX_GPU_query_support")


def _query_library(
    paths: list[str] | None = None, load=ctypes.CDLL
) -> tuple[bool, str]:
    """Asks the loaded MPI library whether it was built with CUDA support.

    Args:
        paths: The libmpi files to ask (default: those loaded in this process).
        load: Opens one (`ctypes.CDLL`); a seam for tests.
    """
    if paths is None:
        from mpi4py import MPI  # noqa: F401  (loads libmpi into the process)

        paths = _loaded_libmpi_paths()
    for path in paths:
        try:
            lib = load(path)
        except OSError:
            continue
        for symbol in QUERIES:
            fn = getattr(lib, symbol, None)
            if fn is None:
                continue
            if symbol == "MPIX_GPU_query_support":  # MPICH: (gpu_type, *is_supported)
                out = ctypes.c_int(0)
                if fn(ctypes.c_int(MPIX_GPU_SUPPORT_CUDA), ctypes.byref(out)) == 0:
                    return (
                        bool(out.value),
                        f"{symbol}(MPIX_GPU_SUPPORT_CUDA) of {path}: {out.value}",
                    )
                continue
            # Open MPI: only meaningful when its CUDA component is present,
            # which it reports at run time.
            value = fn()
            return bool(value), f"{symbol}() of {path} returned {value}"
    if not paths:
        return False, "no libmpi found among the loaded libraries"
    return False, f"{', '.join(paths)} exports no CUDA-support query"


def detection() -> tuple[bool, str]:
    """Whether MPI takes GPU buffers, and why we think so (cached).

    Returns:
        `(cuda_aware, reason)`. A failing query counts as "not CUDA-aware"
        and is reported once with a warning naming the error.
    """
    global _detected
    override = env.get("CUDA_AWARE")
    if override is not None:
        return override, env.source("CUDA_AWARE")  # starts with ENV_OVERRIDE
    if _detected is None:
        try:
            _detected = _query_library()
        except Exception as exc:  # a query failure must not break CPU training
            reason = f"the CUDA-support query failed ({type(exc).__name__}: {exc})"
            warnings.warn(
                f"keras_mpfp16: {reason}; gradients are staged through host "
                f"memory. Set {ENV_OVERRIDE}=1 if your MPI is CUDA-aware.",
                RuntimeWarning,
                stacklevel=2,
            )
            _detected = (False, reason)
    return _detected


def cuda_aware() -> bool:
    """Whether collectives hand GPU buffers straight to MPI.

    The environment variable `KERAS_MPFP16_CUDA_AWARE` (`1`/`0`) overrides the
    detection, for MPI builds that do not report their CUDA support or to
    force host staging while debugging.

    Returns:
        True if the MPI library accepts device pointers.
    """
    return detection()[0]


# -- DLPack buffers for mpi4py --------------------------------------------------

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_device(capsule) -> tuple[int, int]:
    """(DLPack device type, device id) of a legacy `"dltensor"` capsule."""
    pointer = _get_pointer(capsule, b"dltensor")
    # DLManagedTensor starts with DLTensor {void *data; DLDevice device; ...}.
    offset = ctypes.sizeof(ctypes.c_void_p)
    device_type = ctypes.c_int32.from_address(pointer + offset).value
    device_id = ctypes.c_int32.from_address(pointer + offset + 4).value
    return device_type, device_id


class DLPackBuffer:
    """A DLPack capsule dressed as an array mpi4py accepts as a buffer.

    mpi4py (>= 4) reads `__dlpack_device__` and `__dlpack__` and hands the
    memory to MPI as it is: host memory for a CPU tensor, device memory for a
    GPU tensor (which needs a CUDA-aware MPI). The capsule keeps the producer's
    tensor alive while MPI uses it.

    Args:
        capsule: A legacy (unversioned) DLPack capsule, e.g. from
            `tf.experimental.dlpack.to_dlpack`.
    """

    __slots__ = ("_capsule", "_device")

    def __init__(self, capsule):
        self._capsule = capsule
        self._device = capsule_device(capsule)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    # No **kwargs on purpose: mpi4py first asks for a versioned capsule
    # (`max_version=`), and a TypeError tells it to take the legacy one.
    def __dlpack__(self, stream=None):
        return self._capsule

    @property
    def on_device(self) -> bool:
        return self._device[0] != KDL_CPU


# -- device arrays handed to the numpy-level collectives -------------------------


def is_device_array(x) -> bool:
    """True for arrays living in GPU memory (CuPy, JAX/torch on GPU via DLPack)."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] != KDL_CPU
    except Exception:
        return False


_CUPY_HINT = (
    "keras_mpfp16 reduces GPU arrays given to its numpy-level collectives "
    "(kmp.allreduce and friends) with CuPy, which is not installed. Install the "
    "CuPy wheel matching your CUDA (e.g. `pip install cupy-cuda12x`) or pass "
    "host (numpy) arrays. The DistributedOptimizer's TensorFlow path does not "
    "need CuPy."
)


def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(f"{_CUPY_HINT} ({exc})") from exc
    return cupy


def as_cupy(x):
    """Zero-copy CuPy view of a device array."""
    cupy = _cupy()
    if hasattr(x, "__cuda_array_interface__"):
        return cupy.asarray(x)
    return cupy.from_dlpack(x)


def synchronize_device() -> None:
    """Waits for CuPy's queued GPU work so MPI reads finished data."""
    _cupy().cuda.get_current_stream().synchronize()
