"""keras.io's time-series classifier (Conv1D + BatchNormalization) with the
README's three lines, as a new user runs it (issue 38, "Done when").

`mpirun -np N python conv1d_script.py OUT_DIR`: stock `ModelCheckpoint`
(`save_best_only`), `ReduceLROnPlateau`, `EarlyStopping` on every rank,
`validation_split`, `verbose=1`; then `load_model` of the best checkpoint
right after `fit` and `evaluate` on every rank. One seed for the script (the
same on every rank: the test's accuracy floor must not depend on chance). Each rank
prints one JSON line with what the test compares:

- the weights after `fit` and of the checkpoint loaded right after it (and
  again after a barrier), as digests;
- `ModelCheckpoint.best` against one process evaluating the loaded model on
  the union of the ranks' validation tails;
- the split `evaluate` of the loaded model against one process's `evaluate`
  of the same weights (plain Keras model) on the whole test set;
- the test accuracy of a one-process run of the same script (plain
  optimizer, the global batch, rank 0's initial weights) for comparison.
"""

import json
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import digest  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

os.chdir(sys.argv[1])
rank, n = kmp.rank(), kmp.size()
keras.utils.set_random_seed(11)
T, BATCH, EPOCHS = 64, 16, 20


def make_data(rows, seed):
    """Two classes of noisy series: a slow sine or a faster one."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    t = np.arange(T)[None, :]
    phase = rng.uniform(0, 2 * np.pi, (rows, 1))
    freq = np.where(labels[:, None] == 1, 2.0, 5.0)
    x = np.sin(2 * np.pi * freq * t / T + phase) + rng.normal(0, 0.7, (rows, T))
    return x[..., None].astype("float32"), labels.astype("int32")


x_train, y_train = make_data(200 * n, 1)
x_test, y_test = make_data(300, 2)


def make_model():
    inputs = keras.Input((T, 1))
    h = inputs
    for _ in range(2):
        h = keras.layers.Conv1D(16, 5, padding="same")(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(2, activation="softmax")(h)
    return keras.Model(inputs, outputs)


def compile_(m, optimizer):
    m.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )


def callbacks_():
    return [
        keras.callbacks.ModelCheckpoint(
            "best_model.keras", save_best_only=True, monitor="val_loss"
        ),
        keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=2, min_lr=0.0001
        ),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=4, verbose=1),
    ]


model = make_model()
initial = kmp.broadcast([np.asarray(w) for w in model.get_weights()])
compile_(model, kmp.DistributedOptimizer(keras.optimizers.Adam(0.01)))  # line 2
xs, ys = kmp.shard(x_train, y_train)  # line 3 (into new names)
callbacks = callbacks_()
history = model.fit(
    xs,
    ys,
    batch_size=BATCH,
    epochs=EPOCHS,
    callbacks=callbacks,
    validation_split=0.2,
    verbose=1,
)
fitted = digest(model.weights)

model = keras.models.load_model("best_model.keras")
loaded_right_after = digest(model.weights)
test_loss, test_acc = model.evaluate(x_test, y_test, verbose=1)
kmp.print_once("Test accuracy", test_acc)
kmp.print_once("Test loss", test_loss)
kmp.barrier()
loaded_after_barrier = digest(keras.models.load_model("best_model.keras").weights)

# One process, same weights: the loaded checkpoint in a plain Keras model.
plain = make_model()
plain.set_weights(model.get_weights())
compile_(plain, keras.optimizers.Adam(0.01))
ref_test = plain.evaluate(x_test, y_test, verbose=0, return_dict=True)
split_at = int(math.floor(len(xs) * (1.0 - 0.2)))  # Keras's validation_split
tails = kmp.runtime.allgather_object((xs[split_at:], ys[split_at:]))
vx = np.concatenate([t[0] for t in tails])
vy = np.concatenate([t[1] for t in tails])
ref_val = plain.evaluate(vx, vy, verbose=0, return_dict=True)

# One process, the same script: the global batch, rank 0's initial weights;
# on rank 0 only (the test reads rank 0's figure; every rank training it
# too only made the job slower).
one_process_acc = ref_val_losses = None
if rank == 0:
    ref = make_model()
    ref.set_weights(initial)
    compile_(ref, keras.optimizers.Adam(0.01))
    keras.utils.set_random_seed(7)
    ref_callbacks = callbacks_()
    ref_callbacks[0] = keras.callbacks.ModelCheckpoint(
        f"ref_best.{rank}.keras", save_best_only=True, monitor="val_loss"
    )
    ref_history = ref.fit(
        x_train,
        y_train,
        batch_size=BATCH * n,
        epochs=EPOCHS,
        callbacks=ref_callbacks,
        validation_split=0.2,
        verbose=0,
    )
    ref_best = keras.models.load_model(f"ref_best.{rank}.keras")
    ref_acc = ref_best.evaluate(x_test, y_test, verbose=0, return_dict=True)
    one_process_acc = float(ref_acc["sparse_categorical_accuracy"])
    ref_val_losses = ref_history.history["val_loss"]

print(
    json.dumps(
        {
            "rank": rank,
            "epochs": len(history.history["loss"]),
            "lrs": [float(v) for v in history.history.get("learning_rate", [])],
            "fitted": fitted,
            "loaded_right_after": loaded_right_after,
            "loaded_after_barrier": loaded_after_barrier,
            "best": float(callbacks[0].best),
            "ref_val_loss": float(ref_val["loss"]),
            "test_loss": float(test_loss),
            "test_acc": float(test_acc),
            "ref_test": {k: float(v) for k, v in ref_test.items()},
            "one_process_acc": one_process_acc,
            "val_loss": history.history["val_loss"],
            "ref_val_losses": ref_val_losses,
        }
    ),
    flush=True,
)
