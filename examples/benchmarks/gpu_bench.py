"""GPU numbers: fp16/bf16 vs fp32 step time and peak memory of a paper-size LSTM.

    python examples/benchmarks/gpu_bench.py --out gpu_bench.json      # ~10 min on one GPU
    python examples/benchmarks/gpu_bench.py --smoke                    # tiny, any machine

Keras 3 on the JAX backend (GPU machines for this project carry JAX but not
TensorFlow), one subprocess per configuration so peak memory is per
configuration:

  policy     float32 | mixed_float16 | mixed_bfloat16
  layer      keras.layers.LSTM with use_cudnn=True / False, keras_mpfp16.layers.LSTM
  model      Input(T=128, 128) -> 3 x LSTM(2048) -> Dense(1): ~85M parameters

Each worker reports the median train step (train_on_batch, which returns a
host float and so waits for the GPU) and the device's peak bytes in use.
Under mixed_float16 Keras wraps the optimizer in its LossScaleOptimizer
(dynamic loss scaling on the JAX backend). The allreduce path (CUDA-aware or
staged) is reported by examples/gpu_check.py.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker(args):
    import importlib.util

    if importlib.util.find_spec("jax") is not None:
        os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import numpy as np

    keras.config.set_dtype_policy(args.policy)

    def make(units, return_sequences):
        if args.layer == "mpfp16":
            from keras_mpfp16.layers import LSTM

            return LSTM(units, return_sequences=return_sequences)
        return keras.layers.LSTM(
            units,
            return_sequences=return_sequences,
            use_cudnn=args.layer == "keras-cudnn",
        )

    stack = [keras.Input((args.timesteps, args.features))]
    for i in range(args.layers):
        stack.append(make(args.units, i < args.layers - 1))
    stack.append(keras.layers.Dense(1, activation="sigmoid", dtype="float32"))
    model = keras.Sequential(stack)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.timesteps, args.features)).astype("float32")
    y = (rng.random((args.batch, 1)) > 0.5).astype("float32")
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = model.train_on_batch(x, y)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
    peak = None
    try:
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
        device = str(jax.devices()[0])
    except Exception:
        device = keras.backend.backend()
    params = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    print(
        json.dumps(
            {
                "policy": args.policy,
                "layer": args.layer,
                "params": params,
                "device": device,
                "step_s": statistics.median(times),
                "step_s_all": times,
                "peak_bytes": peak,
                "loss": float(loss if np.ndim(loss) == 0 else loss[0]),
            }
        ),
        flush=True,
    )


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="float32")
    p.add_argument("--layer", default="keras-cudnn")
    p.add_argument("--units", type=int, default=2048)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--timesteps", type=int, default=128)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, any backend")
    p.add_argument("--out")
    args = p.parse_args()
    if args.smoke:
        args.units, args.layers, args.timesteps, args.features = 16, 2, 8, 4
        args.batch, args.steps, args.warmup = 4, 2, 1
    if args.worker:
        return worker(args)
    results = []
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        layers = (
            ("keras-nocudnn", "mpfp16")
            if args.smoke
            else ("keras-cudnn", "keras-nocudnn", "mpfp16")
        )
        for layer in layers:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                "--policy",
                policy,
                "--layer",
                layer,
            ]
            for k in (
                "units",
                "layers",
                "timesteps",
                "features",
                "batch",
                "steps",
                "warmup",
            ):
                cmd += [f"--{k}", str(getattr(args, k))]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            rec = (
                json.loads(line[-1])
                if line
                else {
                    "policy": policy,
                    "layer": layer,
                    "error": out.stderr.strip().splitlines()[-1:],
                }
            )
            results.append(rec)
            print(json.dumps(rec), flush=True)
    base = {
        r["layer"]: r["step_s"]
        for r in results
        if r.get("policy") == "float32" and "step_s" in r
    }
    for r in results:
        if "step_s" in r and r["layer"] in base:
            r["speedup_vs_float32"] = base[r["layer"]] / r["step_s"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"when": time.strftime("%Y-%m-%d %H:%M"), "results": results},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
