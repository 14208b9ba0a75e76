"""Which path gradient buffers take to MPI, and the buffers themselves.

Buffers reach MPI in one of two ways, chosen once per process
(`reduction_path()`): on the host through `tf.numpy_function` (numpy views)
and `tf.py_function` (DLPack views of CPU tensors), or, with a CUDA-aware
MPI and a visible GPU, as device memory through DLPack (no CuPy, no host
copy). This module holds that decision and the small buffer helpers both
paths use (aligned host arrays, DLPack views, finiteness checks, device
synchronisation).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_mpfp16.runtime.mpi import cuda

# -- which path buffers take to MPI (decided once) ---------------------------------

_path: dict | None = None


def reduction_path() -> dict:
    """How gradient buffers reach MPI in this process, decided once.

    `"device"`: tensors are handed to MPI where they live, through DLPack
    (GPU memory needs a CUDA-aware MPI). Chosen when MPI reports CUDA support
    and TensorFlow sees a GPU, or when `KERAS_MPFP16_CUDA_AWARE=1` forces it
    (which on a CPU-only machine exercises the same code on host memory).
    `"host"`: buffers are staged through host memory.

    Returns:
        `{"path": "device" | "host", "reason": str, "gpus": int}`.
    """
    global _path
    if _path is None:
        aware, why = cuda.detection()
        forced = why.startswith(cuda.ENV_OVERRIDE)
        gpus = len(tf.config.list_logical_devices("GPU"))
        if aware and (forced or gpus):
            path = "device"
            reason = (
                f"forced by {why}"
                if forced
                else f"CUDA-aware MPI ({why}) and {gpus} GPU(s) visible to TensorFlow"
            )
        else:
            path = "host"
            if forced:
                reason = f"forced by {why}"
            elif not aware:
                reason = f"MPI does not report CUDA support ({why})"
            else:
                reason = f"MPI is CUDA-aware ({why}) but TensorFlow sees no GPU"
        _path = {"path": path, "reason": reason, "gpus": gpus}
    return dict(_path)


def _reset_reduction_path() -> None:
    """Forget the decision (tests change KERAS_MPFP16_CUDA_AWARE)."""
    global _path
    _path = None


# -- host buffers (numpy_function) ------------------------------------------------------


def aligned_empty(n: int) -> np.ndarray:
    """float32 array on a 64-byte boundary.

    TensorFlow adopts an aligned array returned from numpy_function as the
    output tensor's memory instead of copying it: one pass over the bucket
    saved. (It also means a returned buffer must never be reused.)
    """
    raw = np.empty(n * 4 + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + n * 4].view(np.float32)


def aligned_words(rows: int, cols: int) -> np.ndarray:
    """(rows, cols) uint16 array on a 64-byte boundary (see `aligned_empty`)."""
    raw = np.empty(rows * cols * 2 + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + rows * cols * 2].view(np.uint16).reshape(rows, cols)


def host_tensor(array: np.ndarray):
    """A CPU tensor over `array`'s memory (DLPack, no copy; ~3 us where an
    eager op costs 100s of us on a loaded core). `array` must be 64-byte
    aligned and never written again: the tensor keeps it alive."""
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def host_finite(x: np.ndarray) -> np.bool_:
    """All finite? Two read passes, no temporary (NaN propagates through min/max)."""
    if x.size == 0:
        return np.bool_(True)
    return np.bool_(np.isfinite(x.min()) and np.isfinite(x.max()))


def graph_finite(x):
    """All finite? In the graph: two reductions (NaN propagates through min/max)."""
    if x.shape.num_elements() == 0:
        return tf.constant(True)
    return tf.logical_and(
        tf.math.is_finite(tf.reduce_max(x)), tf.math.is_finite(tf.reduce_min(x))
    )


# -- DLPack buffers (py_function) -------------------------------------------------------


def on_gpu(tensor) -> bool:
    """For concrete (eager) tensors only: a traced tensor's device is often ''."""
    return "GPU" in (tensor.device or "").upper()


def dlpack_buffer(tensor) -> cuda.DLPackBuffer:
    """An mpi4py buffer over `tensor`'s memory, where it lives (no copy)."""
    return cuda.DLPackBuffer(tf.experimental.dlpack.to_dlpack(tensor))


def sync_device(tensor) -> None:
    """GPU kernels run asynchronously: wait for them before MPI reads memory."""
    if on_gpu(tensor):
        tf.test.experimental.sync_devices()


def empty_like_device(shape, dtype, like):
    """An uninitialised tensor of `shape` and `dtype` on `like`'s device."""
    with tf.device(like.device):
        return tf.raw_ops.Empty(shape=shape, dtype=dtype, init=False)
