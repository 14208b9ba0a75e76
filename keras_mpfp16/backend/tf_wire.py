"""The 16-bit wire's row format in TensorFlow ops (in-graph encode/decode).

The format is `runtime/wire.py`'s: `[exponent, flags, slot words...,
values...]` as uint16 words, with its scaling rules. Every constant and
layout fact used here is read from there, so the format is defined once.

Why a second codec: this one runs inside the compiled train step (graph ops,
on the device the gradients live on), while `runtime/wire.py`'s numpy codec
serves numpy callers (`allreduce_flat`) and must not import a backend. Ranks
may mix the two, so they must agree bit for bit: tests/test_wire.py compares
this encoder, decoder and owner's sum with the numpy ones.

Fused stages: the owner's sum and its re-encode run as one XLA-compiled
function (`jit_compile=True`; eager elsewhere, it still runs inline in the
reduction's py_function), and so does the train step's encode of buckets of
at least `FUSED_MIN_ELEMENTS` elements (nested in the step, which itself
stays uncompiled): the non-finite check, the scaling, the cast and the
header in one read of the float32 rows and one write of the words instead of
four kernels with a buffer each; the row maxima before it are TensorFlow's
own reductions (cheaper than XLA's, which are a separate pass over the rows
in any case). The train step's decode of such buckets is fused too: the
slice past the headers, the cast and the scaling in one pass. Same words and
values bit for bit (the scales are powers of two, so every product is exact;
only the cast and the owner's float32 sum round, in the same order).
Measured in examples/benchmarks/wire_codec.py (docs/benchmarks.md, "The
16-bit codec").
"""

from __future__ import annotations

import tensorflow as tf

from keras_mpfp16.runtime.mpi import wire

TF_WIRE_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16}

_H = wire.HEADER_WORDS
_EXP = wire.EXPONENT_WORD
_FLAGS = wire.FLAGS_WORD

# Buckets of at least this many elements encode in one fused (XLA) function;
# owners' sums of at least OWNER_FUSED_MIN_ELEMENTS (all: eager, the separate
# ops cost ~2 ms of dispatch even for small rows) sum and re-encode in one.
FUSED_MIN_ELEMENTS = 2**20
OWNER_FUSED_MIN_ELEMENTS = 0


def _fused(rows, threshold) -> bool:
    count = rows.shape.num_elements()
    return count is not None and count >= threshold


def pow2(exponent):
    """2.0**exponent (int32 tensor, -126..127) as exact float32."""
    return tf.bitcast(
        tf.bitwise.left_shift(
            exponent + wire.F32_EXPONENT_BIAS, wire.F32_MANTISSA_BITS
        ),
        tf.float32,
    )


def fp16_exponents(amax):
    """Per-row exponent that brings the row's max to <= 2**15 (`wire.fp16_exponents`)."""
    bits = tf.bitcast(amax, tf.int32)
    exponent = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(bits, wire.F32_MANTISSA_BITS), wire.F32_EXPONENT_MASK
    )
    inexact = tf.cast(
        tf.bitwise.bitwise_and(bits, wire.F32_MANTISSA_MASK) != 0, tf.int32
    )
    shift = tf.clip_by_value(
        wire.FP16_TARGET_EXP - (exponent - wire.F32_EXPONENT_BIAS + inexact),
        -wire.MAX_SHIFT,
        wire.MAX_SHIFT,
    )
    ok = tf.logical_and(tf.math.is_finite(amax), amax > 0)
    return tf.where(ok, shift, tf.zeros_like(shift))


