"""keras.io's "Bidirectional LSTM on IMDB", unmodified, on the synthetic stand-in.

The single-process baseline of `imdb_job.py`: no keras_mpfp16 import, the
model and training call of keras.io's example (Embedding 20000x128, two
bidirectional LSTM(64), batch 32, Adam, one epoch, the 25,000 test reviews as
validation data), on `examples/imdb_synthetic.py` instead of the download.
Prints the phase timings as one JSON line. An optional argument names a
folder with a `load.py` drop-in for `keras.datasets.imdb.load_data` (the real
reviews: ../shared/data/imdb) to use instead of the stand-in.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import imdb_synthetic  # noqa: E402
import keras  # noqa: E402
from keras import layers  # noqa: E402

max_features = 20000  # Only consider the top 20k words
maxlen = 200  # Only consider the first 200 words of each movie review

inputs = keras.Input(shape=(None,), dtype="int32")
x = layers.Embedding(max_features, 128)(inputs)
x = layers.Bidirectional(layers.LSTM(64, return_sequences=True))(x)
x = layers.Bidirectional(layers.LSTM(64))(x)
outputs = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, outputs)

if len(sys.argv) > 1 and sys.argv[1] != "synthetic":
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "imdb_dir_load", os.path.join(sys.argv[1], "load.py")
    )
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    keras.datasets.imdb.load_data = loader.load_data
    (x_train, y_train), (x_val, y_val) = keras.datasets.imdb.load_data(
        num_words=max_features
    )
else:
    (x_train, y_train), (x_val, y_val) = imdb_synthetic.load_data(
        num_words=max_features
    )
x_train = keras.utils.pad_sequences(x_train, maxlen=maxlen)
x_val = keras.utils.pad_sequences(x_val, maxlen=maxlen)

model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
timer = imdb_synthetic.PhaseTimer()
history = model.fit(
    x_train,
    y_train,
    batch_size=32,
    epochs=1,
    validation_data=(x_val, y_val),
    callbacks=[timer],
    verbose=2,
)
timer.report(val_accuracy=history.history["val_accuracy"][-1], ranks=1)
