"""The prepared GPU measurement: one command, one JSON, at most ~8 minutes.

    python examples/benchmarks/gpu_bench.py --out gpu_bench.json   # one GPU, <= 8 min
    python examples/benchmarks/gpu_bench.py --smoke --out s.json   # tiny, any machine (CI)

Nothing in this project has run on a GPU yet; this script is what to run when
one is at hand. Keras 3 on the JAX backend where JAX is installed (GPU
machines for this project carry JAX), else on TensorFlow.

Part 1, speed and memory of the paper-size model, `Input(T=128, 128) -> 3 x
LSTM(2048) -> Dense(1)` (~85M parameters), batch 64, `train_on_batch`
(which returns a host float, so it waits for the GPU); median step time and
the device's peak bytes in use, one subprocess per configuration so the peak
is per configuration:

  keras-f16            Keras's LSTM, mixed_float16, use_cudnn="auto" (cuDNN
                       where the backend has it)
  keras-f32-tf32       Keras's LSTM, float32, the backend's default matmul
                       precision (TF32 on Ampere and later)
  keras-f32-notf32     Keras's LSTM, float32, TF32 off (JAX
                       `jax_default_matmul_precision="highest"`, TensorFlow
                       `enable_tensor_float_32_execution(False)`)
  ours                 keras_mpfp16's LSTM, mixed_float16, default precisions
                       (on TensorFlow with a GPU: the float32 cuDNN path)
  ours-rec-split       ... recurrent_precision="split"
  ours-rec-compute     ... recurrent_precision="compute"
  ours-in-compute      ... input_precision="compute"
  ours-notf32          ours with TF32 off
  ours-tf32x3          ours, both precisions "tf32x3" (float32 accuracy from
                       three TF32 products), TF32 on

Part 2, the drift test on the GPU (docs/layers.md's long-memory case): LSTM
and GRU, gate bias 8, T = 1024 and 4096, relative error of the last 256
outputs against Keras's float32 layer with TF32 off: Keras mixed_float16,
Keras float32 with TF32 on, ours default with TF32 on and off, ours with
"tf32x3" products and TF32 on.

Configurations are skipped (and say so) once `--budget-s` is spent, so a run
ends in time whatever the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = {
    # name: (layer, policy, TF32 on, layer kwargs)
    "keras-f16": ("keras", "mixed_float16", True, {}),
    "keras-f32-tf32": ("keras", "float32", True, {}),
    "keras-f32-notf32": ("keras", "float32", False, {}),
    "ours": ("ours", "mixed_float16", True, {}),
    "ours-rec-split": ("ours", "mixed_float16", True, {"recurrent_precision": "split"}),
    "ours-rec-compute": (
        "ours",
        "mixed_float16",
        True,
        {"recurrent_precision": "compute"},
    ),
    "ours-in-compute": ("ours", "mixed_float16", True, {"input_precision": "compute"}),
    "ours-notf32": ("ours", "mixed_float16", False, {}),
    "ours-tf32x3": (
        "ours",
        "mixed_float16",
        True,
        {"input_precision": "tf32x3", "recurrent_precision": "tf32x3"},
    ),
}


def _select_backend():
    if "KERAS_BACKEND" not in os.environ and importlib.util.find_spec("jax"):
        os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 for float32 products as the backend does by default (enabled), or
    off. Models must be built and traced inside."""
    import keras

    if enabled:
        yield
        return
    if keras.backend.backend() == "jax":
        import jax

        with jax.default_matmul_precision("highest"):
            yield
        return
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def _device_and_peak():
    import keras

    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        stats = device.memory_stats() or {}
        return str(device), stats.get("peak_bytes_in_use")
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return "CPU", None
    return gpus[0].name, tf.config.experimental.get_memory_info("GPU:0")["peak"]


