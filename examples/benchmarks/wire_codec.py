"""The 16-bit wire's codec: cost per stage and numerics on real gradients.

    python examples/benchmarks/wire_codec.py --rounds 7 \\
        --out docs/benchmarks/wire_codec.json

Speed (one process, one intra- and one inter-op thread: one rank's core).
For each bucket size the benchmark models produce, one rank's share of the
16-bit reduction at np=2, stage by stage:

  encode  the train step's in-graph encode of the bucket (N rows)
  owner   the owner's sum of the N received rows and its re-encode (eager,
          as in the reduction's py_function)
  decode  the in-graph decode of the gathered rows

for three codecs, interleaved (every round runs each codec once, the order
rotating), medians of per-round times and per-round ratios:

  ops     the codec as it was: separate TensorFlow ops (forced by setting
          tf_wire's FUSED_MIN_ELEMENTS and OWNER_FUSED_MIN_ELEMENTS to 2**62)
  xla     the codec until 2026-12-06: as `fused`, but the encode's row
          maxima inside its XLA function (with a sibling non-finite
          reduction) and the decode TensorFlow's separate ops
  fused   the shipped codec: same format; the owner's sum and re-encode one
          XLA-compiled function; from 2**20 elements on the encode one XLA
          function after TensorFlow's row maxima, the decode one XLA function
  cast    a plain float16 cast (no exponent, no flag: Horovod's
          Compression.fp16), encode / float32 sum / decode

Numerics (numpy codec, bit-identical to the graph's per tests/test_wire.py):
the gradients of N=2 ranks (two different batches) of the dense benchmark
model (~25M parameters), the stacked-LSTM benchmark model and the IMDB
model (Embedding(20000, 128) -> LSTM(32) -> Dense, real IMDB reviews when
--imdb-dir has them, densified), each multiplied by 1, by 2**15 (a typical
loss scale: the gradients as a loss-scaled step produces them) and by
2**-20; reduced in float32 (the reference), through the 16-bit wire
(float16 and bfloat16) and through a plain float16 cast summed in float16
(Compression.fp16 over MPI's float16 sum). Reported: relative error
||got - ref|| / ||ref||, overflows (finite reference, non-finite result) and
underflows (non-zero reference, zero result).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CODECS = ("ops", "xla", "fused", "cast")
STAGES = ("encode", "owner", "decode")
# The benchmark models' buckets (default 25 MB buckets): the dense model's
# 25,178,113 gradients are three full 6,553,600-element buckets and a
# 5,517,313 one; the IMDB model's dense bucket (LSTM + head) is 20,641; the
# stacked-LSTM benchmark model's one bucket ~200k; 2**16 and 2**20 between.
SIZES = (20641, 2**16, 208_129, 2**20, 5_517_313, 6_553_600)
SCALES = {"1": 1.0, "2**15": 2.0**15, "2**-20": 2.0**-20}


def _timer(fn, sync):
    """(process CPU seconds, wall seconds) of one call. The CPU time is the
    cost measure: on a shared machine wall time also counts waiting for a
    core (all threads of this process count; TensorFlow runs one here)."""
    c, t = time.process_time(), time.perf_counter()
    sync(fn())
    return time.process_time() - c, time.perf_counter() - t


def speed(sizes, rounds, n):
    import numpy as np
    import tensorflow as tf

    from keras_mpfp16.backend import tf_wire

    def use(codec):
        for name, value in defaults.items():
            setattr(tf_wire, name, 2**62 if codec == "ops" else value)

    defaults = {
        name: getattr(tf_wire, name)
        for name in ("FUSED_MIN_ELEMENTS", "OWNER_FUSED_MIN_ELEMENTS")
    }
    rng = np.random.default_rng(0)

    def sync(x):
        x = x[0] if isinstance(x, (tuple, list)) else x
        return x.numpy()

    out = {}
    for length in sizes:
        chunk = -(-length // n)
        rows = tf.constant((rng.normal(size=(n, chunk)) * 1e-3).astype(np.float32))
        fns = {}
        for codec in CODECS:
            use(codec)
            if codec == "cast":
                enc = tf.function(
                    lambda r: tf.bitcast(tf.cast(r, tf.float16), tf.uint16)
                )
                words = enc(rows)

                def owner(w=words):
                    v = tf.cast(tf.bitcast(w, tf.float16), tf.float32)
                    s = tf.reduce_sum(v, 0, keepdims=True)
                    return tf.bitcast(tf.cast(s, tf.float16), tf.uint16)

                dec = tf.function(
                    lambda w: tf.reshape(
                        tf.cast(tf.bitcast(w, tf.float16), tf.float32) * 0.5, [-1]
                    )
                )
            elif codec == "xla":
                big = rows.shape.num_elements() >= tf_wire.FUSED_MIN_ELEMENTS
                enc = tf.function(
                    lambda r, big=big: (
                        tf_wire._encode_fused(r, "float16", False, None, None)
                        if big
                        else tf_wire.encode_rows(r, "float16", flag=False)
                    )
                )
                words = enc(rows)

                def owner(w=words):
                    return tf_wire.owner_sum(w, "float16", 0)

                dec = tf.function(lambda w: tf_wire._decode(w, "float16", 0.5))
            else:
                enc = tf.function(
                    lambda r: tf_wire.encode_rows(r, "float16", flag=False)
                )
                words = enc(rows)

                def owner(w=words):
                    return tf_wire.owner_sum(w, "float16", 0)

                dec = tf.function(lambda w: tf_wire.decode_rows(w, "float16", 0.5))
            fns[codec] = {
                "encode": (lambda e=enc, r=rows: e(r)),
                "owner": owner,
                "decode": (lambda d=dec, w=words: d(w)),
            }
            for f in fns[codec].values():  # trace, compile, warm
                sync(f())
                sync(f())
        times = {c: {s: [] for s in STAGES} for c in CODECS}
        walls = {c: {s: [] for s in STAGES} for c in CODECS}
        for r in range(rounds):
            order = CODECS[r % len(CODECS) :] + CODECS[: r % len(CODECS)]
            for codec in order:
                use(codec)
                for stage in STAGES:
                    cpu, wall = _timer(fns[codec][stage], sync)
                    times[codec][stage].append(cpu)
                    walls[codec][stage].append(wall)
        use("fused")
        med = {
            c: {s: statistics.median(v) * 1e3 for s, v in times[c].items()}
            for c in CODECS
        }
        wall_med = {
            c: {s: statistics.median(v) * 1e3 for s, v in walls[c].items()}
            for c in CODECS
        }
        totals = {
            c: [sum(times[c][s][i] for s in STAGES) for i in range(rounds)]
            for c in CODECS
        }
        for c in CODECS:
            med[c]["total"] = statistics.median(totals[c]) * 1e3

        def ratio(a, b, totals=totals):
            return statistics.median(x / y for x, y in zip(totals[a], totals[b]))

        out[str(length)] = {
            "elements": length,
            "bytes_float32": 4 * length,
            "cpu_ms": med,
            "wall_ms": wall_med,
            "per_round_total_cpu_ms": {
                c: [round(t * 1e3, 3) for t in totals[c]] for c in CODECS
            },
            "fused_over_ops": ratio("fused", "ops"),
            "fused_over_xla": ratio("fused", "xla"),
            # Per stage: the median of per-round ratios, the shipped codec
            # against the one before it.
            "fused_over_xla_by_stage": {
                stage: statistics.median(
                    f / x for f, x in zip(times["fused"][stage], times["xla"][stage])
                )
                for stage in STAGES
            },
            "fused_over_cast": ratio("fused", "cast"),
            "ops_over_cast": ratio("ops", "cast"),
        }
        print(
            f"{length:>9} elements: ops {med['ops']['total']:8.2f} ms, "
            f"fused {med['fused']['total']:8.2f} ms, cast {med['cast']['total']:8.2f} ms"
            f"  fused/ops {out[str(length)]['fused_over_ops']:.3f}"
            f"  fused/xla {out[str(length)]['fused_over_xla']:.3f}"
            f"  fused/cast {out[str(length)]['fused_over_cast']:.3f}",
            flush=True,
        )
    return out


# -- numerics ------------------------------------------------------------------


def _imdb_batch(imdb_dir, count, seed):
    import numpy as np

    path = Path(imdb_dir) / "load.py" if imdb_dir else None
    if path is None or not path.exists():
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 20000, size=(count, 200)).astype("int32")
        return x, (rng.random((count, 1)) > 0.5).astype("float32"), "synthetic tokens"
    import importlib.util

    spec = importlib.util.spec_from_file_location("imdb_load", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (x, y), _ = mod.load_data(num_words=20000)
    import keras

    x = keras.utils.pad_sequences(x[seed * count : (seed + 1) * count], maxlen=200)
    y = np.asarray(y[seed * count : (seed + 1) * count], "float32")[:, None]
    return x.astype("int32"), y, "real IMDB reviews (load.py)"


def _gradients(model_name, n, imdb_dir):
    """Per-rank flat float32 gradients of `model_name` on n different batches."""
    import cluster_models
    import keras
    import numpy as np
    import tensorflow as tf

    source = "synthetic (cluster_models.data)"
    if model_name == "lstm":
        from keras_mpfp16.benchmark import models

        model = models.stacked_lstm()
        batch = 64
    else:
        model, _, batch = cluster_models.build(keras, model_name)
    loss = keras.losses.BinaryCrossentropy()
    grads = []
    for rank in range(n):
        if model_name == "imdb":
            x, y, source = _imdb_batch(imdb_dir, batch, rank)
        elif model_name == "lstm":
            from keras_mpfp16.benchmark import models

            inp = model.inputs[0].shape
            x, y = models.random_data(batch, inp[1], inp[2], seed=rank)
        else:
            x, y = cluster_models.data(model_name, batch, seed=rank)
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        g = tape.gradient(value, model.trainable_variables)
        g = [tf.convert_to_tensor(t) for t in g]  # IndexedSlices densified
        grads.append(np.concatenate([t.numpy().reshape(-1) for t in g]))
    return grads, model.count_params(), source


def _ours(grads, wire_dtype):
    """The 16-bit wire's reduction of per-rank vectors (numpy codec)."""
    import numpy as np

    from keras_mpfp16.runtime.mpi import wire

    n, length = len(grads), grads[0].shape[0]
    chunk = wire.chunk_length(length, n)
    sent = []
    for g in grads:
        padded = np.zeros((n, chunk), np.float32)
        padded.reshape(-1)[:length] = g
        sent.append(wire.encode_rows(padded, wire_dtype))
    owners = []
    for owner in range(n):
        recv = np.stack([s[owner] for s in sent])
        owners.append(wire.owner_sum(recv, wire_dtype)[0])
    return wire.decode_rows(np.stack(owners), wire_dtype).reshape(-1)[:length]


