"""Every rank saving the same files after `fit` (issue 19, item 5).

Run as `mpirun -np N python save_after_fit.py OUT_DIR`. A user who forgot
`if kmp.is_root():` saves `final.weights.h5` and `final.keras` on every
rank after `fit` (five times in a row, so the ranks' writes overlap), then
every rank loads both files and compares them with its model. Then the
usual patterns: a save inside `if kmp.is_root():` followed by a barrier and
a load on every rank, and a save on the last rank alone (nothing waits for
the others). Prints one JSON line per rank.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out_dir = sys.argv[1]
rank, n = kmp.rank(), kmp.size()


def model_fn():
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1),
        ]
    )


def same_weights(a, b) -> bool:
    wa, wb = a.get_weights(), b.get_weights()
    return len(wa) == len(wb) and all(np.array_equal(x, y) for x, y in zip(wa, wb))


rng = np.random.default_rng(0)
x = rng.normal(size=(24 * n, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
keras.utils.set_random_seed(rank)  # unseeded ranks: rank 0's model wins
model = model_fn()
model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss="mse")
model.fit(*kmp.shard(x, y), batch_size=8, epochs=2, verbose=0)

weights_path = os.path.join(out_dir, "final.weights.h5")
model_path = os.path.join(out_dir, "final.keras")
errors = []
for _ in range(5):
    try:
        model.save_weights(weights_path)
        model.save(model_path)
    except Exception as exc:  # noqa: BLE001 - reported, the test fails
        errors.append(f"{type(exc).__name__}: {exc}")

# Every rank loads what is there now (after its own saves).
fresh = model_fn()
fresh.load_weights(weights_path)
loaded = keras.models.load_model(model_path)
record = {
    "rank": rank,
    "size": n,
    "errors": errors,
    "weights_file_matches": same_weights(fresh, model),
    "model_file_matches": same_weights(loaded, model),
    "loaded_optimizer": type(loaded.optimizer).__name__,
    "loaded_iterations": int(loaded.optimizer.iterations.numpy()),
    "iterations": int(model.optimizer.iterations.numpy()),
}

# The usual pattern: rank 0 saves, the others wait, everyone loads.
root_path = os.path.join(out_dir, "root.keras")
if kmp.is_root():
    model.save(root_path)
kmp.barrier()
record["root_file_matches"] = same_weights(keras.models.load_model(root_path), model)

# One rank alone saves: no collective, so it cannot wait for the others.
last_path = os.path.join(out_dir, "last.weights.h5")
if rank == n - 1:
    model.save_weights(last_path)
kmp.barrier()
check = model_fn()
check.load_weights(last_path)
record["last_file_matches"] = same_weights(check, model)
kmp.barrier()
record["files"] = sorted(os.listdir(out_dir))
print(json.dumps(record), flush=True)
