"""The in-step gradient reduction on a real MPI job.

Per wire dtype (float32, float16, bfloat16) and per buffer path (host, and
the DLPack path forced with KERAS_MPFP16_CUDA_AWARE=1, which on a CPU machine
hands host memory to MPI through DLPack): accuracy against a float64
reference, bitwise agreement between ranks and between paths, float16 sums
that would overflow, values float16 would flush, non-finite detection
(dense and sparse), the step check's errors, and the number of MPI calls a
Keras train step makes.

Prints one JSON line per rank.
"""

import json
import os
import sys
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from call_counter import counting, counting_crossings, gradient_calls  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16 import runtime  # noqa: E402
from keras_mpfp16.backend import tf_gradients as tg  # noqa: E402
from keras_mpfp16.backend import tf_path  # noqa: E402
from keras_mpfp16.runtime import progress  # noqa: E402
from keras_mpfp16.runtime.mpi import (  # noqa: E402
    collectives,  # noqa: E402
    cuda,
    ring,
)
from keras_mpfp16.runtime.mpi import wire as wire_codec  # noqa: E402

runtime.init()
rank, n = runtime.rank(), runtime.size()
WIRES = ("float32", "float16", "bfloat16")
out = {"rank": rank, "size": n}


def reduce(values, wire, step=0, bucket_bytes=2**20, sparse=None, op="sum"):
    """allreduce_gradients inside a tf.function; numpy results and finite."""
    shapes = [
        v.dense_shape if isinstance(v, tf.IndexedSlices) else v.shape for v in values
    ]
    shapes = [tuple(int(d) for d in s) for s in shapes]

    @tf.function
    def f(*flat):
        grads = list(tf.nest.pack_sequence_as(values, flat, expand_composites=True))
        return tg.allreduce_gradients(
            grads,
            shapes=shapes,
            op=op,
            wire_dtype=wire,
            bucket_bytes=bucket_bytes,
            step=tf.constant(step, tf.int64),
            sparse=sparse,
        )

    res, finite = f(*tf.nest.flatten(values, expand_composites=True))
    # A sparse gradient may come back as IndexedSlices: compare its sum.
    return [tf.convert_to_tensor(r).numpy() for r in res], bool(finite)


def error_line(exc) -> str:
    """The library's message out of TensorFlow's wrapping of a step error."""
    lines = str(exc).splitlines()
    return next((ln.strip() for ln in lines if "keras_mpfp16:" in ln), lines[0])[:800]


def same_on_all_ranks(arrays) -> bool:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1), crc)
    return len(set(runtime.allgather_object(crc))) == 1


def rel_err(got, want) -> float:
    num = sum(float(np.sum((g - w) ** 2)) for g, w in zip(got, want))
    den = sum(float(np.sum(w**2)) for w in want)
    return (num / den) ** 0.5


# -- accuracy, agreement, range -------------------------------------------------------

rng = np.random.default_rng(100 + rank)
shapes = [(300, 7), (1000,), (13,), (64, 33)]
grads = [
    (rng.normal(size=s) * 10.0 ** rng.integers(-6, 3)).astype(np.float32)
    for s in shapes
]
truth = [runtime.allreduce(g.astype(np.float64), op="sum") for g in grads]
ids = np.array([1, 5, 5, 9, 0, 5, 42 + rank], np.int32)
rows = rng.normal(size=(len(ids), 6)).astype(np.float32)
emb = tf.IndexedSlices(tf.constant(rows), tf.constant(ids), tf.constant([50, 6]))
emb_truth = runtime.allreduce(
    tf.convert_to_tensor(emb).numpy().astype(np.float64), op="sum"
)
ones = np.linspace(1.0, 2.0, 513)
tiny_truth = ones * 3e-9 * sum(range(1, n + 1))
huge_truth = ones * 40000.0 * sum(range(1, n + 1))  # float16 sums would overflow