def encode_rows(rows, wire_dtype: str, flag: bool, slots=None, force_flag=None):
    """float32 rows (R, c) -> uint16 rows [exponent, flags, slots..., values...].

    `flag`: compute the non-finite flag (always for float16, which needs the
    row maxima anyway; for bfloat16 only where asked: owners).
    """
    # (Tile has no uint16 kernel; int16 has the same bits.)
    slot16 = None if slots is None else tf.bitcast(slots, tf.int16)
    if _fused(rows, FUSED_MIN_ELEMENTS):
        if wire_dtype == "float16" or flag:
            # The row maxima by TensorFlow's reductions, the rest fused: XLA
            # makes the maxima a pass of their own anyway (no multi-output
            # fusion of a reduction with its consumers here), and
            # TensorFlow's is up to ~2x cheaper and propagates NaN, so the
            # non-finite check needs no sibling reduction (0.74-0.89x the
            # all-XLA encode: docs/benchmarks.md, "A cheaper 16-bit codec").
            amax = _row_amax(rows)
            return _encode_scaled_fused(
                rows, amax, wire_dtype, flag, slot16, force_flag
            )
        return _encode_fused(rows, wire_dtype, flag, slot16, force_flag)
    return _encode(rows, wire_dtype, flag, slot16, force_flag)


def _row_amax(rows):
    """Each row's largest magnitude; NaN where the row holds a NaN (TensorFlow's
    max and min propagate it; XLA's do not), infinite where it holds an Inf.

    Were a device's reduction ever to drop a NaN, the owner's sum still
    carries it (NaN plus anything is NaN) into the owner's own check, which
    is XLA's sibling reduction: the step is skipped all the same."""
    return tf.maximum(tf.reduce_max(rows, 1), -tf.reduce_min(rows, 1))


def _encode(rows, wire_dtype, flag, slot16, force_flag, fused=False, amax=None):
    r = rows.shape[0]
    zeros = tf.zeros([r], tf.uint16)
    bad = None
    if amax is not None:
        bad = tf.logical_not(tf.math.is_finite(amax))
    elif wire_dtype == "float16" or flag:
        amax = _row_amax(rows)
        if fused:
            # XLA's max does not propagate NaN, so the maxima cannot tell:
            # a sibling reduction (same pass over the rows) does.
            bad = tf.reduce_any(tf.logical_not(tf.math.is_finite(rows)), 1)
            amax = tf.where(bad, tf.constant(float("nan")), amax)
        else:
            bad = tf.logical_not(tf.math.is_finite(amax))
    if wire_dtype == "float16":
        exp = fp16_exponents(amax)
        values = tf.cast(rows * pow2(exp)[:, None], tf.float16)
        exp_words = tf.bitcast(tf.cast(exp, tf.int16), tf.uint16)
    else:
        values = tf.cast(rows, tf.bfloat16)
        exp_words = zeros
        if bad is not None:
            bad = tf.logical_or(bad, amax >= wire.BF16_OVERFLOW)
    if bad is not None and force_flag is not None:
        bad = tf.logical_or(bad, force_flag)
    flags = zeros if bad is None else tf.cast(bad, tf.uint16)
    header = [None] * _H
    header[_EXP], header[_FLAGS] = exp_words, flags
    pieces = [tf.stack(header, 1)]
    if slot16 is not None:
        tiled = tf.tile(slot16[None, :], [r, 1])
        pieces.append(tf.bitcast(tiled, tf.uint16))
    pieces.append(tf.bitcast(values, tf.uint16))
    return tf.concat(pieces, 1)


@tf.function(jit_compile=True, autograph=False)
def _encode_fused(rows, wire_dtype, flag, slot16, force_flag):
    return _encode(rows, wire_dtype, flag, slot16, force_flag, fused=True)


@tf.function(jit_compile=True, autograph=False)
def _encode_scaled_fused(rows, amax, wire_dtype, flag, slot16, force_flag):
    return _encode(rows, wire_dtype, flag, slot16, force_flag, fused=True, amax=amax)


