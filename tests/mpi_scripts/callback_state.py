"""The state of stock file-writing callbacks on every rank (issue 19, item 3).

Run as `mpirun -np N python callback_state.py OUT_DIR`. A one-process user
script with `ModelCheckpoint(save_best_only=True)` (and a batch-frequency
one), `CSVLogger(append=True)`, `BackupAndRestore`, `RemoteMonitor`,
`AtomicModelCheckpoint` and a `root_only(ModelCheckpoint)`, all left on
every rank; unseeded ranks. After `fit` every rank reads `float(ck.best)`
and prints the callbacks' attributes, next to the same callbacks' after
one process's `fit` (computed here from rank 0's initial weights on the
concatenated batches). Rank 0 also reports what was written.
"""

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out_dir = sys.argv[1]
rank, n = kmp.rank(), kmp.size()
B, STEPS, EPOCHS = 4, 5, 4
PLAIN = (bool, int, float, str, type(None))


def attributes(cb, private=False) -> dict:
    """A callback's attributes as JSON (objects by type name)."""
    out = {}
    for k, v in sorted(vars(cb).items()):
        if k.startswith("_") != private or k in ("model", "_model"):
            continue
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, PLAIN):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(e, PLAIN) for e in v):
            out[k] = list(v)
        elif isinstance(v, dict) and all(isinstance(e, PLAIN) for e in v.values()):
            out[k] = dict(v)
        elif not private:
            out[k] = type(v).__name__
    return out


def make_callbacks(directory):
    os.makedirs(directory, exist_ok=True)
    csv_path = os.path.join(directory, "log.csv")
    if rank == 0 or directory.endswith(f"ref-{rank}"):
        with open(csv_path, "w") as f:  # an earlier run's header: append to it
            f.write("epoch,loss,val_loss\n")
    kmp.barrier()
    best = keras.callbacks.ModelCheckpoint(
        os.path.join(directory, "best.keras"), monitor="val_loss", save_best_only=True
    )
    batchly = keras.callbacks.ModelCheckpoint(
        os.path.join(directory, "b-{epoch}.weights.h5"),
        save_weights_only=True,
        save_freq=3,
    )
    wrapped = keras.callbacks.ModelCheckpoint(
        os.path.join(directory, "wrapped.keras"), save_best_only=True
    )
    return {
        "best": best,
        "batchly": batchly,
        "csv": keras.callbacks.CSVLogger(csv_path, append=True),
        "backup": keras.callbacks.BackupAndRestore(os.path.join(directory, "bk")),
        "remote": keras.callbacks.RemoteMonitor(root="http://127.0.0.1:9"),
        "atomic": kmp.callbacks.AtomicModelCheckpoint(
            os.path.join(directory, "atomic.keras"),
            monitor="val_loss",
            save_best_only=True,
        ),
        "wrapped": wrapped,
        "early": keras.callbacks.EarlyStopping(monitor="val_loss", patience=100),
    }


def for_fit(cbs):
    wrapped = kmp.callbacks.root_only(cbs["wrapped"])
    return [wrapped if k == "wrapped" else cb for k, cb in cbs.items()]


def model_fn():
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


rng = np.random.default_rng(3)  # the same data on every rank
x = rng.normal(size=(STEPS * n * B, 6)).astype("float32")
y = (x[:, 0] - x[:, 1] > 0).astype("float32")
xv = rng.normal(size=(26, 6)).astype("float32")
yv = (xv[:, 0] - xv[:, 1] > 0).astype("float32")

keras.utils.set_random_seed(1000 + rank)
model = model_fn()
root_initial = kmp.broadcast([np.asarray(w) for w in model.get_weights()])
model.compile(
    optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.5)),
    loss="binary_crossentropy",
)
run_dir = os.path.join(out_dir, "run")
cbs = make_callbacks(run_dir)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # RemoteMonitor: nothing listens there
    model.fit(
        *kmp.shard(x, y, batch_size=B),
        batch_size=B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=(xv, yv),
        callbacks=for_fit(cbs),
    )
# What a one-process script does next: read the best value.
best = float(cbs["best"].best)

# One process: rank 0's initial weights, the concatenated batches.
ref = model_fn()
ref.set_weights(root_initial)
ref.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
ref_cbs = make_callbacks(os.path.join(out_dir, f"ref-{rank}"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ref.fit(
        x,
        y,
        batch_size=n * B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=(xv, yv),
        validation_batch_size=B,
        callbacks=list(ref_cbs.values()),
    )

kmp.barrier()  # rank 0's files are complete
written = None
if rank == 0:
    with open(os.path.join(run_dir, "log.csv")) as f:
        csv_lines = f.read().splitlines()
    written = {"files": sorted(os.listdir(run_dir)), "csv_lines": csv_lines}
print(
    json.dumps(
        {
            "rank": rank,
            "size": n,
            "best": best,
            "public": {k: attributes(cb) for k, cb in cbs.items()},
            "private": {k: attributes(cb, private=True) for k, cb in cbs.items()},
            "ref_public": {k: attributes(cb) for k, cb in ref_cbs.items()},
            "ref_private": {
                k: attributes(cb, private=True) for k, cb in ref_cbs.items()
            },
            "written": written,
        }
    ),
    flush=True,
)
