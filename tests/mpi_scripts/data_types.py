"""Datasets of every element type, and cached pipelines, under mpirun (issue 38).

Run as `mpirun -np N python data_types.py`. Every rank prints one JSON line;
tests/test_mpi_data_types.py checks it.

1. A cached pipeline (parallel map, batch, prefetch, `.cache().prefetch()`),
   `kmp.shard`ed ten times, each time a fresh pipeline: every rank's part
   has all its batches (the data check used to cut the cache short).
2. `kmp.shard` of datasets of strings, ragged tensors, sparse tensors and
   nested dicts/tuples of mixed dtypes: each rank's elements, for the test
   to check that the parts are disjoint and cover the data.
3. A model that takes raw strings (a `TextVectorization` layer inside it,
   keras.io's end-to-end export), trained on a sharded, cached string
   pipeline, then `evaluate`d on an unsharded string Dataset (split over
   the ranks) and on a dict-input Dataset of mixed dtypes: the metrics, and
   the same metrics computed on this rank alone by calling the model on
   every batch (what one process's `evaluate` computes).
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import CountTestBatches  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

rank, n = kmp.rank(), kmp.size()
keras.utils.set_random_seed(0)
out = {"rank": rank, "size": n}

# 1. Cached pipelines keep every batch.
x = np.random.default_rng(0).normal(size=(200 * 16, 8)).astype("float32")
counts = []
for _ in range(10):
    ds = tf.data.Dataset.from_tensor_slices(x)
    ds = ds.map(lambda v: v * 2, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(16).prefetch(tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE)
    part = kmp.shard(ds)
    counts.append([sum(1 for _ in part), sum(1 for _ in part)])
out["cached_counts"] = counts

# 2. shard of every element type.
rng = np.random.default_rng(1)
words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "théta"])
texts = [
    f"row{i} " + " ".join(rng.choice(words, size=rng.integers(2, 7))) for i in range(30)
]
ragged = tf.ragged.constant([list(range(i, i + i % 4 + 1)) for i in range(30)])
dense = np.zeros((30, 5), "float32")
dense[np.arange(30), np.arange(30) % 5] = np.arange(30)
sparse = tf.sparse.from_dense(dense)
nested = (
    {
        "text": texts,
        "n": np.arange(30, dtype="int64"),
        "h": np.arange(30, dtype="float16"),
    },
    (np.arange(30, dtype="int32") % 3, np.arange(30) % 2 == 0),
)


def key(element):
    """A JSON-able description of one element, the same on every rank."""
    if isinstance(element, tf.RaggedTensor):
        return element.to_list()
    if isinstance(element, tf.SparseTensor):
        return tf.sparse.to_dense(element).numpy().tolist()
    if isinstance(element, dict):
        return {k: key(v) for k, v in sorted(element.items())}
    if isinstance(element, tuple):
        return [key(v) for v in element]
    value = element.numpy()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value.tolist()


shards = {}
for name, data in (
    ("strings", texts),
    ("bytes", [t.encode("utf-8") for t in texts]),
    ("ragged", ragged),
    ("sparse", sparse),
    ("nested", nested),
):
    part = kmp.shard(tf.data.Dataset.from_tensor_slices(data), drop_remainder=False)
    shards[name] = [json.dumps(key(e), sort_keys=True) for e in part]
out["shards"] = shards

# 3. A model on raw strings, trained on a sharded cached pipeline, evaluated
# on a string Dataset split over the ranks.
labels = np.array([float("gamma" in t or "théta" in t) for t in texts], "float32")
vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=6)
vectorize.adapt(texts)
inputs = keras.Input(shape=(), dtype="string")
h = keras.layers.Embedding(20, 8)(vectorize(inputs))
h = keras.layers.GlobalAveragePooling1D()(h)
model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
model.compile(
    kmp.DistributedOptimizer(keras.optimizers.Adam(0.01)),
    "binary_crossentropy",
    metrics=["accuracy", keras.metrics.AUC(name="auc")],
)
train = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(2)
train = train.prefetch(tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE)
model.fit(kmp.shard(train), epochs=2, verbose=0)
test = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(4)


counter = CountTestBatches()
got = model.evaluate(
    test.cache().prefetch(2), verbose=0, return_dict=True, callbacks=[counter]
)
out["text_batches"] = counter.batches
out["text_weights"] = [float(np.sum(np.abs(w))) for w in model.get_weights()]


def alone(model, dataset, metric_names):
    """What one process's evaluate computes: the model called on every batch."""
    metrics = {
        "loss": keras.metrics.Mean(),
        "accuracy": keras.metrics.BinaryAccuracy(),
        "auc": keras.metrics.AUC(),
    }
    bce = keras.losses.BinaryCrossentropy(reduction="sum")
    rows = 0
    for xb, yb in dataset:
        p = model(xb, training=False)
        yb = tf.reshape(yb, (-1, 1))
        metrics["loss"].update_state(bce(yb, p) / len(yb), sample_weight=len(yb))
        rows += len(yb)
        for name in metric_names:
            metrics[name].update_state(yb, p)
    return {k: float(m.result()) for k, m in metrics.items()}


out["text_evaluate"] = got
out["text_alone"] = alone(model, test, ["accuracy", "auc"])
out["text_predict_rows"] = int(model.predict(test, verbose=0).shape[0])

# Dict input of mixed dtypes.
keras.utils.set_random_seed(1)
num = keras.Input(shape=(3,), dtype="float16", name="num")
count = keras.Input(shape=(), dtype="int32", name="count")
h = keras.layers.Concatenate()(
    [
        keras.ops.cast(num, "float32"),
        keras.ops.expand_dims(keras.ops.cast(count, "float32"), -1),
    ]
)
mixed = keras.Model(
    {"num": num, "count": count}, keras.layers.Dense(1, activation="sigmoid")(h)
)
mixed.compile(
    kmp.DistributedOptimizer(keras.optimizers.SGD(0.1)),
    "binary_crossentropy",
    metrics=["accuracy", keras.metrics.AUC(name="auc")],
)
features = {
    "num": rng.normal(size=(37, 3)).astype("float16"),
    "count": rng.integers(0, 5, size=(37,)).astype("int32"),
}
targets = (features["num"][:, 0] > 0).astype("float32")
mixed_ds = tf.data.Dataset.from_tensor_slices((features, targets)).batch(5)
counter = CountTestBatches()
out["mixed_evaluate"] = mixed.evaluate(
    mixed_ds, verbose=0, return_dict=True, callbacks=[counter]
)
out["mixed_batches"] = counter.batches
out["mixed_alone"] = alone(mixed, mixed_ds, ["accuracy", "auc"])
print(json.dumps(out), flush=True)
