"""KerasTuner's getting-started search as one job under mpirun (issue 28, item 3).

Run as `mpirun -np N python keras_tuner_search.py OUT_DIR MODE` (N = 1 is
the one-process reference). keras.io's KerasTuner "Getting started":
`RandomSearch` over the units of a Dense layer and Adam's learning rate,
3 trials x 2 executions, `get_best_models`, `get_best_hyperparameters` and
a retrain of the best hyperparameters, with the README's three lines
(`kmp.shard`, `kmp.DistributedOptimizer`) and the settings
docs/frameworks.md gives:

- the tuner's `directory` on rank 0, a rank-local temporary one elsewhere,
  so only rank 0 writes the project (one writer, as in one process);
- `KERAS_MPFP16_ROOT_STDOUT_ONLY=1` (set by the test) for KerasTuner's own
  `print` output.

MODE `seeded`: `seed=1` for the tuner and `keras.utils.set_random_seed(1)`;
per-rank batches of 48 // N rows, unshuffled, so every step is one
process's step with batches of 48. MODE `unseeded`: neither seed; the ranks
draw different models; a trial whose models differ stops with the library's
model-signature error naming the cause.

Every rank writes OUT_DIR/record-<rank>.json (its stdout may be silenced).
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_tuner  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
rank, n = kmp.rank(), kmp.size()
seeded = mode == "seeded"
if seeded:
    keras.utils.set_random_seed(1)

# Digit-like data: 8x8 "images", 10 classes from a fixed linear rule.
rng = np.random.default_rng(0)
w = rng.normal(size=(64, 10))
x_all = rng.random((600, 8, 8, 1), dtype=np.float32)
y_all = keras.utils.to_categorical(np.argmax(x_all.reshape(600, 64) @ w, axis=1), 10)
x_train, y_train = x_all[:480], y_all[:480]
x_val, y_val = x_all[480:], y_all[480:]

B = 48 // n  # per rank: the ranks' k-th batches together are one process's
x_train, y_train = kmp.shard(x_train, y_train, batch_size=B)


def build_model(hp):
    model = keras.Sequential()
    model.add(layers.Flatten())
    model.add(
        layers.Dense(
            units=hp.Int("units", min_value=32, max_value=512, step=32),
            activation="relu",
        )
    )
    model.add(layers.Dense(10, activation="softmax"))
    model.compile(
        optimizer=kmp.DistributedOptimizer(
            keras.optimizers.Adam(
                learning_rate=hp.Choice("learning_rate", values=[1e-2, 1e-3, 1e-4])
            )
        ),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


root_dir = os.path.join(out_dir, "tuning")
directory = root_dir if rank == 0 else tempfile.mkdtemp(prefix=f"tuning-rank{rank}-")
record = {"rank": rank, "size": n, "mode": mode}


def write_record():
    with open(os.path.join(out_dir, f"record-{rank}.json"), "w") as f:
        json.dump(record, f)


tuner = keras_tuner.RandomSearch(
    hypermodel=build_model,
    objective="val_accuracy",
    max_trials=3,
    executions_per_trial=2,
    overwrite=True,
    directory=directory,
    project_name="helloworld",
    seed=1 if seeded else None,
)
try:
    tuner.search(
        x_train,
        y_train,
        batch_size=B,
        shuffle=False,
        epochs=1,
        validation_data=(x_val, y_val),
    )
except ValueError as exc:
    record["error"] = str(exc)
    write_record()
    raise

trials = tuner.oracle.get_best_trials(num_trials=3)
record["trials"] = sorted(
    (
        {"id": t.trial_id, "values": t.hyperparameters.values, "score": t.score}
        for t in trials
    ),
    key=lambda t: t["id"],
)
best_hps = tuner.get_best_hyperparameters(5)
record["best_values"] = best_hps[0].values

models = tuner.get_best_models(num_models=2)
best_model = models[0]
best_model.summary()
record["best_build_config"] = json.loads(
    json.dumps(best_model.get_build_config(), default=list)
)
record["best_call_shape"] = list(np.asarray(best_model(x_val[:5])).shape)

model = build_model(best_hps[0])
history = model.fit(
    *kmp.shard(x_all, y_all, batch_size=B), batch_size=B, shuffle=False, epochs=1
)
record["retrain_loss"] = history.history["loss"][-1]

kmp.barrier()  # rank 0's project is complete
if rank == 0:
    files, torn = [], []
    for base, _, names in os.walk(root_dir):
        for name in names:
            path = os.path.join(base, name)
            files.append(os.path.relpath(path, root_dir))
            if name.endswith(".json"):
                try:
                    with open(path) as f:
                        json.load(f)
                except ValueError as exc:
                    torn.append(f"{path}: {exc}")
    record["files"] = sorted(files)
    record["torn"] = torn
write_record()
