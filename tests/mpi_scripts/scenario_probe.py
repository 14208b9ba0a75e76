"""A stand-in scenario for tests/test_mpi_scenarios.py: `raise` raises on
every rank; `leak` changes the environment and Keras's dtype policy and
prints; `look` prints what it finds (a fresh script's state, after `leak`)."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

mode = sys.argv[1]
if mode == "raise":
    raise ValueError(f"the probe fails on rank {kmp.rank()}")
if mode == "leak":
    os.environ["KERAS_MPFP16_PROBE_LEAK"] = "1"
    keras.config.set_dtype_policy("mixed_float16")
record = {
    "rank": kmp.rank(),
    "mode": mode,
    "leak": os.environ.get("KERAS_MPFP16_PROBE_LEAK"),
    "policy": keras.config.dtype_policy().name,
    "argv": sys.argv[1:],
}
print(json.dumps(record), flush=True)
