"""The README's main job: a small LSTM trained data-parallel on built-in data.

Run with or without MPI:

    python examples/train_keras.py                 # one process
    mpirun -np 2 python examples/train_keras.py    # two ranks

The data: multichannel sequences in which a faint rising "precursor" ramp on
one channel announces a positive label (a miniature of the disruption-
prediction task). Lines marked `# kmp` are the whole change from a plain Keras
script: every printed number is global (exact over all ranks' data), the
validation set is split over the ranks by `fit` itself, the stock
`ReduceLROnPlateau` decides alike on every rank, and `LearningRateScaler`
scales the learning rate for the number of ranks.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402  # kmp


def make_data(n: int, timesteps: int, channels: int, seed: int):
    """Noisy sequences; positives carry a ramp on channel 0 before the end."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, size=(n, timesteps, channels)).astype("float32")
    y = (rng.random(n) < 0.5).astype("float32")
    ramp_len = timesteps // 4
    ramp = np.linspace(0.0, 1.2, ramp_len, dtype="float32")
    x[y == 1, -ramp_len:, 0] += ramp
    return x, y[:, None]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--timesteps", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--policy", default="float32", help="e.g. mixed_float16")
    args = p.parse_args()

    keras.config.set_dtype_policy(args.policy)
    x, y = make_data(args.samples, args.timesteps, 4, seed=0)
    x_val, y_val = make_data(args.samples // 4, args.timesteps, 4, seed=1)
    x, y = kmp.shard(x, y, batch_size=args.batch_size)  # kmp: each rank its share

    model = keras.Sequential(
        [
            keras.Input((args.timesteps, 4)),
            keras.layers.LSTM(32, return_sequences=True),
            keras.layers.LSTM(32),
            keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
        ]
    )
    model.compile(
        optimizer=kmp.DistributedOptimizer(keras.optimizers.Adam(2e-3)),  # kmp
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    # Stock callbacks as for one process; the learning rate scaled for N (kmp).
    callbacks = [
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1),
        kmp.callbacks.LearningRateScaler(rule="sqrt", warmup_epochs=1),  # kmp
    ]
    start = time.time()
    hist = model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(x_val, y_val),
        callbacks=callbacks,
        verbose=2,
    )
    if kmp.is_root():
        h = hist.history
        print(
            f"ranks: {kmp.size()}  policy: {args.policy}  time: {time.time() - start:.1f}s"
        )
        print("training loss per epoch:   " + ", ".join(f"{v:.4f}" for v in h["loss"]))
        print(
            "validation loss per epoch: " + ", ".join(f"{v:.4f}" for v in h["val_loss"])
        )
        print(f"final validation accuracy: {h['val_accuracy'][-1]:.3f}")


if __name__ == "__main__":
    main()
