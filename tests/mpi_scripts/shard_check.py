"""`kmp.shard` given different data on different ranks (issue 19, item 2).

Run as `mpirun -np N python shard_check.py MODE`.

- `caught`: each case on every rank, the error (if any) caught and printed
  as one JSON line per rank: unseeded arrays (keras.io's addition_rnn.py
  makes its data this way), arrays that differ on the last rank only,
  seeded arrays, per-rank data with `check=False`, a `tf.data` pipeline
  shuffled without a seed before `shard`, the same pipeline seeded, a
  `PyDataset`.
- `uncaught`: a user's script with unseeded data and nothing else: the job
  must end (non-zero) with the error, not hang.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

mode = sys.argv[1]
rank, n = kmp.rank(), kmp.size()

if mode == "uncaught":
    x = np.random.default_rng().normal(size=(60, 3)).astype("float32")  # unseeded
    y = np.random.default_rng().integers(0, 2, size=(60,))
    x, y = kmp.shard(x, y)
    print(json.dumps({"rank": rank, "unexpected": "shard returned"}), flush=True)
    raise SystemExit(0)


def attempt(fn):
    try:
        out = fn()
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None, "rows": _rows(out)}


def _rows(out):
    if isinstance(out, tuple):
        out = out[0]
    if isinstance(out, np.ndarray):
        return out[:, 0].tolist()
    if isinstance(out, keras.utils.PyDataset):
        return [float(out[i][0][0, 0]) for i in range(len(out))]
    return [float(e[0][0]) for e in out.as_numpy_iterator()]


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // 4

    def __getitem__(self, i):
        return self.x[4 * i : 4 * i + 4], self.y[4 * i : 4 * i + 4]


def seeded(seed=0, rows=60):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, 3)).astype("float32"), rng.integers(0, 2, (rows,))


results = {}
unseeded = np.random.default_rng().normal(size=(60, 3)).astype("float32")
results["unseeded"] = attempt(lambda: kmp.shard(unseeded, seeded()[1]))
x, y = seeded()
last = x.copy()
if rank == n - 1:
    last[17, 2] += 1.0  # one value differs, on the last rank only
results["last_rank_differs"] = attempt(lambda: kmp.shard(last, y))
results["seeded"] = attempt(lambda: kmp.shard(x, y))
mine = seeded(seed=10 + rank, rows=40 + 4 * rank)  # each rank its own, on purpose
results["per_rank_opt_in"] = attempt(lambda: kmp.shard(*mine, check=False))
results["shapes_differ"] = attempt(lambda: kmp.shard(seeded(rows=60 + rank)[0]))

import tensorflow as tf  # noqa: E402

ds = tf.data.Dataset.from_tensor_slices((x, y))
results["tf_data_unseeded_shuffle"] = attempt(lambda: kmp.shard(ds.shuffle(60)))
results["tf_data_seeded_shuffle"] = attempt(lambda: kmp.shard(ds.shuffle(60, seed=4)))
results["py_dataset"] = attempt(lambda: kmp.shard(Batches(x, y)))
results["check_bad"] = attempt(lambda: kmp.shard(x, y, check="yes"))
print(json.dumps({"rank": rank, "size": n, "results": results}), flush=True)