results = {}
tiny = (ones * 3e-9 * (rank + 1)).astype(np.float32)
huge = (ones * 4e4 * (rank + 1)).astype(np.float32)
for path in ("host", "dlpack"):
    os.environ[cuda.ENV_OVERRIDE] = "1" if path == "dlpack" else "0"
    tf_path._reset_reduction_path()
    out[f"path_{path}"] = tf_path.reduction_path()["path"]
    before = cuda.path_counts["dlpack"]
    for wire in WIRES:
        # Small buckets: every tensor in a bucket of its own (several MPI
        # calls, the step slots in the first only; tiny and huge values each
        # get their own float16 scaling), sparse rows (float32 on every wire)
        # after them.
        got, finite = reduce([*grads, tiny, huge, emb], wire, bucket_bytes=2100)
        results[(path, wire)] = got
        key = f"{path}_{wire}"
        out[f"{key}_finite"] = finite
        out[f"{key}_identical"] = same_on_all_ranks(got)
        out[f"{key}_rel_err"] = rel_err(got[:4], truth)
        for label, got_v, want in (
            ("tiny", got[4], tiny_truth),
            ("huge", got[5], huge_truth),
        ):
            out[f"{key}_{label}_max_rel_err"] = float(
                np.max(np.abs(got_v - want) / want)
            )
        out[f"{key}_sparse_rel_err"] = rel_err(got[6:], [emb_truth])
        if path == "dlpack" and wire != "float32":
            continue  # the 16-bit code is the same on both paths on a CPU
        # Average folds 1/N into the decode; check it against sum / N.
        got_avg, _ = reduce(grads[:2], wire, op="average")
        out[f"{key}_average_rel_err"] = rel_err(got_avg, [t / n for t in truth[:2]])
        # A NaN/Inf on the last rank only: every rank must see finite == False,
        # from a dense bucket and from sparse rows alike.
        bad = grads[1].copy()
        if rank == n - 1:
            bad[17] = np.nan
        out[f"{key}_nan_dense_finite"] = reduce([grads[0], bad], wire)[1]
        bad_rows = rows.copy()
        if rank == n - 1:
            bad_rows[2, 3] = np.inf
        bad_emb = tf.IndexedSlices(tf.constant(bad_rows), emb.indices, emb.dense_shape)
        out[f"{key}_nan_sparse_finite"] = reduce(
            [grads[0], bad_emb], wire, sparse="sparse"
        )[1]
    out[f"{path}_dlpack_calls"] = cuda.path_counts["dlpack"] - before
# The device path needs no CuPy (issue 13: it used to import it on first use).
out["cupy_imported"] = "cupy" in sys.modules

for wire in WIRES:
    out[f"paths_bitwise_equal_{wire}"] = all(
        np.array_equal(a, b)
        for a, b in zip(results[("host", wire)], results[("dlpack", wire)])
    )

# Small 16-bit rows on the host take numpy between the two collectives
# (tf_gradients.HOST_NUMPY_MAX_ELEMENTS); with the threshold below every row
# they take eager TensorFlow and its XLA-fused owner's sum, as before: the
# same bits either way. numpy's owner_sum is counted to show which ran.
os.environ[cuda.ENV_OVERRIDE] = "0"
tf_path._reset_reduction_path()
_numpy_owner_sum, owner_calls = wire_codec.owner_sum, []


def counted_owner_sum(*args, **kwargs):
    owner_calls.append(1)
    return _numpy_owner_sum(*args, **kwargs)


wire_codec.owner_sum = counted_owner_sum
saved_numpy_max = tg.HOST_NUMPY_MAX_ELEMENTS
for wire_dtype in ("float16", "bfloat16"):
    for threshold in (saved_numpy_max, -1):
        tg.HOST_NUMPY_MAX_ELEMENTS = threshold
        del owner_calls[:]
        got, _ = reduce([*grads, tiny, huge, emb], wire_dtype, bucket_bytes=2100)
        key = "numpy" if threshold >= 0 else "eager"
        out[f"small_rows_{key}_owner_sums_{wire_dtype}"] = len(owner_calls)
        out[f"small_rows_{key}_equal_{wire_dtype}"] = all(
            np.array_equal(a, b) for a, b in zip(got, results[("host", wire_dtype)])
        )
tg.HOST_NUMPY_MAX_ELEMENTS = saved_numpy_max
wire_codec.owner_sum = _numpy_owner_sum

