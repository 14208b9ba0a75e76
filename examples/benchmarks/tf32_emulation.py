"""TF32, emulated on a CPU: the matrix products of recurrent layers with their
float32 inputs rounded as an Ampere-or-later GPU rounds them.

On such GPUs TensorFlow (unless `enable_tensor_float_32_execution(False)`)
and JAX (default matmul precision) run a float32 matrix product with both
operands rounded to TF32: float32's 8-bit exponent, a 10-bit mantissa,
round to nearest even; products are accumulated in float32. This module
rounds the operands the same way before an ordinary float32 product, which
is the arithmetic of such a product up to the order of the float32
accumulation.

`emulated_tf32(sites, recurrent_rows)` patches `keras.ops.matmul` (the
function Keras's cells and keras_mpfp16's layers both call) while models are
built and traced inside it. Only products whose operands are both float32
are rounded (float16/bfloat16 products do not go through TF32). A product is
the *recurrent* one when its right operand has `recurrent_rows` rows (the
recurrent kernel is `(units, gates * units)`), otherwise the *input
projection* (`(features, gates * units)`): keep `features != units`.

    with emulated_tf32(("input", "recurrent"), recurrent_rows=32):
        model = build(...)   # build and run inside the context
        y = model.predict_on_batch(x)

TensorFlow backend only (it uses `tf.bitcast`).
"""

from __future__ import annotations

import contextlib

import keras
import keras.src.ops as _src_ops
import numpy as np

SITES = ("input", "recurrent")

# TF32 keeps 10 of float32's 23 mantissa bits: 13 are dropped.
_DROPPED_BITS = 13


def round_to_tf32_numpy(x: np.ndarray) -> np.ndarray:
    """Reference rounding in numpy: float32 -> TF32 (as float32), RNE."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> _DROPPED_BITS) & 1
    rounded = (bits + (1 << (_DROPPED_BITS - 1)) - 1 + lsb) & ~np.uint64(
        (1 << _DROPPED_BITS) - 1
    )
    return rounded.astype(np.uint32).view(np.float32)


def round_to_tf32(x):
    """`x` (float32 tensor) rounded to TF32, round to nearest even, as float32.

    Finite values only (the study's are); an overflow past float32's largest
    TF32 value becomes infinity, as on the GPU.
    """
    import tensorflow as tf

    bits = tf.bitcast(tf.convert_to_tensor(x, tf.float32), tf.uint32)
    lsb = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, _DROPPED_BITS), 1)
    bits = bits + tf.constant((1 << (_DROPPED_BITS - 1)) - 1, tf.uint32) + lsb
    bits = tf.bitwise.bitwise_and(
        bits, tf.constant(0xFFFFFFFF ^ ((1 << _DROPPED_BITS) - 1), tf.uint32)
    )
    return tf.bitcast(bits, tf.float32)


@contextlib.contextmanager
def emulated_tf32(sites=SITES, recurrent_rows: int | None = None):
    """Rounds the float32 operands of the chosen products to TF32.

    Args:
        sites: Any of `"input"` (the input projection `x @ kernel`) and
            `"recurrent"` (`h @ recurrent_kernel`); empty: no change.
        recurrent_rows: The layer's `units`: a product whose right operand
            has this many rows is the recurrent one.

    Yields:
        A dict counting the products rounded per site (at trace time).
    """
    sites = tuple(sites)
    for site in sites:
        if site not in SITES:
            raise ValueError(f"TF32 site must be one of {SITES}; received {site!r}")
    if sites and recurrent_rows is None:
        raise ValueError("emulated_tf32 needs recurrent_rows (the layer's units)")
    original = _src_ops.matmul
    counts = {site: 0 for site in SITES}

    def matmul(x1, x2):
        x1 = keras.ops.convert_to_tensor(x1)
        x2 = keras.ops.convert_to_tensor(x2)
        both_float32 = (
            keras.backend.standardize_dtype(x1.dtype) == "float32"
            and keras.backend.standardize_dtype(x2.dtype) == "float32"
        )
        if both_float32:
            site = "recurrent" if x2.shape[0] == recurrent_rows else "input"
            if site in sites:
                counts[site] += 1
                return original(round_to_tf32(x1), round_to_tf32(x2))
        return original(x1, x2)

    _src_ops.matmul = matmul
    keras.ops.matmul = matmul
    try:
        yield counts
    finally:
        _src_ops.matmul = original
        keras.ops.matmul = original
