"""KerasTuner's getting-started search as one job under mpirun.

    mpirun -np 2 python examples/keras_tuner_search.py [--out DIR]

keras.io's "Getting started with KerasTuner" (RandomSearch over a Dense
layer's units and Adam's learning rate, 3 trials x 2 executions,
`get_best_models`, `get_best_hyperparameters`, a retrain on all data) as a
new user writes it, on 600 generated digit-like 28x28 images with batch 32
(the last batch partial, as in issue 28), plus:

- the README's three lines (`kmp.shard`, `kmp.DistributedOptimizer`);
- `seed=1` for the tuner (every rank draws the same models);
- the tuner's `directory` on rank 0, a rank-local temporary one elsewhere
  (rank 0 alone writes the project);
- `kmp.root_stdout_only()`: KerasTuner's own `print` output once.

Needs `pip install keras-tuner tensorboard` (KerasTuner imports TensorBoard
with TensorFlow). Prints one JSON line (rank 0) with the trials, the best
hyperparameters, the best model's input shape and the retrain's loss. See
docs/frameworks.md.
"""

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_tuner  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default="keras_tuner_search", help="the tuner's directory")
args = parser.parse_args()
kmp.root_stdout_only()
start = time.monotonic()

# Digit-like data: a blurred stroke per class plus noise, 28x28x1.
rng = np.random.default_rng(0)
templates = rng.random((10, 28, 28, 1)).astype("float32")
y_all = rng.integers(0, 10, size=700)
x_all = (templates[y_all] + 0.5 * rng.random((700, 28, 28, 1))).astype("float32")
y_all = keras.utils.to_categorical(y_all, 10)
x_train, y_train = x_all[:600], y_all[:600]
x_val, y_val = x_all[600:], y_all[600:]
x_train, y_train = kmp.shard(x_train, y_train)


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


directory = args.out if kmp.rank() == 0 else tempfile.mkdtemp(prefix="tuning-")
tuner = keras_tuner.RandomSearch(
    hypermodel=build_model,
    objective="val_accuracy",
    max_trials=3,
    executions_per_trial=2,
    overwrite=True,
    directory=directory,
    project_name="helloworld",
    seed=1,
)
tuner.search_space_summary()
tuner.search(x_train, y_train, epochs=2, validation_data=(x_val, y_val))
models = tuner.get_best_models(num_models=2)
best_model = models[0]
best_model.summary()
tuner.results_summary()

best_hps = tuner.get_best_hyperparameters(5)
model = build_model(best_hps[0])
x_retrain, y_retrain = kmp.shard(x_all, y_all)
history = model.fit(x_retrain, y_retrain, epochs=1)

kmp.print_once(
    json.dumps(
        {
            "ranks": kmp.size(),
            "trials": [
                {"id": t.trial_id, "values": t.hyperparameters.values, "score": t.score}
                for t in sorted(tuner.oracle.trials.values(), key=lambda t: t.trial_id)
            ],
            "best": best_hps[0].values,
            "best_model_inputs": [list(t.shape) for t in best_model.inputs],
            "retrain_loss": history.history["loss"][-1],
            "seconds": round(time.monotonic() - start, 1),
        }
    )
)