def speed_worker(args, names):
    """Runs the named configurations in this process; one JSON line each."""
    import keras
    import numpy as np

    from keras_mpfp16 import layers as mp_layers

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.timesteps, args.features)).astype("float32")
    y = (rng.random((args.batch, 1)) > 0.5).astype("float32")
    for name in names:
        layer, policy, tf32_on, kwargs = CONFIGS[name]
        keras.config.set_dtype_policy(policy)
        keras.utils.set_random_seed(0)
        started = time.perf_counter()
        with tf32(tf32_on):
            stack = [keras.Input((args.timesteps, args.features))]
            rnns = []
            for i in range(args.layers):
                sequences = i < args.layers - 1
                if layer == "ours":
                    rnn = mp_layers.LSTM(
                        args.units, return_sequences=sequences, **kwargs
                    )
                else:
                    rnn = keras.layers.LSTM(args.units, return_sequences=sequences)
                rnns.append(rnn)
                stack.append(rnn)
            stack.append(keras.layers.Dense(1, activation="sigmoid", dtype="float32"))
            model = keras.Sequential(stack)
            model.compile(
                optimizer=keras.optimizers.Adam(1e-4), loss="binary_crossentropy"
            )
            times = []
            for i in range(args.warmup + args.steps):
                t0 = time.perf_counter()
                loss = model.train_on_batch(x, y)
                if i >= args.warmup:
                    times.append(time.perf_counter() - t0)
        device, peak = _device_and_peak()
        record = {
            "part": "speed",
            "config": name,
            "layer": layer,
            "policy": policy,
            "tf32": tf32_on,
            "layer_kwargs": kwargs,
            "backend": keras.backend.backend(),
            "device": device,
            "params": int(sum(np.prod(w.shape) for w in model.trainable_weights)),
            "step_s": statistics.median(times),
            "step_s_all": times,
            "peak_bytes": peak,
            "loss": float(np.asarray(loss).reshape(-1)[0]),
            "seconds": round(time.perf_counter() - started, 1),
        }
        if layer == "ours":
            record["recurrence_path"] = rnns[0].recurrence_path
        print(json.dumps(record), flush=True)
    keras.config.set_dtype_policy("float32")


def drift_worker(args):
    """The long-memory drift test on this device; one JSON line per case."""
    import keras
    import numpy as np

    sys.path.insert(0, HERE)
    import layers_numerics as ln

    for kind in ("lstm", "gru"):
        for length in args.drift_lengths:
            weights = ln.reference_weights(kind, args.drift_units, 6, 8.0, 0)
            rng = np.random.default_rng(length)
            x = rng.normal(size=(8, length, 6)).astype("float32")
            tail = min(256, length)
            with tf32(False):
                ref = ln.run(
                    ln.build(ln.KERAS_CLASSES[kind], "float32", weights, x.shape), x
                )
            runs = {
                "keras mixed_float16": (ln.KERAS_CLASSES[kind], "mixed_float16", True),
                "keras float32, TF32 on": (ln.KERAS_CLASSES[kind], "float32", True),
                "ours mixed_float16, TF32 on": (
                    ln.OUR_CLASSES[kind],
                    "mixed_float16",
                    True,
                ),
                "ours mixed_float16, TF32 off": (
                    ln.OUR_CLASSES[kind],
                    "mixed_float16",
                    False,
                ),
                "ours mixed_float16 tf32x3, TF32 on": (
                    ln.OUR_CLASSES[kind],
                    "mixed_float16",
                    True,
                ),
            }
            errors = {}
            for name, (cls, policy, tf32_on) in runs.items():
                kwargs = {}
                if "tf32x3" in name:
                    kwargs = {
                        "input_precision": "tf32x3",
                        "recurrent_precision": "tf32x3",
                    }
                with tf32(tf32_on):
                    y = ln.run(ln.build(cls, policy, weights, x.shape, **kwargs), x)
                errors[name] = ln.relative_error(y, ref, tail)
            keras_err = errors["keras mixed_float16"]
            print(
                json.dumps(
                    {
                        "part": "drift",
                        "layer": kind,
                        "T": length,
                        "gate_bias": 8.0,
                        "backend": keras.backend.backend(),
                        "device": _device_and_peak()[0],
                        "err_vs_f32_notf32": errors,
                        "ours_tf32_on_over_keras_f16": errors[
                            "ours mixed_float16, TF32 on"
                        ]
                        / keras_err,
                        "ours_tf32_off_over_keras_f16": errors[
                            "ours mixed_float16, TF32 off"
                        ]
                        / keras_err,
                    }
                ),
                flush=True,
            )


