"""keras.io's text classification from scratch, with the README's three lines,
as a new user runs it (issue 38, "Done when").

`mpirun -np N python text_classifier.py OUT_DIR`: OUT_DIR/reviews holds
`train/{pos,neg}/*.txt` and `test/{pos,neg}/*.txt` (written by
tests/test_mpi_whole_script.py, as keras.io's script downloads IMDB first).
The script, as keras.io writes it: `text_dataset_from_directory` (training
and validation subsets of train/, seed 1337), a `TextVectorization` layer
adapted on the training texts, `.map(vectorize).cache().prefetch()`, `fit`
with validation data and `ModelCheckpoint(save_best_only=True)`,
`load_model` of the checkpoint right after `fit` on every rank, `evaluate`;
then the end-to-end model on raw strings (`keras.Input(shape=(1,),
dtype="string")` -> the vectorizer -> the trained model) `evaluate`d on the
raw string test Dataset. One change beyond the three lines: the test set is
read with a seed (keras.io's has none, so every rank would shuffle it its
own way and the library would count each rank's whole pass: the same
numbers, N times the work - docs/callbacks.md).

Each rank prints one JSON line with what the test compares: digests of the
weights after `fit`, of the checkpoint loaded right after it and again
after a barrier, and of the vocabulary; both `evaluate`s' metrics and how
many test batches this rank scored in each; on rank 0 only, one process's
`evaluate` of the loaded weights (a plain Keras copy, no
DistributedOptimizer) on the whole test set, for both models.
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import CountTestBatches, digest  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402  (line 1)

os.chdir(sys.argv[1])
BATCH, EPOCHS, MAX_FEATURES, SEQUENCE_LENGTH = 16, 3, 200, 16

raw_train_ds, raw_val_ds = (
    keras.utils.text_dataset_from_directory(
        "reviews/train",
        batch_size=BATCH,
        validation_split=0.2,
        subset=subset,
        seed=1337,
    )
    for subset in ("training", "validation")
)
raw_test_ds = keras.utils.text_dataset_from_directory(
    "reviews/test", batch_size=BATCH, seed=1337
)

vectorize_layer = keras.layers.TextVectorization(
    max_tokens=MAX_FEATURES,
    output_mode="int",
    output_sequence_length=SEQUENCE_LENGTH,
)
text_ds = raw_train_ds.map(lambda x, y: x)
vectorize_layer.adapt(text_ds)


def vectorize_text(text, label):
    text = tf.expand_dims(text, -1)
    return vectorize_layer(text), label


train_ds = raw_train_ds.map(vectorize_text)
val_ds = raw_val_ds.map(vectorize_text)
test_ds = raw_test_ds.map(vectorize_text)
train_ds = train_ds.cache().prefetch(buffer_size=10)
val_ds = val_ds.cache().prefetch(buffer_size=10)
test_ds = test_ds.cache().prefetch(buffer_size=10)
train_ds = kmp.shard(train_ds)  # line 2


def make_model():
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = keras.layers.Embedding(MAX_FEATURES, 16)(inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(1, activation="sigmoid", name="predictions")(x)
    return keras.Model(inputs, outputs)


model = make_model()
model.compile(
    loss="binary_crossentropy",
    optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(0.02)),  # line 3
    metrics=["accuracy"],
)
checkpoint = keras.callbacks.ModelCheckpoint("best_model.keras", save_best_only=True)
history = model.fit(
    train_ds, validation_data=val_ds, epochs=EPOCHS, callbacks=[checkpoint]
)
fitted = digest(model.weights)

model = keras.models.load_model("best_model.keras")
loaded_right_after = digest(model.weights)
counter = CountTestBatches()
test_loss, test_acc = model.evaluate(test_ds, callbacks=[counter])
kmp.print_once("Test accuracy", test_acc)

# The end-to-end model on raw strings.
inputs = keras.Input(shape=(1,), dtype="string")
indices = vectorize_layer(inputs)
outputs = model(indices)
end_to_end_model = keras.Model(inputs, outputs)
end_to_end_model.compile(
    loss="binary_crossentropy",
    optimizer=kmp.DistributedOptimizer("adam"),
    metrics=["accuracy"],
)
e2e_counter = CountTestBatches()
e2e_loss, e2e_acc = end_to_end_model.evaluate(raw_test_ds, callbacks=[e2e_counter])
kmp.print_once("End-to-end test accuracy", e2e_acc)

kmp.barrier()
loaded_after_barrier = digest(keras.models.load_model("best_model.keras").weights)
out = {
    "rank": kmp.rank(),
    "fitted": fitted,
    "loaded_right_after": loaded_right_after,
    "loaded_after_barrier": loaded_after_barrier,
    "vocabulary": hashlib.sha256(
        "\n".join(vectorize_layer.get_vocabulary()).encode()
    ).hexdigest()[:16],
    "test": {"loss": float(test_loss), "accuracy": float(test_acc)},
    "test_batches": counter.batches,
    "e2e": {"loss": float(e2e_loss), "accuracy": float(e2e_acc)},
    "e2e_batches": e2e_counter.batches,
    "best": float(checkpoint.best),
    "val_loss": history.history["val_loss"],
}

if kmp.is_root():
    # One process, the same (loaded) weights, the whole test set: a plain
    # Keras copy (no DistributedOptimizer), so evaluate runs as Keras's.
    plain = make_model()
    plain.set_weights(model.get_weights())
    plain.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    out["ref_test"] = plain.evaluate(test_ds, verbose=0, return_dict=True)
    plain_inputs = keras.Input(shape=(1,), dtype="string")
    plain_e2e = keras.Model(plain_inputs, plain(vectorize_layer(plain_inputs)))
    plain_e2e.compile(
        loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"]
    )
    out["ref_e2e"] = plain_e2e.evaluate(raw_test_ds, verbose=0, return_dict=True)
    out["test_total_batches"] = sum(1 for _ in test_ds)
    out["ref_val"] = plain.evaluate(val_ds, verbose=0, return_dict=True)
print(json.dumps(out, default=float), flush=True)
