"""Drift of recurrent layers under mixed precision: Keras's vs keras_mpfp16's.

For each layer kind (LSTM, GRU), sequence length T and long-memory gate bias
(LSTM forget gate, GRU update gate), one set of float32 weights is run

- as a float32 reference and a float64 reference (Keras's layer under the
  `float32` and `float64` policies: keras_mpfp16's layers are Keras's there),
- by Keras's layer and by ours (each `recurrent_precision`) under
  `mixed_float16` and `mixed_bfloat16`,

and the relative L2 error of the last 256 outputs (all batch rows and units)
is reported against both references. `float32` vs float64 is printed too: it
is the part of the drift that is the dynamics' own sensitivity.

With `--tf32 MODE...` each study is repeated with the float32 operands of the
layers' products rounded to TF32 as an Ampere-or-later GPU rounds them
(`tf32_emulation.py`; modes `none`, `input`, `recurrent`, `both`), and
Keras's layer under the `float32` policy is run under TF32 too; errors are
still against the float32 reference without TF32.

    python examples/benchmarks/layers_numerics.py --out numerics.json
    python examples/benchmarks/layers_numerics.py --quick   # CI smoke run
    python examples/benchmarks/layers_numerics.py --gate-biases 8 \
        --policies mixed_float16 --input-precisions float32 \
        --tf32 none input recurrent both --out layers_tf32.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mpfp16 import layers as mp_layers  # noqa: E402
from keras_mpfp16.layers.precision import (  # noqa: E402
    INPUT_PRECISIONS,
    RECURRENT_PRECISIONS,
)

POLICIES = ("mixed_float16", "mixed_bfloat16")
TF32_MODES = {
    "none": (),
    "input": ("input",),
    "recurrent": ("recurrent",),
    "both": ("input", "recurrent"),
}
KERAS_CLASSES = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
OUR_CLASSES = {"lstm": mp_layers.LSTM, "gru": mp_layers.GRU}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru"]
    )
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--gate-biases", nargs="+", type=float, default=[1.0, 8.0])
    parser.add_argument(
        "--recurrent-precisions",
        nargs="+",
        default=list(RECURRENT_PRECISIONS),
        choices=list(RECURRENT_PRECISIONS),
    )
    parser.add_argument(
        "--input-precisions",
        nargs="+",
        default=list(INPUT_PRECISIONS),
        choices=list(INPUT_PRECISIONS),
    )
    parser.add_argument(
        "--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES)
    )
    parser.add_argument(
        "--tf32",
        nargs="+",
        default=["none"],
        choices=list(TF32_MODES),
        help="products whose float32 operands are rounded to TF32 (emulated)",
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--features", type=int, default=6)
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument(
        "--tail", type=int, default=256, help="compare the last TAIL outputs"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes for a smoke run"
    )
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.batch, args.units, args.tail = [128], 2, 8, 32
    return args


def build(layer_cls, policy, weights, input_shape, **kwargs):
    layer = layer_cls(weights["units"], return_sequences=True, dtype=policy, **kwargs)
    layer.build(input_shape)
    layer.set_weights(weights["values"])
    model = keras.Sequential([keras.Input(batch_shape=input_shape), layer])
    return model


def run(model, x):
    return np.asarray(model.predict_on_batch(x), dtype="float64")


def reference_weights(kind, units, features, gate_bias, seed):
    """Keras's default initialisers, then the long-memory gate bias."""
    keras.utils.set_random_seed(seed)
    layer = KERAS_CLASSES[kind](units, dtype="float32")
    layer.build((None, None, features))
    kernel, recurrent_kernel, bias = layer.get_weights()
    bias = bias.copy()
    if kind == "lstm":  # gates i, f, c, o
        bias[units : 2 * units] = gate_bias
    else:  # input bias row, gates z (update), r, h
        bias[0, :units] = gate_bias
    return {"units": units, "values": [kernel, recurrent_kernel, bias]}


def round_to(array, dtype):
    """`array` rounded to `dtype` and back to float32."""
    rounded = keras.ops.cast(keras.ops.cast(array.astype("float32"), dtype), "float32")
    return np.asarray(rounded)


def float64_available() -> bool:
    """False on JAX without `JAX_ENABLE_X64=1`, which silently uses float32."""
    probe = keras.ops.convert_to_tensor(np.zeros(1), dtype="float64")
    return keras.backend.standardize_dtype(probe.dtype) == "float64"


def relative_error(y, reference, tail):
    if reference is None:
        return None
    y, reference = y[:, -tail:], reference[:, -tail:]
    return float(np.linalg.norm(y - reference) / np.linalg.norm(reference))


def measure(args):
    if not float64_available():
        print(
            "float64 is not available on this backend (JAX: set JAX_ENABLE_X64=1); "
            "errors against float64 are reported as n/a"
        )
    rows = []
    for kind in args.layers:
        for length in args.lengths:
            for gate_bias in args.gate_biases:
                weights = reference_weights(
                    kind, args.units, args.features, gate_bias, args.seed
                )
                rng = np.random.default_rng(args.seed + length)
                x = rng.normal(size=(args.batch, length, args.features)).astype(
                    "float32"
                )
                shape = x.shape
                ref32 = run(build(KERAS_CLASSES[kind], "float32", weights, shape), x)
                ref64 = None
                if float64_available():
                    ref64 = run(
                        build(KERAS_CLASSES[kind], "float64", weights, shape),
                        x.astype("float64"),
                    )
                for mode in args.tf32:
                    rows.extend(
                        _study(
                            args,
                            kind,
                            length,
                            gate_bias,
                            weights,
                            x,
                            ref32,
                            ref64,
                            mode,
                        )
                    )
    return rows


