"""Which path gradients take to MPI on this machine: device buffers or host staging.

    mpirun -np 2 python examples/gpu_check.py [--out gpu_check.json]

Prints, per rank, one JSON line with:

* `cuda_aware` / `cuda_aware_reason`: whether MPI reports CUDA support and how
  that was decided (`KERAS_MPFP16_CUDA_AWARE=0/1` overrides the query);
* `tensorflow_path`: the DistributedOptimizer's choice, made once per process
  -- `"device"` (gradient buffers handed to MPI where they live, through
  DLPack: no CuPy, no host copy) or `"host"` (staged through host memory) --
  and why;
* `tensorflow_gradients`: a tiny model trained for one epoch with the
  DistributedOptimizer (on the GPU when TensorFlow sees one), the number of
  gradient collectives per path ("device": GPU memory given to MPI; "staged":
  GPU tensors copied to the host; "host": host memory; "dlpack": buffers that
  went through DLPack) and whether every rank ended with the same weights;
* `path` / `correct`: a numpy-level `kmp.allreduce` of a CuPy array when CuPy
  and a GPU are present ("device" or "staged"), else of a numpy array
  ("host").

`KERAS_MPFP16_CUDA_AWARE=1` on a CPU-only machine exercises the device code
path with host memory (mpi4py accepts CPU DLPack buffers).
"""

import argparse
import json
import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.runtime.mpi import cuda  # noqa: E402


def cupy_array(values):
    """A CuPy array on the GPU, or (None, why not)."""
    try:
        import cupy
    except ImportError:
        return None, "CuPy not installed (only the numpy-level check needs it)"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy.asarray(values), "cupy"
    except Exception as exc:  # a CuPy without a usable GPU
        return None, f"CuPy sees no usable GPU ({type(exc).__name__}: {exc})"
    return None, "CuPy sees no GPU"


def tensorflow_gradients():
    try:
        import keras
        import tensorflow as tf
    except ImportError:
        return {"error": "tensorflow not installed"}
    from keras_mpfp16.backend import tf_path

    before = dict(cuda.path_counts)
    keras.utils.set_random_seed(kmp.rank())  # different starts: the sync must fix
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
    )
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    x = np.random.default_rng(kmp.rank()).normal(size=(64, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
    crc = 0
    for w in model.get_weights():
        crc = zlib.crc32(np.ascontiguousarray(w).view(np.uint8).reshape(-1), crc)
    after = dict(cuda.path_counts)
    return {
        "gpus_visible": len(tf.config.list_logical_devices("GPU")),
        "variables_on": model.trainable_variables[0].value.device or "?",
        "reduction_path": tf_path.reduction_path(),
        "collectives": {
            k: after.get(k, 0) - before.get(k, 0)
            for k in ("device", "staged", "host", "dlpack")
        },
        "same_weights_on_all_ranks": len(set(kmp.runtime.allgather_object(crc))) == 1,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    rank, size = kmp.rank(), kmp.size()
    values = np.arange(1024, dtype=np.float32) * (rank + 1)
    expected = np.arange(1024, dtype=np.float32) * sum(range(1, size + 1))
    aware, reason = cuda.detection()
    report = {
        "rank": rank,
        "size": size,
        "cuda_aware": aware,
        "cuda_aware_reason": reason,
    }
    tf_report = tensorflow_gradients()
    report["tensorflow_path"] = tf_report.get("reduction_path")
    report["tensorflow_gradients"] = tf_report
    arr, kind = cupy_array(values)
    if arr is None:
        out = kmp.allreduce(values, op="sum")
        report.update(
            array=f"numpy ({kind})",
            path="host",
            correct=bool(np.allclose(out, expected)),
        )
    else:
        before = dict(cuda.path_counts)
        out = kmp.allreduce(arr, op="sum")
        path = [
            k for k in ("device", "staged") if cuda.path_counts[k] > before.get(k, 0)
        ]
        report.update(
            array=kind,
            path=path[0],
            correct=bool(np.allclose(out.get(), expected)),
        )
    print(json.dumps(report), flush=True)
    if args.out and rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
