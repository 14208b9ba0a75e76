"""N ranks with per-rank batch b (SGD, float32) == 1 process with batch N*b.

Rank r receives, for every global batch k, rows [k*N*b + r*b, k*N*b + (r+1)*b),
so the averaged gradient equals the single process's batch gradient. Rank 0
then trains the same initial model alone with a plain SGD optimizer on the
full data and compares. With --accum K, each rank accumulates K micro-batches
of size b and the single process uses batch N*K*b.

Prints one JSON line per rank: {"rank", "max_rel_diff"} (rank 0 only compares).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import against_one_process, emit  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--accum", type=int, default=1)
args = p.parse_args()
rank, n = kmp.rank(), kmp.size()
b, steps, k = 8, 6, args.accum

rng = np.random.default_rng(42)
total = steps * n * b * k
x = rng.normal(size=(total, 10, 3)).astype("float32")
y = rng.normal(size=(total, 2)).astype("float32")


def build():
    keras.utils.set_random_seed(7)  # same on all ranks: same start
    return keras.Sequential(
        [keras.Input((10, 3)), keras.layers.LSTM(8), keras.layers.Dense(2)]
    )


# This rank's rows: micro-batch m of global step s is block (s*k + m)*n + rank.
result = against_one_process(
    build,
    lambda: keras.optimizers.SGD(0.1),
    (x, y),
    b,
    micro=k,
    gradient_accumulation_steps=k if k > 1 else None,
)
emit(result)