def decode_rows(words, wire_dtype: str, scale: float):
    """uint16 rows [exponent, flags, values...] -> (flat float32, finite).

    The flat vector keeps the rows' padding at its end: callers split it off
    (a split is a pass they make anyway; a slice here would be another).
    Rows of at least `FUSED_MIN_ELEMENTS` words decode in one fused (XLA)
    function: the slice past the headers, the cast and the scaling in one
    pass instead of three.
    """
    if _fused(words, FUSED_MIN_ELEMENTS):
        return _decode_fused(words, wire_dtype, scale)
    return _decode(words, wire_dtype, scale)


def _decode(words, wire_dtype, scale):
    values = tf.cast(tf.bitcast(words[:, _H:], TF_WIRE_DTYPES[wire_dtype]), tf.float32)
    if wire_dtype == "float16":
        exp = tf.cast(tf.bitcast(words[:, _EXP], tf.int16), tf.int32)
        factor = pow2(-exp)
        if scale != 1.0:
            factor = factor * scale
        values = values * factor[:, None]
    elif scale != 1.0:
        values = values * scale
    flat = tf.reshape(values, [-1])
    flags = tf.bitwise.bitwise_and(words[:, _FLAGS], wire.FLAG_NONFINITE)
    return flat, tf.reduce_all(tf.equal(flags, 0))


@tf.function(jit_compile=True, autograph=False)
def _decode_fused(words, wire_dtype, scale):
    return _decode(words, wire_dtype, scale)


def owner_sum(recv, wire_dtype: str, slot_words: int):
    """The owner's step, in eager TensorFlow: float32 sum of the received rows,
    encoded as one row with its own exponent and non-finite flag.

    Eager ops, not a tf.function: called from a py_function, whose thread may
    be the rank's only inter-op thread, a nested function call would wait
    for that thread forever. Eager kernels run inline, and so does an
    XLA-compiled function (one launch kernel): large rows take the fused
    stage, which sums in rank order like `wire.owner_sum`.
    """
    if _fused(recv, OWNER_FUSED_MIN_ELEMENTS):
        return _owner_sum_fused(recv, wire_dtype, slot_words)
    values = tf.cast(
        tf.bitcast(recv[:, _H + slot_words :], TF_WIRE_DTYPES[wire_dtype]), tf.float32
    )
    if wire_dtype == "float16":
        exp = tf.cast(tf.bitcast(recv[:, _EXP], tf.int16), tf.int32)
        weights = pow2(-exp)
    else:
        weights = tf.ones([recv.shape[0]], tf.float32)
    # sum_r weight_r * row_r as one (1 x N) @ (N x c) product: a single read of
    # the rows (3-4x faster here than scaling, then reducing). The weights are
    # powers of two, so every product is exact; only the sum rounds.
    partial = tf.matmul(weights[None, :], values)[0]
    carried = tf.reduce_any(
        tf.not_equal(tf.bitwise.bitwise_and(recv[:, _FLAGS], wire.FLAG_NONFINITE), 0)
    )
    return encode_rows(partial[None, :], wire_dtype, flag=True, force_flag=carried)


def _owner_sum_rank_order(recv, wire_dtype, slot_words):
    """The fused owner's step: rows decoded and added in rank order (one
    loop, one read of the rows in XLA), then encoded in the same function."""
    values = tf.cast(
        tf.bitcast(recv[:, _H + slot_words :], TF_WIRE_DTYPES[wire_dtype]), tf.float32
    )
    if wire_dtype == "float16":
        weights = pow2(-tf.cast(tf.bitcast(recv[:, _EXP], tf.int16), tf.int32))
        partial = values[0] * weights[0]
        for i in range(1, recv.shape[0]):
            partial = partial + values[i] * weights[i]
    else:
        partial = values[0]
        for i in range(1, recv.shape[0]):
            partial = partial + values[i]
    carried = tf.reduce_any(
        tf.not_equal(tf.bitwise.bitwise_and(recv[:, _FLAGS], wire.FLAG_NONFINITE), 0)
    )
    return _encode(partial[None, :], wire_dtype, True, None, carried, fused=True)


_owner_sum_fused = tf.function(_owner_sum_rank_order, jit_compile=True, autograph=False)
