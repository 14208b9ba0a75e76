"""What the scripts in tests/mpi_scripts share: the usual data and model,
digests of variables, the JSON line each rank prints.

Each script runs as its own process (`mpirun ... python
tests/mpi_scripts/NAME.py`), so this directory is `sys.path[0]` there and
`import _common` finds this module. It imports Keras, then keras_mpfp16,
as the scripts themselves do (the sorted imports put it before the script's
own `import keras_mpfp16`): nothing else runs at its import.
"""

from __future__ import annotations

import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402


def binary_data(rng, rows: int, label=None) -> tuple[np.ndarray, np.ndarray]:
    """`rows` samples of 6 standard-normal float32 features drawn from `rng`
    and float32 0/1 labels: `label(x) > 0` (default `x[:, 0] - x[:, 3]`)."""
    x = rng.normal(size=(rows, 6)).astype("float32")
    score = x[:, 0] - x[:, 3] if label is None else label(x)
    return x, (score > 0).astype("float32")


def dense_bn_model(seed: int, optimizer) -> keras.Model:
    """The suite's small binary classifier on 6 features (Dense(8),
    BatchNormalization, ReLU, Dense(1, sigmoid)), built after
    `keras.utils.set_random_seed(seed)`, compiled with `optimizer` wrapped in
    `kmp.DistributedOptimizer`, binary cross-entropy and accuracy."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(
        optimizer=kmp.DistributedOptimizer(optimizer),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    return model


def compile_with_auc(model: keras.Model, optimizer, **more) -> None:
    """`model.compile` with `optimizer`, binary cross-entropy, accuracy and
    an AUC named "auc" (and the compile arguments `more`)."""
    model.compile(
        optimizer=optimizer,
        loss="binary_crossentropy",
        metrics=["accuracy", keras.metrics.AUC(name="auc")],
        **more,
    )


def digest(values) -> str:
    """16 hex digits of the SHA-256 of the values' bytes, in order."""
    h = hashlib.sha256()
    for v in values:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()[:16]


def state_digest(model: keras.Model) -> str:
    """`digest` of every model variable, then every optimizer variable."""
    return digest(list(model.variables) + list(model.optimizer.variables))


def h5_datasets(path: str) -> dict:
    """Every dataset of an HDF5 file (a `.weights.h5`), by name, as arrays."""
    import h5py

    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                found.__setitem__(name, np.array(obj))
                if isinstance(obj, h5py.Dataset)
                else None
            )
        )
    return found


def emit(record: dict) -> None:
    """Prints `record` as one JSON line (what `MPIResult.records` reads)."""
    print(json.dumps(record), flush=True)


def backup_position(backup_dir: str) -> tuple[int, int]:
    """(epoch, steps done in it) of the complete backup in `backup_dir`, from
    the library's resume record in Keras's `training_metadata.json`;
    (-1, -1) where there is none (yet)."""
    try:
        with open(os.path.join(backup_dir, "training_metadata.json")) as f:
            done = json.load(f)["keras_mpfp16"]
        return (done["epoch"], done["steps_done"])
    except (OSError, ValueError, KeyError):
        return (-1, -1)


class Batches(keras.utils.PyDataset):
    """`xs`, `ys` in batches of `batch` (the last one short), a PyDataset."""

    def __init__(self, xs, ys, batch):
        super().__init__()
        self.xs, self.ys, self.batch = xs, ys, batch

    def __len__(self):
        return -(-len(self.xs) // self.batch)

    def __getitem__(self, i):
        sl = slice(i * self.batch, (i + 1) * self.batch)
        return self.xs[sl], self.ys[sl]


def reference_gap(distributed: list, reference: list, initial: list) -> dict:
    """How a distributed run's weights compare with a one-process reference
    run's from the same `initial` weights: `max_rel_diff`, the largest
    difference relative to the reference's largest value, per weight;
    `moved`, how far the distributed weights moved from `initial` (a check
    that training did something)."""
    diffs = [
        float(np.max(np.abs(a - r)) / (np.max(np.abs(r)) + 1e-12))
        for a, r in zip(distributed, reference)
    ]
    moved = max(float(np.max(np.abs(a - i))) for a, i in zip(distributed, initial))
    return {"max_rel_diff": max(diffs), "moved": moved}


def fit_in_order(model: keras.Model, *args, **kwargs):
    """`model.fit(*args, shuffle=False, verbose=0, **kwargs)`: the batches in
    order (runs that should match can match bit for bit) and no progress
    output (the ranks' stdout carries the JSON lines)."""
    return model.fit(*args, shuffle=False, verbose=0, **kwargs)


class CountTestBatches(keras.callbacks.Callback):
    """How many test batches this rank evaluated (`batches`): with
    `evaluate` split over the ranks, about 1/N of them."""

    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_test_batch_end(self, batch, logs=None):
        self.batches += 1


def against_one_process(
    build, make_optimizer, whole, batch: int, micro: int = 1, **options
) -> dict:
    """The equivalence check: `build()` (the same weights on every rank)
    compiled with `kmp.DistributedOptimizer(make_optimizer(), **options)` and
    MSE, fitted 2 epochs in order in batches of `batch` on this rank's rows
    of the `whole` (x, y): these form blocks of `batch` rows, and block
    `i * size + rank` is this rank's i-th (`micro` of them per step with
    gradient accumulation); on rank 0, a one-process copy from the same
    initial weights, `make_optimizer()`, fitted on the `whole` (x, y) in
    global batches of `size * batch * micro`. Returns `{"rank"}` and, on
    rank 0, `reference_gap`."""
    rank, n = kmp.rank(), kmp.size()
    count = len(whole[0]) // (n * batch)
    mine = [i * n + rank for i in range(count)]
    rows = [
        a.reshape(count * n, batch, *a.shape[1:])[mine].reshape(-1, *a.shape[1:])
        for a in whole
    ]
    model = build()
    initial = model.get_weights()
    model.compile(
        optimizer=kmp.DistributedOptimizer(make_optimizer(), **options), loss="mse"
    )
    fit_in_order(model, *rows, batch_size=batch, epochs=2)
    distributed = model.get_weights()
    result = {"rank": rank}
    if rank == 0:
        ref = build()
        ref.set_weights(initial)
        ref.compile(optimizer=make_optimizer(), loss="mse")
        fit_in_order(ref, *whole, batch_size=n * batch * micro, epochs=2)
        result.update(reference_gap(distributed, ref.get_weights(), initial))
    return result


def run_record(model: keras.Model, history, epochs_run: list, **more) -> dict:
    """What a training script prints at its end, to compare a resumed run
    with an uninterrupted one: this rank, the epochs run, `history.history`,
    the `state_digest` and the optimizer's step count (and `more`)."""
    return {
        "rank": kmp.rank(),
        "epochs_run": epochs_run,
        **more,
        "history": history.history,
        "digest": state_digest(model),
        "iterations": int(model.optimizer.iterations.numpy()),
    }


def lstm_model_or_checkpoint(path: str, steps_per_epoch: int, resume: bool):
    """(model, first epoch): the `.keras` checkpoint at `path` and the epoch
    its optimizer's step count is in, when `resume`; else a new small LSTM
    regressor on (6, 3) inputs (seed 5 on every rank, Adam, MSE) and 0."""
    if resume:
        model = keras.models.load_model(path)
        return model, int(model.optimizer.iterations.numpy()) // steps_per_epoch
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((6, 3)), keras.layers.LSTM(8), keras.layers.Dense(1)]
    )
    model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss="mse")
    return model, 0