# The ring allgather (runtime/mpi/ring.py, used for large rows at 3+ ranks)
# moves the same bytes as MPI's Allgather: the 16-bit reductions again with
# every allgather forced around the ring (and the owner's sum kept on the
# Alltoall) must equal the results above bit for bit, on both buffer paths.
# The Sendrecv count shows the ring ran (none at 2 ranks, where an allgather
# is one exchange).
#
# Then the ring reduce-scatter (WIRE_SCHEDULE=ring): every rank identical,
# within the wire's tolerance of the float64 truth (tiny and huge values
# included), and bit for bit what the numpy codec's ring gives for the same
# vector (one bucket: the same rows on both sides).
saved_ring_min = ring.RING_MIN_BYTES
ring.RING_MIN_BYTES = 0
one_vector = np.concatenate([g.reshape(-1) for g in grads] + [tiny, huge])
for path in ("host", "dlpack"):
    os.environ[cuda.ENV_OVERRIDE] = "1" if path == "dlpack" else "0"
    tf_path._reset_reduction_path()
    for wire in ("float16", "bfloat16"):
        kmp.config.set("WIRE_SCHEDULE", "alltoall")
        with counting() as ring_calls:
            got, _ = reduce([*grads, tiny, huge, emb], wire, bucket_bytes=2100)
        out[f"ring_equal_{path}_{wire}"] = all(
            np.array_equal(a, b) for a, b in zip(got, results[(path, wire)])
        )
        out[f"ring_sendrecv_{path}_{wire}"] = gradient_calls(ring_calls).get(
            "Sendrecv", 0
        )
        key = f"rs_{path}_{wire}"
        for schedule in ("alltoall", "ring"):
            kmp.config.set("WIRE_SCHEDULE", schedule)
            with counting() as rs_calls:
                got, finite = reduce([*grads, tiny, huge, emb], wire, bucket_bytes=2100)
            (one_tf,), _ = reduce([one_vector], wire, bucket_bytes=2**24)
            one_np = collectives.allreduce_flat(one_vector, op="sum", wire_dtype=wire)
            out[f"{key}_{schedule}_numpy_equal"] = bool(np.array_equal(one_tf, one_np))
        out[f"{key}_sendrecv"] = gradient_calls(rs_calls).get("Sendrecv", 0)
        out[f"{key}_alltoall"] = gradient_calls(rs_calls).get("Alltoall", 0)
        out[f"{key}_finite"] = finite
        out[f"{key}_identical"] = same_on_all_ranks(got)
        out[f"{key}_rel_err"] = rel_err(got[:4], truth)
        out[f"{key}_tiny_max_rel_err"] = float(
            np.max(np.abs(got[4] - tiny_truth) / tiny_truth)
        )
        out[f"{key}_huge_max_rel_err"] = float(
            np.max(np.abs(got[5] - huge_truth) / huge_truth)
        )
        out[f"{key}_sparse_rel_err"] = rel_err(got[6:], [emb_truth])
        kmp.config.set("WIRE_SCHEDULE", "alltoall")
ring.RING_MIN_BYTES = saved_ring_min

# -- the step check, folded into the first bucket ------------------------------------------

for path in ("host", "dlpack"):
    os.environ[cuda.ENV_OVERRIDE] = "1" if path == "dlpack" else "0"
    tf_path._reset_reduction_path()
    for wire in WIRES if path == "host" else ("float32",):
        try:
            reduce(grads[:2], wire, step=10 + (rank == 1))
            out[f"step_error_{path}_{wire}"] = None
        except Exception as e:  # raised inside the step, on every rank
            out[f"step_error_{path}_{wire}"] = error_line(e)
        progress.set_epoch(rank)
        try:
            reduce(grads[:2], wire, step=10)
            out[f"epoch_error_{path}_{wire}"] = None
        except Exception as e:
            out[f"epoch_error_{path}_{wire}"] = error_line(e)
        progress.set_epoch(-1)
os.environ[cuda.ENV_OVERRIDE] = "0"
tf_path._reset_reduction_path()

# -- MPI calls per Keras train step ---------------------------------------------------------


def calls_per_step(model, x, y, wire, name, steps=4, batch=8):
    """The gradient reduction's MPI calls per train step; also records the
    step's crossings into Python per step in `out["crossings_..."]`."""
    model.compile(
        optimizer=kmp.DistributedOptimizer("sgd", wire_dtype=wire), loss="mse"
    )
    with counting_crossings() as crossings:
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # build, sync, trace
        crossings.clear()
        with counting() as calls:
            model.fit(
                x[: steps * batch], y[: steps * batch], batch_size=batch, verbose=0
            )
    out[f"crossings_{name}_{wire}"] = {k: v / steps for k, v in crossings.items()}
    return gradient_calls(calls, steps)


xr = np.random.default_rng(rank).normal(size=(32, 8)).astype("float32")
yr = xr[:, :1] * 2.0
tokens = np.random.default_rng(rank).integers(0, 5000, size=(32, 6))
for wire in WIRES:
    keras.utils.set_random_seed(rank)
    dense_model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)]
    )
    out[f"calls_dense_{wire}"] = calls_per_step(dense_model, xr, yr, wire, "dense")
    # An Embedding: one bucket (carrying the row counts) + one allgather.
    keras.utils.set_random_seed(rank)
    emb_model = keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(5000, 8),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    out[f"calls_embedding_{wire}"] = calls_per_step(
        emb_model, tokens, yr, wire, "embedding"
    )

runtime.barrier()
print(json.dumps(out), flush=True)
