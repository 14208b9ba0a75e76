"""What the convergence scripts share: data, model, one training run, statistics.

`train_run` is the one training function of the N-worker study. It runs in
two modes with the same code:

- simulated (plain `python`, one process): N workers of per-worker batch b
  are one process with batch N*b and `LearningRateScaler(num_workers=N)`;
- real (`mpirun -np N`): each rank trains on its `kmp.shard` with batch b,
  gradients averaged by `kmp.DistributedOptimizer`.

Why the two are the same training: with equal per-rank batches, the average
over ranks of the per-rank mean gradients is the mean gradient over the
union of the batches, i.e. the global batch of N*b rows; so every update
(and the optimizer state it leaves) is the one-process update on that
batch. `kmp.shard(..., batch_size=b)` deals rows so that the k-th batch of
all ranks together is rows [k*N*b, (k+1)*N*b), exactly the one process's
k-th batch (without shuffling). `equivalence.py` checks it.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shots  # noqa: E402  (examples/shots.py)

MACHINE = "2-core x86-64 CPU, TF 2.21, Keras 3.15.1"

# Rule name in the study -> LearningRateScaler arguments. The first five
# are the study's; the last two add the warmup to the other growing rules.
RULES = {
    "none": dict(rule="none"),
    "linear": dict(rule="linear"),
    "linear+warmup": dict(rule="linear", warmup=True),
    "sqrt": dict(rule="sqrt"),
    "paper": dict(rule="paper"),
    "sqrt+warmup": dict(rule="sqrt", warmup=True),
    "paper+warmup": dict(rule="paper", warmup=True),
}
STUDY_RULES = ["none", "linear", "linear+warmup", "sqrt", "paper"]


def shot_windows(num_shots, length, seed, strength):
    """(x, y): equal-length synthetic shots, y = 1 for disruptive shots."""
    data = shots.generate_shots(
        num_shots,
        min_length=length,
        max_length=length,
        horizon=length // 2,
        precursor_strength=strength,
        seed=seed,
    )
    return data.stacked(), data.disruptive.astype("float32")[:, None]


def build_model(length, features, units):
    """One LSTM layer and a sigmoid on its last output (float32 policy)."""
    return keras.Sequential(
        [
            keras.Input((length, features)),
            kmp.layers.LSTM(units),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


class BatchLosses(keras.callbacks.Callback):
    """Records every batch's logged loss and learning rate."""

    def __init__(self):
        super().__init__()
        self.losses, self.rates = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        self.rates.append(float(logs.get("learning_rate", float("nan"))))


def train_run(
    x,
    y,
    *,
    workers,
    batch,
    rule,
    warmup_epochs,
    epochs,
    learning_rate,
    momentum,
    units,
    seed,
    shuffle=True,
):
    """Trains one model; returns (model, BatchLosses, seconds, diverged).

    Under `mpirun` (kmp.size() > 1) this rank trains on its shard with batch
    `batch`; `workers` must equal the number of ranks. In one process it
    simulates `workers` workers: batch `workers * batch`, the rule's factor
    for `workers`.
    """
    distributed = kmp.size() > 1
    if distributed:
        if workers != kmp.size():
            raise ValueError(f"workers={workers} but {kmp.size()} ranks are running.")
        x, y = kmp.shard(x, y, batch_size=batch)
        process_batch = batch
    else:
        process_batch = workers * batch
    keras.utils.set_random_seed(seed)
    model = build_model(x.shape[1], x.shape[2], units)
    model.compile(
        optimizer=kmp.DistributedOptimizer(
            keras.optimizers.SGD(learning_rate, momentum=momentum)
        ),
        loss="binary_crossentropy",
    )
    record = BatchLosses()
    callbacks = [
        record,
        kmp.callbacks.GlobalMetrics(),
        kmp.callbacks.LearningRateScaler(
            rule=rule,
            warmup_epochs=warmup_epochs,
            num_workers=None if distributed else workers,
        ),
    ]
    started = time.time()
    diverged = False
    try:
        model.fit(
            x,
            y,
            batch_size=process_batch,
            epochs=epochs,
            shuffle=shuffle,
            callbacks=callbacks,
            verbose=0,
        )
    except Exception as error:  # noqa: BLE001  non-finite gradients for 10 steps
        if "non-finite" not in str(error).lower():
            raise
        diverged = True
    return model, record, time.time() - started, diverged


def evaluate(model, x, y):
    """(test AUC, test accuracy at 0.5); NaN AUC if the outputs are not finite."""
    p = np.asarray(model.predict(x, batch_size=4096, verbose=0), "float64")[:, 0]
    if not np.all(np.isfinite(p)):
        return float("nan"), float("nan")
    accuracy = float(np.mean((p > 0.5) == (y[:, 0] > 0.5)))
    return shots.roc_auc(p, y[:, 0]), accuracy


def mean_std(values):
    """(mean, sample std, n) of the finite values; NaN std for fewer than 2."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return float("nan"), float("nan"), 0
    std = statistics.stdev(values) if len(values) > 1 else float("nan")
    return statistics.fmean(values), std, len(values)
