"""Models that are not built when `fit` starts, under mpirun (issue 19, item 4).

Run as `mpirun -np N python unbuilt_model.py`. Ranks are NOT seeded alike
(rank r seeds 1000 + r). Three whole-script patterns, each checked against
one process (computed in this process from rank 0's initial weights on the
concatenated batches) and for bitwise-identical state on every rank:

- `custom`: keras.io's "Customizing what happens in fit()" with a subclassed
  model built by nothing but `fit`: its `train_step` calls
  `self.optimizer.apply(grads, self.trainable_variables)`; Adam; arrays.
- `sequential`: a `Sequential` without an `Input`, default `train_step`,
  a sharded `tf.data` pipeline.
- `generator`: a subclassed model fed by a Python generator.

Prints one JSON line per rank and part.
"""

import json
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import fit_in_order, state_digest  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.internals import keras as keras_internals  # noqa: E402

rank, n = kmp.rank(), kmp.size()
B = 4  # per-rank batch
STEPS = 4  # per epoch


def emit(**record):
    print(json.dumps({"rank": rank, "size": n, **record}), flush=True)


class PlainModel(keras.Model):
    HIDDEN = (6, "relu")  # the hidden Dense layer's units and activation

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        units, activation = self.HIDDEN
        self.hidden = keras.layers.Dense(units, activation=activation)
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


class CustomModel(PlainModel):
    HIDDEN = (8, "tanh")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def sequential():
    return keras.Sequential(
        [keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)]
    )


class InitialWeights(keras.callbacks.Callback):
    """The weights this rank holds when training begins (before the sync)."""

    def on_train_begin(self, logs=None):
        self.built = self.model.built and bool(self.model.weights)
        self.weights = [np.asarray(w) for w in self.model.get_weights()]


rng = np.random.default_rng(7)  # the same data on every rank
x = rng.normal(size=(STEPS * n * B, 5)).astype("float32")
y = (x[:, :1] - 0.5 * x[:, 1:2]).astype("float32")


def run(part, make, data_for_rank, optimizer):
    keras.utils.set_random_seed(1000 + rank)
    model = make()
    seen = InitialWeights()
    model.compile(optimizer=kmp.DistributedOptimizer(optimizer()), loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = fit_in_order(model, **data_for_rank(), epochs=2, callbacks=[seen])
    # One process: rank 0's initial weights, the concatenated batches.
    root_initial = kmp.broadcast(seen.weights) if seen.built else None
    ref = make()
    ref(x[:1])
    ref_diff = None
    if root_initial is not None:
        ref.set_weights(root_initial)
        ref.compile(optimizer=optimizer(), loss="mse")
        fit_in_order(ref, x, y, batch_size=n * B, epochs=2)
        ref_diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(model.get_weights(), ref.get_weights())
        )
    emit(
        part=part,
        built_at_train_begin=seen.built,
        initial_differs=bool(
            root_initial is not None
            and any(
                not np.array_equal(a, b) for a, b in zip(seen.weights, root_initial)
            )
        ),
        ref_diff=ref_diff,
        digest=state_digest(model),
        loss=hist.history["loss"],
        deferred_warning=any(
            "synced inside the first" in str(w.message) for w in caught
        ),
    )


def arrays():
    xs, ys = kmp.shard(x, y, batch_size=B)
    return {"x": xs, "y": ys, "batch_size": B}


def dataset():
    # Elements dealt round-robin, then batched: the k-th batches of all ranks
    # together are the k-th batch of N*B rows of the whole set.
    return {"x": kmp.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(B)}


def generator():
    xs, ys = kmp.shard(x, y, batch_size=B)

    def batches():
        while True:
            for i in range(STEPS):
                yield xs[i * B : (i + 1) * B], ys[i * B : (i + 1) * B]

    return {"x": batches(), "steps_per_epoch": STEPS}


run("custom", CustomModel, arrays, lambda: keras.optimizers.Adam(0.01))
run("sequential", sequential, dataset, lambda: keras.optimizers.SGD(0.1))
run("generator", PlainModel, generator, lambda: keras.optimizers.Adam(0.01))


# Fault injection: Keras cannot build the model before fit (here: its
# pre-fit build raises). The ranks are then synced inside the first update,
# with a warning, and still end as one model.
def cannot_build(model, batch):
    raise RuntimeError("injected: no symbolic build")


keras_internals.symbolic_build = cannot_build
run("fallback", CustomModel, arrays, lambda: keras.optimizers.Adam(0.01))
