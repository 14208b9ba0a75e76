"""Wire formats for gradient reduction.

`float32` uses MPI's own `Allreduce`. The 16-bit formats halve the bytes that
cross the network but never make MPI do 16-bit arithmetic (Open MPI's float16
sum runs ~8x slower per byte than float32 and accumulates in float16). Instead
the reduction is split the way a ring allreduce splits it:

1. `Alltoall` of 16-bit rows: rank r receives every rank's row r (for
   large rows at 3+ ranks on `ring.alltoall`'s schedule, no two ranks
   sending to each other at once).
2. Rank r (the row's *owner*) sums its rows in float32 and encodes the sum.
3. Allgather of the owners' 16-bit rows (around a ring for large rows at
   3+ ranks: `ring.py`).

(With `WIRE_SCHEDULE=ring`, from 3 ranks on, large rows take a ring instead
of steps 1-2: each rank adds its row to the running float32 sum it received
and passes the sum on in 16 bits; see `ring.py`.)

MPI only moves bytes, accumulation is float32, each output element is
computed by exactly one rank (so the result is bitwise identical on every
rank by construction), and the bytes sent per rank equal a ring allreduce's
at half the width.

The row format, shared by this numpy implementation (`allreduce_flat` for
numpy callers) and the TensorFlow bridge (`backend/tf_wire.py`, which encodes
and decodes inside the train step's graph, so only the owner's sum touches the
host):

    [exponent, flags, slot words..., values...]      (uint16 words)

* exponent (int16): float16 rows travel multiplied by 2**exponent, chosen
  per row so its largest magnitude lands at or below 2**15 -- small gradients
  are not flushed to zero and large ones do not overflow float16's 65504.
  bfloat16 has float32's range and travels unscaled (exponent 0).
* flags: bit 0 set when the row holds a NaN or Inf. Owners always set it
  for their sum; senders of float16 rows set it for their input.
* slot words: only in the first bucket's `Alltoall` of a train step: every
  rank's (epoch, step, ...) as int64 words, so the step check needs no MPI
  call of its own (every rank receives every rank's slots).
"""

from __future__ import annotations

import numpy as np

from keras_mpfp16 import _validate
from keras_mpfp16.runtime.mpi import pipeline, ring

# Two codecs, one format. The numpy codec below and the TensorFlow one in
# `backend/tf_wire.py` stay two implementations because they are written in
# two array languages: the TensorFlow one must run inside the compiled train
# step (graph ops on device tensors), this one on host arrays for numpy callers
# and without TensorFlow (runtime/ never imports a backend). Every fact about
# the format -- word positions, flag bits, slot layout, scaling rules, the
# float32 bit layout the exponents are read from -- is a constant of this
# module, read by both; tests/test_wire.py checks that the two produce the
# same words bit for bit (encode, decode, owner's sum), since ranks may mix
# them.

WIRE_DTYPES = ("float32", "float16", "bfloat16")

# Row layout: [exponent, flags, slot words..., values...] (uint16 words).
EXPONENT_WORD = 0  # int16 power of two the float16 values travel multiplied by
FLAGS_WORD = 1
HEADER_WORDS = 2  # exponent, flags
FLAG_NONFINITE = 1
# The float32 (IEEE 754 binary32) bits the exponents are read from and the
# exact powers of two are built from.
F32_MANTISSA_BITS = 23
F32_EXPONENT_BIAS = 127
F32_EXPONENT_MASK = 0xFF
F32_MANTISSA_MASK = 0x7FFFFF
# Scaling rules: float16 rows are scaled so their max lands at or below
# 2**FP16_TARGET_EXP, by at most 2**+-MAX_SHIFT.
FP16_TARGET_EXP = 15
MAX_SHIFT = 100
# The smallest float32 magnitude that rounds to infinity in bfloat16
# (bfloat16's largest finite value plus half a unit in the last place).
BF16_OVERFLOW = float(np.float32(3.3961514e38))


def validate_wire_dtype(wire_dtype: str, also: tuple[str, ...] = ()) -> str:
    """The wire's name (a dtype object gives its `.name`), if it is one of
    `WIRE_DTYPES` or `also` (e.g. the optimizer's `"auto"`); else a
    `ValueError` naming the allowed values. The one check of a wire name."""
    name = getattr(wire_dtype, "name", wire_dtype)
    allowed = (*WIRE_DTYPES, *also)
    if str(name) not in allowed:
        _validate.one_of("wire_dtype", name if also else wire_dtype, allowed)
    return str(name)


