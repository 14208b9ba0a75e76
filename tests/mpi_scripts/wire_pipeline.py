"""The pipelined 16-bit reduction (`WIRE_PIPELINE_SEGMENT`) on a real MPI job.

Per 16-bit wire, with the pipeline off and with segments small enough that
every bucket is cut into several: accuracy against a float64 reference
(tiny values float16 would flush, sums float16 would overflow), bitwise
agreement between ranks, the in-step (TensorFlow) codec bit for bit the
numpy codec's on the same vector, bfloat16 bit for bit the unpipelined
result, the calls that ran (Ialltoall/Iallgather per segment, no blocking
Alltoall), non-finite detection and the step check carried by the first
segment. Prints one JSON line per rank.
"""

import json
import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from call_counter import counting, gradient_calls  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16 import runtime  # noqa: E402
from keras_mpfp16.backend import tf_gradients as tg  # noqa: E402

runtime.init()
rank, n = runtime.rank(), runtime.size()
out = {"rank": rank, "size": n}


def reduce(values, wire, step=0, bucket_bytes=2**24):
    shapes = [tuple(int(d) for d in v.shape) for v in values]

    @tf.function
    def f(*flat):
        return tg.allreduce_gradients(
            list(flat),
            shapes=shapes,
            op="sum",
            wire_dtype=wire,
            bucket_bytes=bucket_bytes,
            step=tf.constant(step, tf.int64),
        )

    res, finite = f(*values)
    return [r.numpy() for r in res], bool(finite)


def crc_same(arrays) -> bool:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1), crc)
    return len(set(runtime.allgather_object(crc))) == 1


def error_line(exc) -> str:
    lines = str(exc).splitlines()
    return next((ln.strip() for ln in lines if "keras_mpfp16:" in ln), lines[0])[:800]


rng = np.random.default_rng(7 + rank)
shapes = [(300, 70), (5003,), (13,), (64, 33)]
grads = [
    (rng.normal(size=s) * 10.0 ** rng.integers(-6, 3)).astype(np.float32)
    for s in shapes
]
# Each 48 KB: a bucket of its own (40 KB buckets), so no 16-bit row holds
# both (a row's one exponent cannot serve 3e-9 and 4e4 at once, pipelined
# or not).
ones = np.linspace(1.0, 2.0, 12000)
tiny = (ones * 3e-9 * (rank + 1)).astype(np.float32)
huge = (ones * 4e4 * (rank + 1)).astype(np.float32)
values = [*grads, tiny, huge]
truth = [runtime.allreduce(v.astype(np.float64), op="sum") for v in values]
vector = np.concatenate([v.reshape(-1) for v in values])
vector_truth = runtime.allreduce(vector.astype(np.float64), op="sum")


def max_rel(got, want):
    return float(np.max(np.abs(got - want) / np.abs(want)))


def rel_err(got, want):
    num = sum(float(np.sum((g - w) ** 2)) for g, w in zip(got, want))
    return (num / sum(float(np.sum(w**2)) for w in want)) ** 0.5


results = {}
for wire in ("float16", "bfloat16"):
    for segment in (0, 1000):
        kmp.config.set("WIRE_PIPELINE_SEGMENT", segment)
        key = f"{wire}_{segment}"
        with counting() as calls:
            got, finite = reduce(values, wire, bucket_bytes=40_000)
        counted = gradient_calls(calls)
        out[f"{key}_ialltoall"] = counted.get("Ialltoall", 0)
        out[f"{key}_iallgather"] = counted.get("Iallgather", 0)
        out[f"{key}_alltoall"] = counted.get("Alltoall", 0)
        out[f"{key}_finite"] = finite
        out[f"{key}_identical"] = crc_same(got)
        out[f"{key}_rel_err"] = rel_err(got[:4], truth[:4])
        out[f"{key}_tiny"] = max_rel(got[4], truth[4])
        out[f"{key}_huge"] = max_rel(got[5], truth[5])
        results[key] = got
        # One bucket: the in-step codec against the numpy codec, same vector.
        (one_tf,), _ = reduce([vector], wire)
        one_np = runtime.allreduce_flat(vector, op="sum", wire_dtype=wire)
        out[f"{key}_numpy_equal"] = bool(np.array_equal(one_tf, one_np))
        out[f"{key}_numpy_identical"] = crc_same([one_np])
        out[f"{key}_numpy_rel_err"] = rel_err([one_np], [vector_truth])
        # One rank's NaN reaches every rank's finite flag.
        bad = [g.copy() for g in values]
        if rank == n - 1:
            bad[0][5, 5] = np.nan
        _, out[f"{key}_nan_finite"] = reduce(bad, wire, bucket_bytes=40_000)
        # The step check rides in the first segment's rows.
        try:
            reduce(values, wire, step=10 + (rank == 1), bucket_bytes=40_000)
            out[f"{key}_step_error"] = None
        except Exception as e:  # raised inside the step, on every rank
            out[f"{key}_step_error"] = error_line(e)
    out[f"{wire}_same_as_unpipelined"] = all(
        np.array_equal(a, b)
        for a, b in zip(results[f"{wire}_0"], results[f"{wire}_1000"])
    )
kmp.config.set("WIRE_PIPELINE_SEGMENT", 0)
print(json.dumps(out), flush=True)
