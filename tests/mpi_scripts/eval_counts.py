"""Count metrics in validation and evaluate under mpirun, against one process (issue 19).

Run as `mpirun -np N python eval_counts.py OUT_DIR`. Ranks are not seeded
alike. Every rank prints one JSON line; tests/test_mpi_eval_counts.py compares.

1. Before any other MPI-aware call, rank 0 alone evaluates (as a script that
   evaluates on rank 0 and hands a report to the others would) while the
   other ranks wait for its report file outside MPI: the lone evaluate must
   not be the call that initialises MPI collectively (that would wait for
   ranks that never come).
2. For every input kind (numpy, tf.data of known and of unknown length,
   PyDataset, a Python generator, sets with fewer batches than ranks,
   validation_split of unsharded and of sharded data): fit's `val_` logs and
   `evaluate` give the counts (`TruePositives`, `FalseNegatives`, a `Sum`
   of the labels, AUC and AUC's per-threshold counts) that one process gets
   with the same weights on the same data.
3. evaluate on every rank, once together and once with rank 0 arriving later
   than KERAS_MPFP16_EVALUATE_WAIT: the same numbers.
"""

import json
import math
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import Batches, fit_in_order  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out_dir = sys.argv[1]
env_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
BATCH = 4


def data(seed, rows, features=6):
    rng = np.random.default_rng(seed)  # the same data on every rank
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).astype("float32")
    return x, y


class Positives(keras.metrics.Sum):
    """A `Sum` metric: how many positive labels were seen."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(y_true, sample_weight=sample_weight)


def metrics():
    return [
        keras.metrics.TruePositives(name="tp"),
        keras.metrics.FalseNegatives(name="fn"),
        Positives(name="pos"),
        keras.metrics.AUC(name="auc", num_thresholds=50),
    ]


def model_fn():
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(6, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


def auc_counts(model):
    """AUC's per-threshold confusion counts, as lists."""
    (auc,) = [m for m in flat_metrics(model) if m.name == "auc"]
    return [np.asarray(v).tolist() for v in auc.variables]


def flat_metrics(model):
    out = []
    for m in model.metrics:
        out.extend(getattr(m, "metrics", [m]))
    return out


def reference(model, x, y):
    """One process, the same weights: evaluate on (x, y)."""
    ref = model_fn()
    ref.set_weights(model.get_weights())
    ref.compile(loss="binary_crossentropy", metrics=metrics())
    logs = ref.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    return {"logs": logs, "auc_counts": auc_counts(ref)}


keras.utils.set_random_seed(1000 + env_rank)
x, y = data(8, 12 * BATCH * 3)  # the same on every rank; 12 batches per rank at np=3
xv, yv = data(9, 37)  # 10 batches, the last partial
xt, yt = data(10, 5)  # tiny: 2 batches, fewer than 3 ranks

model = model_fn()
model.compile(
    optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.1)),
    loss="binary_crossentropy",
    metrics=metrics(),
)

# 1. Rank 0 alone evaluates before any collective; the others wait for its
# report outside MPI (at most 120 s, then fail instead of hanging).
report = os.path.join(out_dir, "lone_report.json")
if env_rank == 0:
    lone = model.evaluate(xv, yv, batch_size=BATCH, verbose=0, return_dict=True)
    with open(report + ".tmp", "w") as f:
        json.dump(lone, f)
    os.replace(report + ".tmp", report)
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(report):
        if time.monotonic() > deadline:
            raise SystemExit("rank 0's lone evaluate never finished")
        time.sleep(0.1)
with open(report) as f:
    lone = json.load(f)
rank, n = kmp.rank(), kmp.size()  # the first collective, on every rank


def generator(xs, ys):
    for i in range(0, len(xs), BATCH):
        yield xs[i : i + BATCH], ys[i : i + BATCH]


def unknown(xs, ys):
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BATCH)
    return ds.filter(lambda a, b: True)  # cardinality unknown


