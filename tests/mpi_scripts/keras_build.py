"""Models built before `fit` come out as Keras's own `fit` builds them (issue 28, item 1).

Run as `mpirun -np N python keras_build.py OUT_DIR` (N = 1 is the
one-process reference: the same script, where `fit` is Keras's own). The
README's three lines on a 600-row digit-like set, batch 32: for a
`Sequential` without an `Input`, a functional model and a subclassed model,
each fed

- `numpy`: `kmp.shard(x, y)` (every rank's part ends with a partial batch,
  as the whole set does: Keras leaves the batch dimension None);
- `numpy-full`: `kmp.shard(x, y, batch_size=32)` (full batches only, in one
  process too: Keras fixes the batch dimension at 32);
- `tf.data`: the shard batched without `drop_remainder` (None);
- `tf.data-drop`: batched with `drop_remainder=True` (32);

every rank records the model's `inputs`, `get_build_config()` and the
config of the `.keras` file rank 0 saved after `fit`, then reloads that
file and calls it on 5 rows (another batch size). One JSON line per rank
and part.
"""

import json
import os
import sys
import warnings
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out_dir = sys.argv[1]
rank, n = kmp.rank(), kmp.size()
B = 32
SHAPE = (6, 6, 1)


@keras.saving.register_keras_serializable(package="kmp_tests")
class Classifier(keras.Model):
    """A subclassed model that only `fit` builds."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(10, activation="softmax")

    def call(self, x):
        return self.out(self.hidden(self.flatten(x)))


def make_model(kind: str) -> keras.Model:
    if kind == "sequential":  # keras.io's tutorials: no Input, fit builds it
        return keras.Sequential(
            [
                keras.layers.Flatten(),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
    if kind == "functional":
        inputs = keras.Input(SHAPE)
        hidden = keras.layers.Dense(8, activation="relu")(
            keras.layers.Flatten()(inputs)
        )
        return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(hidden))
    return Classifier()


def fit_input(kind: str, x, y) -> dict:
    if kind == "numpy":
        xs, ys = kmp.shard(x, y)
        return {"x": xs, "y": ys, "batch_size": B}
    if kind == "numpy-full":
        xs, ys = kmp.shard(x, y, batch_size=B)
        return {"x": xs, "y": ys, "batch_size": B}
    xs, ys = kmp.shard(x, y)
    dataset = tf.data.Dataset.from_tensor_slices((xs, ys))
    return {"x": dataset.batch(B, drop_remainder=kind == "tf.data-drop")}


def inputs_of(model) -> list | None:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if inputs is None:
        return None
    return [[list(t.shape), str(t.dtype)] for t in inputs]


def as_json(value):
    return json.loads(json.dumps(value, default=list))


def saved_config(path: str) -> dict:
    """The file's config.json, shared-object ids (Python `id`s) numbered in order."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    ids: dict = {}

    def canonical(value):
        if isinstance(value, dict):
            return {
                k: ids.setdefault(v, len(ids))
                if k == "shared_object_id"
                else canonical(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return value

    return canonical(config)


rng = np.random.default_rng(0)  # the same data on every rank
x = rng.random((600, *SHAPE), dtype=np.float32)
y = rng.integers(0, 10, size=600)
probe = x[:5]

PARTS = [
    f"{model}/{data}"
    for model in ("sequential", "subclassed")
    for data in ("numpy", "numpy-full", "tf.data", "tf.data-drop")
] + ["functional/numpy", "functional/tf.data-drop"]  # built by its Input anyway

for part in PARTS:
    model_kind, input_kind = part.split("/")
    keras.utils.set_random_seed(7)
    model = make_model(model_kind)
    model.compile(
        optimizer=kmp.DistributedOptimizer("adam"),
        loss="sparse_categorical_crossentropy",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(**fit_input(input_kind, x, y), epochs=1, verbose=0)
    path = os.path.join(out_dir, f"np{n}-{model_kind}-{input_kind}.keras")
    if rank == 0:
        model.save(path)
    kmp.barrier()
    record = {
        "part": part,
        "inputs": inputs_of(model),
        "build_config": as_json(model.get_build_config()),
        "saved_config": saved_config(path),
    }
    want = np.asarray(model(probe))
    try:
        loaded = keras.saving.load_model(path)
        got = np.asarray(loaded(probe))
        record["reload_call"] = "ok"
        record["reload_diff"] = float(np.max(np.abs(got - want)))
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        record["reload_call"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps({"rank": rank, "size": n, **record}), flush=True)