def numpy_wire_dtype(wire_dtype: str) -> np.dtype:
    if wire_dtype == "bfloat16":
        import ml_dtypes  # shipped with Keras; numpy has no bfloat16

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(wire_dtype)


def wire_bytes(num_elements: int, wire_dtype: str) -> int:
    """Bytes one rank contributes for `num_elements` gradients in `wire_dtype`."""
    return num_elements * wire_itemsize(wire_dtype)


def wire_itemsize(wire_dtype: str) -> int:
    """Bytes per gradient element on the wire (4 or 2)."""
    return 4 if wire_dtype == "float32" else 2


def chunk_length(length: int, n: int) -> int:
    """Elements per row when `length` elements are split over `n` owners."""
    return -(-length // n)


# -- step slots ----------------------------------------------------------------

# 16-bit wires: an int64 slot value travels as 4 little-endian uint16 words.
SLOT_WORDS_PER_VALUE = 4


def slot_words(values) -> np.ndarray:
    """int64 slot values -> the uint16 words that carry them (4 per value)."""
    return np.ascontiguousarray(np.asarray(values, dtype="<i8")).view("<u2")


def slots_from_words(words: np.ndarray) -> np.ndarray:
    """(ranks, 4*k) uint16 slot words -> (ranks, k) int64 table."""
    return np.ascontiguousarray(words).view("<i8").astype(np.int64)


# float32 slots: a value v >= -1 travels as two integer-valued float32s
# (v + SLOT_OFFSET = hi * 2**24 + lo), exact up to 2**48 and through a float32
# sum.
SLOT_SPLIT = 2**24
SLOT_OFFSET = 1  # the epoch is -1 where no callback reports epochs


def float_slots(values) -> np.ndarray:
    """int64 slot values -> float32 pairs (hi, lo), exact through an Allreduce."""
    v = np.asarray(values, dtype=np.int64) + SLOT_OFFSET
    return np.stack([v // SLOT_SPLIT, v % SLOT_SPLIT], axis=-1).astype(np.float32)


def slots_from_floats(pairs: np.ndarray, ranks: int) -> np.ndarray:
    """Inverse of `float_slots` for a reduced (ranks * k * 2,) float32 tail."""
    p = np.asarray(pairs, dtype=np.float64).reshape(ranks, -1, 2)
    return (p[..., 0] * SLOT_SPLIT + p[..., 1]).astype(np.int64) - SLOT_OFFSET


# -- the 16-bit row format (numpy) --------------------------------------------


def fp16_exponents(amax: np.ndarray) -> np.ndarray:
    """Per-row power-of-two exponent that brings the row's max to <= 2**15.

    Read from the float32 bits (exact for powers of two, unlike a floating
    log2); non-finite or zero rows get 0. The TensorFlow bridge computes the
    same integers in-graph.
    """
    amax = np.ascontiguousarray(amax, dtype=np.float32)
    bits = amax.view(np.int32)
    exponent = (bits >> F32_MANTISSA_BITS) & F32_EXPONENT_MASK
    ceil_log2 = exponent - F32_EXPONENT_BIAS + ((bits & F32_MANTISSA_MASK) != 0)
    shift = np.clip(FP16_TARGET_EXP - ceil_log2, -MAX_SHIFT, MAX_SHIFT)
    ok = np.isfinite(amax) & (amax > 0)
    return np.where(ok, shift, 0).astype(np.int32)


def pow2(exponent: np.ndarray) -> np.ndarray:
    """2.0**exponent as exact float32, for -126 <= exponent <= 127."""
    return (
        ((np.asarray(exponent, np.int32) + F32_EXPONENT_BIAS) << F32_MANTISSA_BITS)
        .astype(np.int32)
        .view(np.float32)
    )


def _row_max(rows: np.ndarray) -> np.ndarray:
    """max |x| per row without a temporary; NaN propagates."""
    if rows.shape[1] == 0:
        return np.zeros(rows.shape[0], np.float32)
    return np.maximum(rows.max(axis=1), -rows.min(axis=1))


def encode_rows(
    rows: np.ndarray, wire_dtype: str, slots: np.ndarray | None = None
) -> np.ndarray:
    """float32 rows -> uint16 rows `[exponent, flags, slots..., values...]`."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    r, c = rows.shape
    k = 0 if slots is None else len(slots)
    out = np.zeros((r, HEADER_WORDS + k + c), dtype=np.uint16)
    amax = _row_max(rows)
    bad = ~np.isfinite(amax)
    if wire_dtype == "float16":
        exp = fp16_exponents(amax)
        out[:, EXPONENT_WORD] = exp.astype(np.int16).view(np.uint16)
        scaled = rows * pow2(exp)[:, None]
        with np.errstate(over="ignore"):  # only non-finite rows (exponent 0) overflow
            out[:, HEADER_WORDS + k :] = scaled.astype(np.float16).view(np.uint16)
    else:
        bad |= amax >= BF16_OVERFLOW
        out[:, HEADER_WORDS + k :] = rows.astype(numpy_wire_dtype(wire_dtype)).view(
            np.uint16
        )
    out[:, FLAGS_WORD] = np.where(bad, FLAG_NONFINITE, 0)
    if k:
        out[:, HEADER_WORDS : HEADER_WORDS + k] = slots
    return out


def decode_rows(words: np.ndarray, wire_dtype: str, slot_count: int = 0) -> np.ndarray:
    """Inverse of `encode_rows`: float32 rows (slot words skipped)."""
    start = HEADER_WORDS + slot_count
    values = np.ascontiguousarray(words[:, start:]).view(numpy_wire_dtype(wire_dtype))
    out = values.astype(np.float32)
    if wire_dtype == "float16":
        out *= pow2(-words[:, EXPONENT_WORD].view(np.int16))[:, None]
    return out


def owner_sum(recv: np.ndarray, wire_dtype: str, slot_count: int = 0) -> np.ndarray:
    """The owner's step: float32 sum of the received rows, in rank order,
    encoded as one row (with its own exponent and non-finite flag)."""
    rows = decode_rows(recv, wire_dtype, slot_count)
    partial = rows[0].copy()
    for row in rows[1:]:
        partial += row
    mine = encode_rows(partial[None, :], wire_dtype)
    mine[:, FLAGS_WORD] |= np.bitwise_or.reduce(recv[:, FLAGS_WORD]) & FLAG_NONFINITE
    return mine


def lowp_allreduce_sum(comm, buf: np.ndarray, wire_dtype: str) -> np.ndarray:
    """Sums a float32 vector over `comm` with 16-bit transfers, float32 accumulation.

    Args:
        comm: mpi4py intra-communicator.
        buf: 1-D float32 array (this rank's contribution).
        wire_dtype: "float16" or "bfloat16".

    Returns:
        A new float32 array holding the sum, identical on every rank.
    """
    n = comm.Get_size()
    length = buf.shape[0]
    chunk = chunk_length(length, n)
    segments, seg = pipeline.plan(length, n)
    if (
        segments > 1
        and ring.reduce_scatter_schedule(n, (HEADER_WORDS + chunk) * 2) != "ring"
    ):
        return _pipelined_sum(comm, buf, wire_dtype, segments, seg)
    padded = np.zeros((n, chunk), dtype=np.float32)
    padded.reshape(-1)[:length] = buf
    send = encode_rows(padded, wire_dtype)
    if ring.reduce_scatter_schedule(n, send.shape[1] * 2) == "ring":
        mine = ring.reduce_scatter(
            comm,
            own_row=lambda j: send[j : j + 1],
            add=lambda got, j: owner_sum(
                np.concatenate([got, send[j : j + 1]]), wire_dtype
            ),
            empty_row=lambda: np.empty((1, send.shape[1]), np.uint16),
            buffer=lambda row: row,
        )
    else:
        recv = np.empty_like(send)
        # MPI sees raw 16-bit words: it moves them and never interprets them.
        ring.alltoall(comm, send, recv, send.shape[1] * 2)
        mine = owner_sum(recv, wire_dtype)
    gathered = np.empty((n, mine.shape[1]), dtype=np.uint16)
    ring.allgather(comm, mine, gathered, mine.nbytes)
    return decode_rows(gathered, wire_dtype).reshape(-1)[:length]


def _pipelined_sum(comm, buf, wire_dtype, segments: int, seg: int) -> np.ndarray:
    """`lowp_allreduce_sum` on the pipelined schedule (`pipeline.py`): the
    vector as `segments` x N rows of `seg` values, each row encoded on its
    own, segment s's rows on the wire while segment s-1 is summed."""
    n = comm.Get_size()
    length = buf.shape[0]
    padded = np.zeros((segments * n, seg), dtype=np.float32)
    padded.reshape(-1)[:length] = buf
    send = encode_rows(padded, wire_dtype).reshape(segments, n, -1)
    gathered = np.empty((segments, n, HEADER_WORDS + seg), dtype=np.uint16)
    pipeline.reduce_segments(
        comm, send, lambda recv, s: owner_sum(recv, wire_dtype), gathered
    )
    rows = gathered.reshape(segments * n, -1)
    return decode_rows(rows, wire_dtype).reshape(-1)[:length]
