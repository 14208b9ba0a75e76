"""A user's whole script under mpirun, compared with one process (issues 11, 12).

Run as `mpirun -np N python whole_script.py OUT_DIR PART`. Ranks are NOT
seeded alike: rank r seeds with 1000 + r, so every model starts different.
Each part prints one JSON line per rank; the test compares.

- `replica`: (a) the first SGD update from unseeded ranks equals a
  one-process update from rank 0's initial weights on the concatenated
  batch; (b) a BatchNorm + frozen-layer + Dropout model: every variable
  bitwise identical after fit; (c) stock EarlyStopping + ReduceLROnPlateau
  on val_loss with BatchNorm, unsharded validation data, partial last
  batches, over 10 seeds: per seed the stop epoch, the learning rate and a
  digest of every variable; (d) a learning rate changed on one rank only
  is caught at the next step with the ranks and values.
- `logs`: the three lines + unsharded validation data: every log equals the
  one-process log; `evaluate` on all ranks (unsharded, with sample weights)
  equals the one-process evaluate; `split_predict` equals `predict`;
  stock ModelCheckpoint / CSVLogger / TensorBoard / BackupAndRestore on all
  ranks: one writer, complete files; then rank 0 alone loads the checkpoint
  and runs evaluate and predict while the others wait in a barrier.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import Batches, compile_with_auc, fit_in_order, state_digest  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

out_dir, part = sys.argv[1], sys.argv[2]
rank, n = kmp.rank(), kmp.size()


def data(seed, rows, features=6):
    rng = np.random.default_rng(seed)  # the same data on every rank
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).astype("float32")
    return x, y


def classifier(units, activation):
    """Dense(units, activation) then Dense(1, sigmoid), on 6 features."""
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(units, activation=activation),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


def emit(**record):
    print(json.dumps({"rank": rank, "size": n, **record}), flush=True)


if part == "replica":
    # (a) first update, float32 SGD, no BatchNorm (its batch statistics would
    # differ between per-rank and concatenated batches by design).
    b = 4
    x, y = data(1, n * b)
    keras.utils.set_random_seed(1000 + rank)

    def dense_model():
        return keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(5, activation="tanh"),
                keras.layers.Dense(3, trainable=False),  # frozen, random
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )

    model = dense_model()
    mine_initial = model.get_weights()
    root_initial = kmp.broadcast([np.asarray(w) for w in mine_initial])
    differs = any(not np.array_equal(a, b) for a, b in zip(mine_initial, root_initial))
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.5)),
        loss="binary_crossentropy",
    )
    xs, ys = kmp.shard(x, y, batch_size=b)
    fit_in_order(model, xs, ys, batch_size=b, epochs=1)
    ref = dense_model()
    ref.set_weights(root_initial)
    ref.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    fit_in_order(ref, x, y, batch_size=n * b, epochs=1)
    first_update_diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(model.get_weights(), ref.get_weights())
    )

    # (b) + (c): BatchNorm + frozen layer + Dropout; stock callbacks.
    def bn_model():
        return keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(8),
                keras.layers.BatchNormalization(),
                keras.layers.Activation("relu"),
                keras.layers.Dropout(0.2),
                keras.layers.Dense(4, trainable=False),
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )

    runs = []
    for seed in range(10):
        keras.utils.set_random_seed(100 * seed + rank)  # different per rank
        x, y = data(seed, 67 * n + 5)  # per-rank rows not a multiple of 16
        xv, yv = data(seed + 50, 41)  # unsharded: the same on every rank
        xs, ys = kmp.shard(x, y)
        model = bn_model()
        model.compile(
            optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(0.05)),
            loss="binary_crossentropy",
            metrics=["accuracy"],
        )
        early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)
        plateau = keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=0, min_delta=0.02
        )
        hist = model.fit(
            xs,
            ys,
            batch_size=16,
            epochs=12,
            validation_data=(xv, yv),
            callbacks=[early, plateau],
            verbose=0,
        )
        bn = model.layers[1]
        runs.append(
            {
                "epochs": len(hist.history["loss"]),
                "stopped_epoch": early.stopped_epoch,
                "lrs": [float(v) for v in hist.history["learning_rate"]],
                "val_loss": hist.history["val_loss"],
                "digest": state_digest(model),
                "moving_mean": np.asarray(bn.moving_mean).tolist(),
            }
        )

    # (d) a learning rate changed on one rank only.
    class OneRankLR(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and rank == n - 1:
                self.model.optimizer.learning_rate = 0.123

    x, y = data(7, 32 * n)
    model = dense_model()
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.1)),
        loss="binary_crossentropy",
    )
    lr_error = None
    try:
        model.fit(
            *kmp.shard(x, y), batch_size=4, epochs=1, verbose=0, callbacks=[OneRankLR()]
        )
    except Exception as exc:  # noqa: BLE001 - the message is checked
        lr_error = str(exc)[-1500:]

    # (e) check_replicas_every sees non-trainable state too: a frozen
    # layer's kernel changed on one rank only.
    class OneRankFrozen(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and rank == n - 1:
                kernel = self.model.layers[1].kernel
                kernel.assign(kernel + 1.0)

    model = dense_model()
    model.compile(
        optimizer=kmp.DistributedOptimizer(
            keras.optimizers.SGD(0.1), check_replicas_every=1
        ),
        loss="binary_crossentropy",
    )
    frozen_error = None
    try:
        model.fit(
            *kmp.shard(x, y),
            batch_size=4,
            epochs=1,
            verbose=0,
            callbacks=[OneRankFrozen()],
        )
    except Exception as exc:  # noqa: BLE001 - the message is checked
        frozen_error = str(exc)[-800:]
    emit(
        frozen_error=frozen_error,
        initial_differs=differs,
        first_update_diff=first_update_diff,
        runs=runs,
        lr_error=lr_error,
    )

elif part == "logs":
    keras.utils.set_random_seed(1000 + rank)
    b = 8
    x, y = data(3, 40 * n + 3)
    xv, yv = data(4, 29)
    wv = np.linspace(0.5, 1.5, len(xv)).astype("float32")

    def model_fn():
        return classifier(8, "tanh")

    model = model_fn()
    root_initial = kmp.broadcast([np.asarray(w) for w in model.get_weights()])
    compile_with_auc(model, kmp.DistributedOptimizer(keras.optimizers.SGD(0.2)))
    xs, ys = kmp.shard(x, y, batch_size=b)
    ckpt_best = os.path.join(out_dir, "best.weights.h5")
    ckpt_keras = os.path.join(out_dir, "last.keras")
    callbacks = [
        keras.callbacks.ModelCheckpoint(
            ckpt_best, save_best_only=True, save_weights_only=True
        ),
        keras.callbacks.ModelCheckpoint(ckpt_keras),
        keras.callbacks.CSVLogger(os.path.join(out_dir, "log.csv")),
        keras.callbacks.BackupAndRestore(
            os.path.join(out_dir, "backup"), delete_checkpoint=False
        ),
    ]
    hist = fit_in_order(
        model,
        xs,
        ys,
        batch_size=b,
        epochs=3,
        validation_data=(xv, yv, wv),
        callbacks=callbacks,
    )
    evaluated = model.evaluate(
        xv, yv, sample_weight=wv, batch_size=5, verbose=0, return_dict=True
    )
    predicted = kmp.split_predict(model, xv, batch_size=7, verbose=0)

    ref = model_fn()
    ref.set_weights(root_initial)
    compile_with_auc(ref, keras.optimizers.SGD(0.2))
    kept = len(xs) * n
    ref_hist = fit_in_order(
        ref,
        x[:kept],
        y[:kept],
        batch_size=n * b,
        epochs=3,
        validation_data=(xv, yv, wv),
    )
    ref_eval = ref.evaluate(xv, yv, sample_weight=wv, verbose=0, return_dict=True)
    ref_pred = ref.predict(xv, verbose=0)

    # Rank 0 alone loads the checkpoint and uses it; the others wait.
    alone = None
    kmp.barrier()
    if rank == 0:
        loaded = keras.models.load_model(ckpt_keras)
        alone = {
            "evaluate": loaded.evaluate(
                xv, yv, sample_weight=wv, verbose=0, return_dict=True
            ),
            "predict_diff": float(
                np.max(np.abs(loaded.predict(xv, verbose=0) - ref_pred))
            ),
        }
    kmp.barrier()
    emit(
        history=hist.history,
        ref_history=ref_hist.history,
        evaluate=evaluated,
        ref_evaluate=ref_eval,
        split_predict_diff=float(np.max(np.abs(predicted - ref_pred))),
        alone=alone,
        files=sorted(os.listdir(out_dir)) if rank == 0 else None,
        csv_lines=open(os.path.join(out_dir, "log.csv")).read().count("\n")
        if rank == 0
        else None,
    )
elif part == "inputs":
    # Validation and evaluate inputs of every kind, split (or not) over ranks,
    # against one process; validation_split; a batch-frequency checkpoint.
    import tensorflow as tf

    keras.utils.set_random_seed(1000 + rank)
    x, y = data(8, 24 * n)
    xv, yv = data(9, 31)

    known = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(4)
    unknown = known.filter(lambda a, b: True)  # cardinality unknown
    inputs = {
        "tf.data": known,
        "tf.data-unknown": unknown,
        "PyDataset": Batches(xv, yv, 4),
    }

    def model_fn():
        return classifier(6, "relu")

    model = model_fn()
    root_initial = kmp.broadcast([np.asarray(w) for w in model.get_weights()])
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.1)),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    ref = model_fn()
    ref.set_weights(root_initial)
    ref.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    results = {}
    xs, ys = kmp.shard(x, y, batch_size=4)
    for name, val in inputs.items():
        hist = fit_in_order(model, xs, ys, batch_size=4, epochs=1, validation_data=val)
        ref_hist = fit_in_order(
            ref, x, y, batch_size=4 * n, epochs=1, validation_data=(xv, yv)
        )
        results[name] = {
            "fit": hist.history,
            "ref_fit": ref_hist.history,
            "evaluate": model.evaluate(val, verbose=0, return_dict=True),
            "ref_evaluate": ref.evaluate(xv, yv, verbose=0, return_dict=True),
        }
    # validation_split: each rank validates the tail of its own shard; the
    # logs describe the union of those tails.
    step_ckpt = os.path.join(out_dir, "every3.weights.h5")
    hist = fit_in_order(
        model,
        xs,
        ys,
        batch_size=4,
        epochs=1,
        validation_split=0.25,
        callbacks=[
            keras.callbacks.ModelCheckpoint(
                step_ckpt, save_weights_only=True, save_freq=3
            )
        ],
    )
    tails = kmp.allgather(xs[-len(xs) // 4 :]), kmp.allgather(ys[-len(ys) // 4 :])
    union = model_fn()
    union.set_weights(model.get_weights())
    union.compile(loss="binary_crossentropy", metrics=["accuracy"])
    results["validation_split"] = {
        "val_loss": hist.history["val_loss"][-1],
        "union_loss": union.evaluate(*tails, verbose=0, return_dict=True)["loss"],
    }
    emit(results=results, files=sorted(os.listdir(out_dir)) if rank == 0 else None)
elif part == "custom":
    # keras.io's "Customizing what happens in fit()": a subclassed model with
    # its own train_step, loss tracker and metric; unseeded ranks.
    import tensorflow as tf

    class CustomModel(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(8, activation="tanh")
            self.out = keras.layers.Dense(1)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = keras.losses.mean_squared_error(y, y_pred)
                loss = tf.reduce_mean(loss)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            self.loss_tracker.update_state(
                tf.reduce_mean(keras.losses.mean_squared_error(y, y_pred))
            )
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

    keras.utils.set_random_seed(1000 + rank)
    b = 8
    x, y = data(11, 16 * n)
    y = y[:, None]
    xv, yv = data(12, 24)
    yv = yv[:, None]
    model = CustomModel()
    model(x[:1])
    root_initial = kmp.broadcast([np.asarray(w) for w in model.get_weights()])
    model.compile(optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    hist = fit_in_order(
        model,
        *kmp.shard(x, y, batch_size=b),
        batch_size=b,
        epochs=2,
        validation_data=(xv, yv),
    )
    ref = CustomModel()
    ref(x[:1])
    ref.set_weights(root_initial)
    ref.compile(optimizer=keras.optimizers.SGD(0.1))
    # The custom loss tracker averages batch means (weight 1 per batch): the
    # one process must validate with the same batches to be comparable.
    ref_hist = fit_in_order(
        ref,
        x,
        y,
        batch_size=n * b,
        epochs=2,
        validation_data=(xv, yv),
        validation_batch_size=b,
    )
    emit(
        history=hist.history,
        ref_history=ref_hist.history,
        digest=state_digest(model),
    )
else:
    raise SystemExit(f"unknown part {part!r}")