def _worker_command(args, part, names=()):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", part]
    for k in ("units", "layers", "timesteps", "features", "batch", "steps", "warmup"):
        cmd += [f"--{k}", str(getattr(args, k))]
    cmd += ["--drift-units", str(args.drift_units), "--drift-lengths"]
    cmd += [str(t) for t in args.drift_lengths]
    if names:
        cmd += ["--configs", *names]
    return cmd


def _run_worker(cmd, timeout):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # What the worker printed before the deadline is kept.
        printed = exc.stdout or ""
        if isinstance(printed, bytes):
            printed = printed.decode(errors="replace")
        records = [json.loads(ln) for ln in printed.splitlines() if ln.startswith("{")]
        return records, f"timed out after {timeout:.0f} s (the budget)"
    records = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    error = None
    if out.returncode != 0:
        error = "\n".join(out.stderr.strip().splitlines()[-5:])
    return records, error


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--worker", choices=["speed", "drift"], help=argparse.SUPPRESS)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--units", type=int, default=2048)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--timesteps", type=int, default=128)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--drift-units", type=int, default=32)
    p.add_argument("--drift-lengths", nargs="+", type=int, default=[1024, 4096])
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip what is left once this much time is spent (default 450; "
        "none with --smoke)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, every configuration in one process (CI, any machine)",
    )
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.smoke:
        args.units, args.layers, args.timesteps, args.features = 16, 2, 8, 4
        args.batch, args.steps, args.warmup = 4, 2, 1
        args.drift_units, args.drift_lengths = 8, [32]
    if args.budget_s is None:
        args.budget_s = float("inf") if args.smoke else 450.0
    return args


def main(argv=None):
    args = parse_args(argv)
    _select_backend()
    if args.worker == "speed":
        return speed_worker(args, args.configs)
    if args.worker == "drift":
        return drift_worker(args)
    started = time.monotonic()
    results, skipped, errors = [], [], []
    # The drift test first: it is short and answers the numerics question.
    batches = [("drift", ())]
    if args.smoke:
        batches.append(("speed", tuple(args.configs)))
    else:
        batches += [("speed", (name,)) for name in args.configs]
    for part, names in batches:
        left = args.budget_s - (time.monotonic() - started)
        if left < 20:
            skipped += list(names) or [part]
            continue
        timeout = None if left == float("inf") else left
        records, error = _run_worker(_worker_command(args, part, names), timeout)
        results += records
        for r in records:
            print(json.dumps(r), flush=True)
        if error:
            errors.append({"part": part, "configs": list(names), "error": error})
            print(f"{part} {list(names)}: {error}", file=sys.stderr, flush=True)
    speed = {r["config"]: r for r in results if r["part"] == "speed"}
    ratios = {}
    if "keras-f16" in speed:
        base = speed["keras-f16"]["step_s"]
        ratios = {name: r["step_s"] / base for name, r in speed.items()}
    summary = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.monotonic() - started, 1),
        "args": {k: v for k, v in vars(args).items() if k != "worker"},
        "step_time_over_keras_f16": ratios,
        "results": results,
        "skipped": skipped,
        "errors": errors,
    }
    print(json.dumps({k: summary[k] for k in ("seconds", "skipped", "errors")}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