# Each kind: (validation/evaluate input factory, the data it holds).
kinds = {
    "numpy": (lambda: (xv, yv), (xv, yv)),
    "tf.data": (
        lambda: tf.data.Dataset.from_tensor_slices((xv, yv)).batch(BATCH),
        (xv, yv),
    ),
    "tf.data-unknown": (lambda: unknown(xv, yv), (xv, yv)),
    "PyDataset": (lambda: Batches(xv, yv, BATCH), (xv, yv)),
    "generator": (lambda: generator(xv, yv), (xv, yv)),
    "tiny-numpy": (lambda: (xt, yt), (xt, yt)),
    "tiny-unknown": (lambda: unknown(xt, yt), (xt, yt)),
    "tiny-PyDataset": (lambda: Batches(xt, yt, BATCH), (xt, yt)),
}

xs, ys = kmp.shard(x, y, batch_size=BATCH)
results = {"lone": {"evaluate": lone, "ref": reference(model, xv, yv)["logs"]}}
for name, (make, (vx, vy)) in kinds.items():
    val = make()
    hist = fit_in_order(
        model,
        xs,
        ys,
        batch_size=BATCH,
        epochs=1,
        validation_data=val,
        validation_batch_size=BATCH,
    )
    fit_val = {k[4:]: v[-1] for k, v in hist.history.items() if k.startswith("val_")}
    fit_counts = auc_counts(model)
    ref = reference(model, vx, vy)
    val = make()
    kw = {"x": val[0], "y": val[1]} if isinstance(val, tuple) else {"x": val}
    got = model.evaluate(**kw, batch_size=BATCH, verbose=0, return_dict=True)
    results[name] = {
        "fit": fit_val,
        "fit_auc_counts": fit_counts,
        "evaluate": got,
        "evaluate_auc_counts": auc_counts(model),
        "ref": ref,
    }

# validation_split of the same (unsharded) data on every rank: the tail is
# the same everywhere, so it is split over the ranks.
hist = fit_in_order(model, x, y, batch_size=BATCH, epochs=1, validation_split=0.25)
split_at = int(math.ceil(len(x) * 0.75))
results["validation_split"] = {
    "fit": {k[4:]: v[-1] for k, v in hist.history.items() if k.startswith("val_")},
    "fit_auc_counts": auc_counts(model),
    "ref": reference(model, x[split_at:], y[split_at:]),
}
# validation_split of sharded data: each rank validates its own tail; the
# logs describe the union of the tails.
hist = fit_in_order(model, xs, ys, batch_size=BATCH, epochs=1, validation_split=0.25)
own_at = int(math.ceil(len(xs) * 0.75))
tails = kmp.allgather(xs[own_at:]), kmp.allgather(ys[own_at:])
results["validation_split-sharded"] = {
    "fit": {k[4:]: v[-1] for k, v in hist.history.items() if k.startswith("val_")},
    "fit_auc_counts": auc_counts(model),
    "ref": reference(model, *tails),
}

# 3. The same evaluate, together and with rank 0 arriving late.
timing = {}
for name in ("numpy", "tf.data-unknown"):
    make = kinds[name][0]
    runs = []
    for late in (False, True):
        kmp.barrier()
        if late and rank == 0:
            time.sleep(float(os.environ["KERAS_MPFP16_EVALUATE_WAIT"]) + 1.5)
        val = make()
        kw = {"x": val[0], "y": val[1]} if isinstance(val, tuple) else {"x": val}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logs = model.evaluate(**kw, batch_size=BATCH, verbose=0, return_dict=True)
        notes = [str(w.message) for w in caught if "alone" in str(w.message)]
        runs.append({"logs": logs, "counts": auc_counts(model), "notes": notes})
    timing[name] = {"runs": runs, "ref": reference(model, xv, yv)}
results["timing"] = timing
print(json.dumps({"rank": rank, "size": n, "results": results}), flush=True)
