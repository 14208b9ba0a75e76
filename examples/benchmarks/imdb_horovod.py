"""keras.io's "Bidirectional LSTM on IMDB" with Horovod's documented Keras adoption.

The Horovod side of `imdb_job.py`'s whole-job comparison: the model and
training call of `imdb_plain.py`, changed the way Horovod's Keras guide says
(horovod.readthedocs.io, "Horovod with Keras"):

  hvd.init(); every rank takes its 1/N of the training reviews;
  the optimizer wrapped in hvd.DistributedOptimizer, its learning rate
  scaled by hvd.size() (the guide's step; --no-lr-scaling leaves Adam's
  1e-3, as our three lines do); BroadcastGlobalVariablesCallback(0) and
  MetricAverageCallback; verbose and checkpoints on rank 0 only.

Validation stays whole on every rank (the guide evaluates the full set on
each worker; MetricAverageCallback then averages equal values). Runs in the
Horovod venv (`horovod_setup.sh`: TF 2.15, Keras 2), under
`mpirun -np N`. Prints the phase timings as one JSON line from rank 0.

    mpirun -np 2 .venv-horovod/bin/python examples/benchmarks/imdb_horovod.py \\
        --data synthetic
"""

import argparse
import importlib.util
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import horovod.tensorflow.keras as hvd  # noqa: E402
import imdb_synthetic  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras  # Keras 2 inside TF 2.15, the Keras Horovod hooks
layers = keras.layers


def load(data, num_words):
    if data == "synthetic":
        return imdb_synthetic.load_data(num_words=num_words)
    spec = importlib.util.spec_from_file_location(
        "imdb_dir_load", os.path.join(data, "load.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_data(num_words=num_words)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data", default="synthetic", help="'synthetic' or a load.py folder"
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--no-lr-scaling", action="store_true")
    p.add_argument(
        "--samples", type=int, help="keep the first N train and validation reviews"
    )
    args = p.parse_args()

    hvd.init()
    max_features, maxlen = 20000, 200
    keras.utils.set_random_seed(1337)

    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(max_features, 128)(inputs)
    x = layers.Bidirectional(layers.LSTM(64, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(64))(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, outputs)

    (x_train, y_train), (x_val, y_val) = load(args.data, max_features)
    x_train = keras.utils.pad_sequences(x_train, maxlen=maxlen)
    x_val = keras.utils.pad_sequences(x_val, maxlen=maxlen)
    if args.samples:
        x_train, y_train = x_train[: args.samples], y_train[: args.samples]
        x_val, y_val = x_val[: args.samples], y_val[: args.samples]
    # Each rank its 1/N of the training set (equal parts, as kmp.shard).
    per_rank = len(x_train) // hvd.size()
    start = hvd.rank() * per_rank
    x_train = x_train[start : start + per_rank]
    y_train = y_train[start : start + per_rank]

    lr = 1e-3 if args.no_lr_scaling else 1e-3 * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr))
    model.compile(
        optimizer=opt,
        loss="binary_crossentropy",
        metrics=["accuracy"],
        experimental_run_tf_function=False,
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ]
    timer = imdb_synthetic.PhaseTimer()
    callbacks.append(timer)
    if hvd.rank() == 0:
        checkpoint = os.path.join(tempfile.mkdtemp(), "best.h5")
        callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint))
    history = model.fit(
        x_train,
        y_train,
        batch_size=32,
        epochs=args.epochs,
        validation_data=(x_val, y_val),
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    if hvd.rank() == 0:
        timer.report(
            val_accuracy=float(history.history["val_accuracy"][-1]), ranks=hvd.size()
        )


if __name__ == "__main__":
    main()
