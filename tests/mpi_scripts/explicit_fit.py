"""The explicit path for code that drives Keras itself (issue 21, item 3).

Run as `mpirun -np N python explicit_fit.py OUT_DIR MODE[,MODE...]`. Every mode trains
the same model on the same data and prints, per rank, one JSON line with the
history, the evaluation, a digest of every model and optimizer variable and
the CSV log rank 0 wrote:

- `wrapped`: `model.fit` / `model.evaluate` with the Keras patches (the
  reference);
- `framework`: a model class whose `fit` / `evaluate` call Keras's own
  methods captured before `import keras_mpfp16` (as a framework built on
  Keras would), inside `kmp.distributed_fit` / `kmp.distributed_evaluate`;
- `super`: a model class whose `fit` calls `super().fit(**kwargs)` inside
  `kmp.distributed_fit` (the patched `fit` must pass through, not prepare
  the run twice);
- `nopatch`: `KERAS_MPFP16_PATCH_KERAS=0` (set by the test): a plain model,
  `with kmp.distributed_fit(...) as kw: model.fit(**kw)`;
- `callbacklist`: `model.fit(callbacks=keras.callbacks.CallbackList(...))`,
  a list the user built (the run edits it in place);
- `bypass`: the `framework` class without the explicit path (what the
  explicit path is for: per-rank logs, unsplit validation);
- `loop`: a custom training loop (GradientTape + `optimizer.apply`) over
  sharded batches, compared with the same loop in one process on the whole
  batches.
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

# A framework on top of Keras holds Keras's own methods (captured at its
# import, before keras_mpfp16 patches anything).
KERAS_FIT = keras.Model.fit
KERAS_EVALUATE = keras.Model.evaluate

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import fit_in_order, state_digest  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.training import patches  # noqa: E402

out_dir, modes = sys.argv[1], sys.argv[2].split(",")
mode = modes[0]  # the mode running now (read by the model classes)
rank, n = kmp.rank(), kmp.size()
EPOCHS, BATCH = 2, 8


def data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = (x[:, :1] + 0.5 * x[:, 1:2] > 0).astype("float32")
    xv = rng.normal(size=(30, 6)).astype("float32")
    yv = (xv[:, :1] + 0.5 * xv[:, 1:2] > 0).astype("float32")
    return x, y, xv, yv


class Framework(keras.Model):
    """Its own fit/evaluate, calling Keras's methods it holds (no super())."""

    def fit(self, x=None, y=None, **kwargs):
        if mode == "bypass":
            return KERAS_FIT(self, x, y, **kwargs)
        with kmp.distributed_fit(self, x, y, **kwargs) as fit_kwargs:
            return KERAS_FIT(self, **fit_kwargs)

    def evaluate(self, x=None, y=None, **kwargs):
        if mode == "bypass":
            return KERAS_EVALUATE(self, x, y, **kwargs)
        with kmp.distributed_evaluate(self, x, y, **kwargs) as kw:
            return KERAS_EVALUATE(self, **kw)


class Super(keras.Model):
    def fit(self, x=None, y=None, **kwargs):
        with kmp.distributed_fit(self, x, y, **kwargs) as fit_kwargs:
            return super().fit(**fit_kwargs)


def build(cls=keras.Model):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    h = keras.layers.BatchNormalization()(h)
    model = cls(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(0.01)),
        loss="binary_crossentropy",
        metrics=["accuracy", keras.metrics.TruePositives(name="tp")],
    )
    return model


def train(model):
    x, y, xv, yv = data()
    csv = os.path.join(out_dir, f"{mode}.csv")
    ckpt = os.path.join(out_dir, f"{mode}.keras")
    callbacks = [
        keras.callbacks.CSVLogger(csv),
        keras.callbacks.ModelCheckpoint(ckpt),
    ]
    if mode == "callbacklist":
        # A user-built CallbackList: Keras uses it as given.
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_history=True, model=model
        )
    xs, ys = kmp.shard(x, y)
    if mode == "nopatch":
        with kmp.distributed_fit(
            model,
            xs,
            ys,
            batch_size=BATCH,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
            validation_data=(xv, yv),
            callbacks=callbacks,
        ) as fit_kwargs:
            history = model.fit(**fit_kwargs)
        with kmp.distributed_evaluate(
            model, xv, yv, batch_size=BATCH, verbose=0, return_dict=True
        ) as kw:
            logs = model.evaluate(**kw)
    else:
        history = fit_in_order(
            model,
            xs,
            ys,
            batch_size=BATCH,
            epochs=EPOCHS,
            validation_data=(xv, yv),
            callbacks=callbacks,
        )
        logs = model.evaluate(xv, yv, batch_size=BATCH, verbose=0, return_dict=True)
    kmp.barrier()
    with open(csv) as f:
        csv_text = f.read()
    return {
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "evaluate": {k: float(v) for k, v in logs.items()},
        "digest": state_digest(model),
        "csv": csv_text,
        # The Keras patches (the rows KERAS_MPFP16_PATCH_KERAS=0 leaves out).
        "patches": {
            name: on
            for name, on in kmp.training.installed().items()
            if patches.ROWS[name].keras_patch
        },
    }


def loop():
    x, y, _, _ = data()

    def make():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,))
        h = keras.layers.Dense(8, activation="tanh")(inputs)
        return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))

    model = make()
    optimizer = kmp.DistributedOptimizer(keras.optimizers.Adam(0.01))
    loss_fn = keras.losses.BinaryCrossentropy()
    xs, ys = kmp.shard(x, y)  # rank r: rows r, r + n, ... of each global batch

    def train_step(net, opt):
        """One compiled step of `net` on a batch: `loss_fn`'s gradients,
        applied by `opt`."""

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, net(xb, training=True))
            grads = tape.gradient(loss, net.trainable_variables)
            opt.apply(grads, net.trainable_variables)
            return loss

        return step

    step = train_step(model, optimizer)
    per = BATCH
    steps = len(xs) // per
    for epoch in range(EPOCHS):
        for s in range(steps):
            step(xs[s * per : (s + 1) * per], ys[s * per : (s + 1) * per])
    mine = [np.asarray(v) for v in model.trainable_variables]

    # One process: the same loop on the whole global batches (the rows every
    # rank's batch s came from), with a plain Adam.
    reference = make()
    plain = keras.optimizers.Adam(0.01)
    rows = np.arange(len(x))
    shards = [rows[r::n][: len(xs)] for r in range(n)]  # kmp.shard's rows
    ref_step = train_step(reference, plain)

    for epoch in range(EPOCHS):
        for s in range(steps):
            idx = np.concatenate([sh[s * per : (s + 1) * per] for sh in shards])
            ref_step(x[idx], y[idx])
    theirs = [np.asarray(v) for v in reference.trainable_variables]
    return {
        "max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(mine, theirs)),
        "digest": hashlib.sha256(
            b"".join(np.ascontiguousarray(a).tobytes() for a in mine)
        ).hexdigest()[:16],
        "steps": steps,
        "per_rank_batch": per,
    }


for mode in modes:
    if mode == "loop":
        record = loop()
    else:
        cls = {"framework": Framework, "bypass": Framework, "super": Super}.get(
            mode, keras.Model
        )
        record = train(build(cls))
    print(json.dumps({"rank": rank, "size": n, "mode": mode, **record}), flush=True)
