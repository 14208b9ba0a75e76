"""IMDB sentiment with a bidirectional LSTM: a plain Keras script, made data-parallel.

The IMDB benchmark of Svyatkovskiy et al. (2017), as in keras.io's
"Bidirectional LSTM on IMDB": an embedding, two bidirectional LSTMs and a
sigmoid output. The lines marked `# kmp` are the whole change from the
single-process script (the README's three lines); everything else is plain
Keras. Run it with or without MPI:

    python examples/imdb_lstm.py                          # one process
    mpirun -np 4 python examples/imdb_lstm.py             # four ranks
    python examples/imdb_lstm.py --policy mixed_float16   # mixed precision
    python examples/imdb_lstm.py --data imdb.npz          # a local copy
    python examples/imdb_lstm.py --data synthetic         # no download
    python examples/imdb_lstm.py --data ../shared/data/imdb   # a load.py drop-in

Data: `keras.datasets.imdb` (downloaded on first use), or with `--data` a
local `.npz` in the layout of Keras's `imdb.npz`: `x_train`, `y_train`,
`x_test`, `y_test`, the x arrays object arrays of word-index lists (1 = the
most frequent word). It is read exactly as `keras.datasets.imdb.load_data`
reads its own file. `--data DIR` takes a folder holding a `load.py` whose
`load_data(num_words=...)` is a drop-in for Keras's (the project's offline
copy of the real reviews has one). `--data synthetic` uses `examples/imdb_synthetic.py`, a
same-shape stand-in with a learnable sentiment signal (25,000 + 25,000
reviews). Prints the validation accuracy after the last epoch (rank 0).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402  # kmp

try:  # run as a script (examples/ on sys.path) or imported from the repo root
    import imdb_synthetic  # noqa: E402
except ImportError:  # pragma: no cover
    from examples import imdb_synthetic  # noqa: E402

LSTM_LAYERS = {"keras": layers.LSTM, "kmp": kmp.layers.LSTM}


def load_imdb_npz(path, num_words, seed=113, start_char=1, oov_char=2, index_from=3):
    """`keras.datasets.imdb.load_data(num_words=...)` applied to a local file.

    Same shuffle, start character, index offset and out-of-vocabulary rule,
    so a copy of Keras's `imdb.npz` gives exactly Keras's arrays. The x
    arrays are object arrays, which numpy stores pickled: load only files
    you trust.
    """
    with np.load(path, allow_pickle=True) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]
    rng = np.random.RandomState(seed)
    indices = np.arange(len(x_train))
    rng.shuffle(indices)
    x_train, y_train = x_train[indices], y_train[indices]
    indices = np.arange(len(x_test))
    rng.shuffle(indices)
    x_test, y_test = x_test[indices], y_test[indices]

    def encode(reviews):
        return [
            [start_char]
            + [w + index_from if w + index_from < num_words else oov_char for w in r]
            for r in reviews
        ]

    return (encode(x_train), y_train), (encode(x_test), y_test)


def load_imdb_dir(path, num_words):
    """`load_data(num_words=...)` of the `load.py` in folder `path`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "imdb_dir_load", os.path.join(path, "load.py")
    )
    if spec is None or not os.path.exists(spec.origin):
        raise FileNotFoundError(f"--data {path!r}: no load.py in that folder")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_data(num_words=num_words)


def load(data, num_words, sentiment_rate=0.05):
    """The (train, validation) pairs for `--data` (see the module docstring)."""
    if data == "synthetic":
        return imdb_synthetic.load_data(
            num_words=num_words, sentiment_rate=sentiment_rate
        )
    if data and os.path.isdir(data):
        return load_imdb_dir(data, num_words)
    if data:
        return load_imdb_npz(data, num_words)
    return keras.datasets.imdb.load_data(num_words=num_words)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--data",
        metavar="PATH",
        help="local imdb.npz, a folder with a load.py, or 'synthetic' "
        "(default: download)",
    )
    p.add_argument(
        "--sentiment-rate",
        type=float,
        default=0.05,
        help="with --data synthetic: share of sentiment words per review",
    )
    p.add_argument("--max-features", type=int, default=20000, help="vocabulary size")
    p.add_argument("--maxlen", type=int, default=200, help="words kept per review")
    p.add_argument("--embedding", type=int, default=128, help="embedding width")
    p.add_argument("--units", type=int, default=64, help="LSTM units per direction")
    p.add_argument(
        "--lstm",
        choices=sorted(LSTM_LAYERS),
        default="keras",
        help="keras.layers.LSTM or keras_mpfp16.layers.LSTM (float32 carry)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--policy",
        default="float32",
        choices=["float32", "mixed_float16", "mixed_bfloat16"],
    )
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument(
        "--lr-rule",
        choices=["none", "linear", "sqrt", "paper"],
        default="none",
        help="scale Adam's learning rate for N workers with "
        "kmp.callbacks.LearningRateScaler (not one of the three lines)",
    )
    p.add_argument(
        "--report-json",
        action="store_true",
        help="print one JSON line of phase timings (benchmarks)",
    )
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    keras.config.set_dtype_policy(args.policy)
    keras.utils.set_random_seed(args.seed)
    (x_train, y_train), (x_val, y_val) = load(
        args.data, args.max_features, args.sentiment_rate
    )
    x_train = keras.utils.pad_sequences(x_train, maxlen=args.maxlen)
    x_val = keras.utils.pad_sequences(x_val, maxlen=args.maxlen)
    x_train, y_train = kmp.shard(x_train, y_train)  # kmp

    lstm = LSTM_LAYERS[args.lstm]
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(args.max_features, args.embedding)(inputs)
    x = layers.Bidirectional(lstm(args.units, return_sequences=True))(x)
    x = layers.Bidirectional(lstm(args.units))(x)
    # A float32 output layer, as Keras's mixed-precision guide recommends.
    outputs = layers.Dense(1, activation="sigmoid", dtype="float32")(x)
    model = keras.Model(inputs, outputs)
    model.summary()

    model.compile(
        optimizer=kmp.DistributedOptimizer("adam"),  # kmp
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    timer = imdb_synthetic.PhaseTimer() if args.report_json else None
    callbacks = [timer] if timer else []
    if args.lr_rule != "none":
        callbacks.append(kmp.callbacks.LearningRateScaler(rule=args.lr_rule))
    history = model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(x_val, y_val),
        callbacks=callbacks,
    )
    accuracy = history.history["val_accuracy"][-1]
    if kmp.is_root():
        print(
            f"validation accuracy: {accuracy:.4f} ({len(x_val)} reviews, "
            f"{kmp.size()} ranks, policy {args.policy})"
        )
        if timer:
            timer.report(val_accuracy=accuracy, ranks=kmp.size())
    return accuracy


if __name__ == "__main__":
    main()
