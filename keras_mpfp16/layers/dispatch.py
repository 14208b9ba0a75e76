"""Which code runs a mixed-precision recurrent layer's recurrence, and why.

Four paths (`PATHS`):

- `"keras"`: a float32/float64 compute dtype; Keras's layer runs unchanged
  (cuDNN by Keras's own rules).
- `"loop"`: the float32-carry loop (`recurrent.py`), the default under a
  16-bit compute dtype.
- `"cudnn-float32"`: under a 16-bit compute dtype on a TensorFlow GPU, when
  the arguments are cuDNN-eligible (Keras's rules, plus no recurrent
  dropout) and both products are float32 (`input_precision` and
  `recurrent_precision` `"float32"`, the defaults): the loop computes exactly
  a float32 LSTM/GRU, which Keras's fused cuDNN kernel computes too, far
  faster. It is handed float32 inputs, states and weights; outputs are cast
  to the compute dtype as on the loop.
- `"cudnn-compute"`: `use_cudnn=True` under a 16-bit compute dtype: Keras's
  fused path with the carry in the compute dtype, as documented before.

`choose_path` is the decision, a pure function of its arguments. Whether a
GPU is present is read through `gpu_query`, whether TF32 is on through
`tf32_query`, the GPUs' compute capability through `capability_query` and
this process's rank through `rank_query`: module attributes, so a test on a
CPU can set them.
"""

from __future__ import annotations

import logging

from keras import activations, ops
from keras import config as keras_config

from keras_mpfp16.backend import devices
from keras_mpfp16.runtime.mpi import world

PATHS = ("keras", "loop", "cudnn-float32", "cudnn-compute")

logger = logging.getLogger("keras_mpfp16.layers")


def _tensorflow_gpu_present() -> bool:
    seen = devices.framework_gpus()
    return bool(seen)


def _tensorflow_tf32_enabled() -> bool:
    try:
        import tensorflow as tf
    except ImportError:
        return False
    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def _tensorflow_compute_capability() -> tuple[int, int] | None:
    """The highest compute capability among TensorFlow's GPUs, or None when
    no GPU reports one."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    found = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            capability = tf.config.experimental.get_device_details(gpu).get(
                "compute_capability"
            )
        except (RuntimeError, ValueError):
            capability = None
        if capability:
            found.append(tuple(int(v) for v in capability))
    return max(found) if found else None


# The seams.
gpu_query = _tensorflow_gpu_present
tf32_query = _tensorflow_tf32_enabled
capability_query = _tensorflow_compute_capability
rank_query = world.launched_rank  # no MPI call

# TF32 exists from compute capability 8.0 on (Ampere); before it, TensorFlow
# may report TF32 "enabled" but the products are float32.
TF32_MIN_CAPABILITY = (8, 0)

_cached_gpu: bool | None = None
_cached_capability: tuple[int, int] | None | tuple[()] = ()  # (): not asked yet


def gpu_present() -> bool:
    """Whether the TensorFlow backend computes on a GPU (asked once)."""
    global _cached_gpu
    if keras_config.backend() != "tensorflow":
        return False
    if gpu_query is not _tensorflow_gpu_present:
        return bool(gpu_query())  # a test's seam: never cached
    if _cached_gpu is None:
        _cached_gpu = bool(gpu_query())
    return _cached_gpu


def cudnn_arguments_ok(layer) -> bool:
    """Keras's cuDNN rules for the layer's arguments, and no recurrent dropout."""
    cell = layer.cell
    ok = (
        cell.activation in (activations.tanh, ops.tanh)
        and cell.recurrent_activation in (activations.sigmoid, ops.sigmoid)
        and not layer.unroll
        and cell.use_bias
        and not cell.recurrent_dropout
    )
    if hasattr(cell, "reset_after"):  # GRU: cuDNN has reset_after=True only
        ok = ok and cell.reset_after
    return bool(ok)


def choose_path(
    *,
    half_compute: bool,
    requested: str | bool,
    input_precision: str,
    recurrent_precision: str,
    arguments_ok: bool,
    gpu: bool,
) -> str:
    """The path (one of `PATHS`) for a layer with these properties.

    Args:
        half_compute: The compute dtype is float16/bfloat16.
        requested: The `use_cudnn` argument (`"auto"`, True, False).
        input_precision: The layer's `input_precision`.
        recurrent_precision: The layer's `recurrent_precision`.
        arguments_ok: `cudnn_arguments_ok(layer)`.
        gpu: A TensorFlow GPU is present.
    """
    if not half_compute:
        return "keras"
    if requested is True:
        return "cudnn-compute"
    if requested is False:
        return "loop"
    float32_products = input_precision == "float32" and recurrent_precision == "float32"
    if gpu and arguments_ok and float32_products:
        return "cudnn-float32"
    return "loop"


_tf32_noticed = False

TF32_NOTICE = (
    "keras_mpfp16.layers: TensorFlow's TF32 is on, so this GPU rounds the "
    "inputs of the recurrent layers' float32 products (the default "
    "input_precision and recurrent_precision, on the loop and on cuDNN alike) "
    "to a 10-bit mantissa, as float16 does. Emulated on a CPU "
    "(docs/layers.md, 'TF32, emulated'), that left long-memory LSTMs "
    "(forget bias 8, T=4096) with up to 0.69x the drift of Keras's float16 "
    "layer instead of 0.001x; short memories stay well below. For float32 "
    "accuracy pass input_precision='tf32x3', recurrent_precision='tf32x3' "
    "(three TF32 products each, no cuDNN), or turn TF32 off for the whole "
    "process: tf.config.experimental.enable_tensor_float_32_execution(False) "
    "before building the model."
)


def tf32_applies() -> bool:
    """Whether TensorFlow's TF32 changes this process's float32 products: a
    GPU with compute capability 8.0 or later (Ampere on) and TF32 on. A GPU
    whose capability TensorFlow does not report counts as one with TF32."""
    if not gpu_present() or not tf32_query():
        return False
    global _cached_capability
    if capability_query is not _tensorflow_compute_capability:
        capability = capability_query()  # a test's seam: never cached
    else:
        if _cached_capability == ():
            _cached_capability = capability_query()
        capability = _cached_capability
    return capability is None or tuple(capability) >= TF32_MIN_CAPABILITY


def notice_tf32(path: str, input_precision: str, recurrent_precision: str) -> bool:
    """Logs `TF32_NOTICE` once per job where it applies; True if logged now.

    It applies on a GPU path or the loop on a GPU, with a float32 product,
    while TensorFlow's TF32 is on and the GPU has it (compute capability 8.0
    or later, `tf32_applies`). Every rank runs the same model, so only rank
    0 logs it (one copy per job, not one per rank); asked without an MPI
    call.
    """
    global _tf32_noticed
    if _tf32_noticed or path == "keras":
        return False
    if "float32" not in (input_precision, recurrent_precision):
        return False
    if rank_query() != 0:
        _tf32_noticed = True  # decided: never this rank
        return False
    if not tf32_applies():
        return False
    _tf32_noticed = True
    logger.warning(TF32_NOTICE)
    return True
