"""Which allreduce path runs on this machine: CUDA-aware (device buffers) or staged.

    mpirun -np 2 python examples/gpu_check.py [--out gpu_check.json]

Prints, per rank: whether MPI reports CUDA support (`kmp.cuda_aware()`,
overridable with KERAS_MPFP16_CUDA_AWARE=0/1), then reduces a GPU array
through `kmp.allreduce` — CuPy if installed, else a JAX array on the GPU — and
reports which path ran ("device": the buffer went to MPI as is; "staged":
copied through host memory) and whether the result is right. With TensorFlow
and a GPU it also trains a tiny model with the DistributedOptimizer and
reports the path its gradient buckets took. Without a GPU it says so and
checks the host path.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.runtime import cuda  # noqa: E402


def device_array(values):
    """A GPU array (CuPy, else JAX), or None when neither has a GPU."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy.asarray(values), "cupy"
    except Exception:
        pass
    try:
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if gpus:
            return jax.device_put(values, gpus[0]), "jax"
    except Exception:
        pass
    return None, None


def tf_gpu_path():
    try:
        import tensorflow as tf
    except ImportError:
        return "tensorflow not installed"
    if not tf.config.list_physical_devices("GPU"):
        return "tensorflow sees no GPU"
    import keras

    before = dict(cuda.path_counts)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
    )
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    x = np.random.default_rng(kmp.rank()).normal(size=(64, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
    after = dict(cuda.path_counts)
    used = {k: after.get(k, 0) - before.get(k, 0) for k in ("device", "staged")}
    return "host numpy_function (staged)" if not any(used.values()) else used


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    rank, size = kmp.rank(), kmp.size()
    values = np.arange(1024, dtype=np.float32) * (rank + 1)
    expected = np.arange(1024, dtype=np.float32) * sum(range(1, size + 1))
    report = {"rank": rank, "size": size, "cuda_aware": kmp.cuda_aware()}
    arr, kind = device_array(values)
    if arr is None:
        out = kmp.allreduce(values, op="sum")
        report.update(
            array="numpy (no GPU found)",
            path="host",
            correct=bool(np.allclose(out, expected)),
        )
    else:
        before = dict(cuda.path_counts)
        out = kmp.allreduce(arr, op="sum")
        path = [
            k for k in ("device", "staged") if cuda.path_counts[k] > before.get(k, 0)
        ]
        import cupy

        report.update(
            array=kind,
            path=path[0],
            correct=bool(np.allclose(cupy.asnumpy(out), expected)),
        )
    report["tensorflow_gradients"] = tf_gpu_path()
    print(json.dumps(report), flush=True)
    if args.out and rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
