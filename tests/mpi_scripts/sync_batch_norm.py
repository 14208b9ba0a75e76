"""SyncBatchNormalization on N ranks against one process (issue 28, item 4).

Part "guide": keras.io's "Working with RNNs" model (LSTM(64) ->
BatchNormalization -> Dense(10), SGD, sparse categorical crossentropy from
logits) fitted for 4 steps of 64 rows per rank on digit-like data, once with
`kmp.layers.SyncBatchNormalization` and once with Keras's layer. The
reference is one process (this one, without MPI: Keras's layer, which is
what SyncBatchNormalization is in one process) fitting the same initial
weights on the concatenated batches of N·64 rows. Prints the largest
relative weight difference of each against it.

Part "uneven": a custom loop on ranks holding different numbers of rows
(5, 7, 9, ...), 3-D inputs with a mask, in eager and in a tf.function: the
outputs, the gradients (summed over ranks) and the moving statistics
against one process on the union of the rows with Keras's layer.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

rank, n = kmp.rank(), kmp.size()
parts = sys.argv[1].split(",") if len(sys.argv) > 1 else ["guide", "uneven"]
out = {"rank": rank, "size": n}


def rel_diff(a_list, b_list) -> float:
    worst = 0.0
    for a, b in zip(a_list, b_list):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        worst = max(worst, float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12)))
    return worst


def digits(rows: int, seed: int = 0):
    """Digit-like 28x28 images: a class-dependent stroke pattern plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=rows)
    base = rng.normal(size=(10, 28, 28)).astype("float32")
    x = 0.5 * base[y] + rng.normal(size=(rows, 28, 28)).astype("float32")
    return np.clip(x, -3, 3).astype("float32") / 3 + 0.5, y.astype("int64")


def guide_model(norm):
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((None, 28)),
            keras.layers.LSTM(64),
            norm(),
            keras.layers.Dense(10),
        ]
    )


if "guide" in parts:
    steps, per_rank = 4, 64
    x, y = digits(steps * per_rank * n)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    ref = guide_model(keras.layers.BatchNormalization)
    initial = ref.get_weights()
    ref.compile(optimizer=keras.optimizers.SGD(), loss=loss)
    # One process, batches of N·64 rows (the library's wrappers pass a model
    # whose optimizer is not a DistributedOptimizer through untouched).
    ref.fit(x, y, batch_size=per_rank * n, epochs=1, shuffle=False, verbose=0)
    expected = ref.get_weights()

    xs, ys = kmp.shard(x, y)  # the k-th batches of all ranks = rows of batch k
    for name, norm in (
        ("sync", kmp.layers.SyncBatchNormalization),
        ("plain", keras.layers.BatchNormalization),
    ):
        model = guide_model(norm)
        model.set_weights(initial)
        model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss=loss)
        model.fit(xs, ys, batch_size=per_rank, epochs=1, shuffle=False, verbose=0)
        weights = model.get_weights()
        out[f"guide_{name}_diff"] = rel_diff(weights, expected)
        out[f"guide_{name}_digest"] = float(
            sum(np.sum(w, dtype=np.float64) for w in weights)
        )


if "uneven" in parts:
    features, steps = 3, 4

    def rows_of(r):
        rng = np.random.default_rng(100 + r)
        count = 5 + 2 * r
        x = rng.normal(2.0, 3.0, size=(count, steps, features)).astype("float32")
        lengths = rng.integers(1, steps + 1, size=count)
        mask = np.arange(steps)[None, :] < lengths[:, None]
        target = rng.normal(size=(count, steps, features)).astype("float32")
        return x, mask, target

    data = [rows_of(r) for r in range(n)]
    mine = data[rank]
    union = [np.concatenate([d[i] for d in data]) for i in range(3)]

    def layers(norm):
        keras.utils.set_random_seed(7)
        # No bias: BatchNormalization makes its gradient zero (rounding noise).
        dense = keras.layers.Dense(features, use_bias=False)
        bn = norm(momentum=0.5)
        dense.build((None, steps, features))
        bn.build((None, steps, features))
        return dense, bn

    def step(dense, bn, x, mask, target):
        with tf.GradientTape() as tape:
            y = bn(dense(x), training=True, mask=tf.convert_to_tensor(mask))
            loss = tf.reduce_sum(y * target)
        variables = dense.trainable_weights + bn.trainable_weights
        return y, tape.gradient(loss, variables)

    for mode in ("eager", "function"):
        dense, bn = layers(kmp.layers.SyncBatchNormalization)
        rdense, rbn = layers(keras.layers.BatchNormalization)
        fn = step if mode == "eager" else tf.function(step)
        results = {}
        for repeat in range(2):  # twice: the moving statistics move twice
            y, grads = fn(dense, bn, *mine)
            grads = [kmp.allreduce(g.numpy(), op="sum") for g in grads]
            ry, rgrads = step(rdense, rbn, *union)
        start = sum(len(d[0]) for d in data[:rank])
        ry_mine = ry.numpy()[start : start + len(mine[0])]
        results["outputs"] = rel_diff([y.numpy()], [ry_mine])
        results["gradients"] = rel_diff(grads, [g.numpy() for g in rgrads])
        results["moving"] = rel_diff(
            [bn.moving_mean.numpy(), bn.moving_variance.numpy()],
            [rbn.moving_mean.numpy(), rbn.moving_variance.numpy()],
        )
        results["moving_digest"] = [
            float(v)
            for v in np.concatenate(
                [bn.moving_mean.numpy(), bn.moving_variance.numpy()]
            )
        ]
        out[f"uneven_{mode}"] = results

print(json.dumps(out), flush=True)