def _plain_cast(grads):
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        acc = grads[0].astype(np.float16)
        for g in grads[1:]:
            acc = acc + g.astype(np.float16)  # MPI's float16 sum
    return acc.astype(np.float32)


def _compare(got, ref):
    import numpy as np

    finite = np.isfinite(ref)
    bad = finite & ~np.isfinite(got)
    nonzero = ref != 0
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.where(bad, 0.0, got.astype(np.float64) - ref)
    norm = float(np.linalg.norm(ref.astype(np.float64)))
    return {
        "relative_error": float(np.linalg.norm(diff)) / norm if norm else 0.0,
        "overflow": int(bad.sum()),
        "underflow": int((nonzero & (got == 0)).sum()),
        "nonzero_reference": int(nonzero.sum()),
    }


def numerics(models, n, imdb_dir):
    import numpy as np

    out = {}
    for name in models:
        grads, params, source = _gradients(name, n, imdb_dir)
        absmax = max(float(np.abs(g).max()) for g in grads)
        nz = np.concatenate([np.abs(g[g != 0]) for g in grads])
        rows = {}
        for label, s in SCALES.items():
            scaled = [(g * np.float32(s)).astype(np.float32) for g in grads]
            ref = np.sum(np.stack(scaled).astype(np.float64), 0).astype(np.float32)
            rows[label] = {
                "float16 wire": _compare(_ours(scaled, "float16"), ref),
                "bfloat16 wire": _compare(_ours(scaled, "bfloat16"), ref),
                "plain float16 cast": _compare(_plain_cast(scaled), ref),
            }
            print(
                name,
                label,
                {
                    k: (f"{v['relative_error']:.2e}", v["overflow"], v["underflow"])
                    for k, v in rows[label].items()
                },
                flush=True,
            )
        out[name] = {
            "parameters": params,
            "data": source,
            "gradient_abs_max": absmax,
            "gradient_abs_min_nonzero": float(nz.min()) if nz.size else 0.0,
            "scales": rows,
        }
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    p.add_argument("--models", nargs="*", default=["dense", "lstm", "imdb"])
    p.add_argument(
        "--imdb-dir",
        default="",
        help="folder with load.py (the real IMDB reviews; synthetic tokens if absent)",
    )
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    result = {
        "command": "python examples/benchmarks/wire_codec.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_at_start": os.getloadavg(),
        "host": platform.processor() or platform.machine(),
        "tensorflow": tf.__version__,
        "ranks": args.ranks,
        "rounds": args.rounds,
    }
    if not args.skip_speed:
        result["speed"] = speed(args.sizes, args.rounds, args.ranks)
    result["numerics"] = numerics(args.models, args.ranks, args.imdb_dir)
    result["load_average_at_end"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