def _tf32(mode, units):
    if mode == "none":
        return contextlib.nullcontext()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tf32_emulation import emulated_tf32

    return emulated_tf32(TF32_MODES[mode], recurrent_rows=units)


def _study(args, kind, length, gate_bias, weights, x, ref32, ref64, mode):
    """One case (layer, T, gate bias) under one TF32 mode: the rows."""
    rows = []
    shape = x.shape
    with _tf32(mode, weights["units"]):
        base = {"layer": kind, "T": length, "gate_bias": gate_bias, "tf32": mode}
        # Keras's float32 layer: the reference itself, or under TF32 rerun.
        y32 = ref32
        if mode != "none":
            y32 = run(build(KERAS_CLASSES[kind], "float32", weights, shape), x)
        rows.append(
            {
                **base,
                "policy": "float32",
                "impl": "keras",
                "err_vs_f32": relative_error(y32, ref32, args.tail),
                "err_vs_f64": relative_error(y32, ref64, args.tail),
            }
        )
        variants = [("keras", KERAS_CLASSES[kind], {})] + [
            (
                f"ours:in={i},rec={r}",
                OUR_CLASSES[kind],
                {"input_precision": i, "recurrent_precision": r},
            )
            for i in args.input_precisions
            for r in args.recurrent_precisions
        ]
        for policy in args.policies:
            # Two floors, both float32 arithmetic: with only the
            # outputs rounded to the policy's dtype (what any layer
            # with compute-dtype outputs shows), and with the input
            # rounded as well (what the dynamics make of a layer
            # input already in the compute dtype, as in a stack).
            half = policy.split("_")[1]
            floors = []
            if mode == "none":
                floors = [
                    ("floor:output-rounded", ref32),
                    (
                        "floor:input+output-rounded",
                        run(
                            build(KERAS_CLASSES[kind], "float32", weights, shape),
                            round_to(x, half),
                        ),
                    ),
                ]
            for name, y in floors:
                y = round_to(y, half).astype("float64")
                rows.append(
                    {
                        **base,
                        "policy": policy,
                        "impl": name,
                        "err_vs_f32": relative_error(y, ref32, args.tail),
                        "err_vs_f64": relative_error(y, ref64, args.tail),
                    }
                )
            for name, cls, kwargs in variants:
                y = run(build(cls, policy, weights, shape, **kwargs), x)
                rows.append(
                    {
                        **base,
                        "policy": policy,
                        "impl": name,
                        "err_vs_f32": relative_error(y, ref32, args.tail),
                        "err_vs_f64": relative_error(y, ref64, args.tail),
                    }
                )
            print_rows(rows[-len(variants) - len(floors) :])
        print_rows(rows[:1])
    return rows


def _percent(value):
    return "n/a" if value is None else f"{value:.4%}"


def print_rows(rows, header=False):
    if header:
        print(
            f"{'layer':5} {'T':>5} {'bias':>4} {'tf32':9} {'policy':15} {'impl':26} {'err_vs_f32':>10} {'err_vs_f64':>10}"
        )
    for r in rows:
        print(
            f"{r['layer']:5} {r['T']:5d} {r['gate_bias']:4g} {r.get('tf32', 'none'):9} {r['policy']:15} {r['impl']:26} "
            f"{r['err_vs_f32']:10.4%} {_percent(r['err_vs_f64']):>10}",
            flush=True,
        )


def summary(rows):
    """Ours/Keras error ratio per case, and whether the <= 0.5x target holds."""
    keras_err = {
        (r["layer"], r["T"], r["gate_bias"], r["policy"], r["tf32"]): r["err_vs_f32"]
        for r in rows
        if r["impl"] == "keras" and r["policy"] != "float32"
    }
    out = []
    for r in rows:
        key = (r["layer"], r["T"], r["gate_bias"], r["policy"], r["tf32"])
        if r["impl"].startswith("ours") and key in keras_err:
            k = keras_err[key]
            out.append(
                {
                    **r,
                    "keras_err_vs_f32": k,
                    "ratio_vs_keras": r["err_vs_f32"] / k if k else None,
                    "target_applies": k > 0.01,
                    "meets_target": (k <= 0.01) or r["err_vs_f32"] <= 0.5 * k,
                }
            )
    return out


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    print_rows([], header=True)
    rows = measure(args)
    print("\nfloat32 vs float64 (the dynamics' own sensitivity):")
    print_rows([r for r in rows if r["policy"] == "float32"])
    checks = summary(rows)
    print("\nours / keras (error vs float32 reference):")
    for c in checks:
        ratio = "n/a" if c["ratio_vs_keras"] is None else f"{c['ratio_vs_keras']:.3f}"
        flag = "ok" if c["meets_target"] else "MISSED"
        print(
            f"{c['layer']:5} T={c['T']:5d} bias={c['gate_bias']:g} tf32={c['tf32']:9} {c['policy']:15} {c['impl']:26} "
            f"ratio={ratio:>6} keras={c['keras_err_vs_f32']:.4%} {flag}"
        )
    result = {
        "benchmark": "layers_numerics",
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "args": vars(args),
        "seconds": round(time.time() - started, 1),
        "rows": rows,
        "checks": checks,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
