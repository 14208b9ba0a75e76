"""FRNN-style disruption predictor: stacked stateful LSTMs over lanes of shots.

The model of Svyatkovskiy, Kates-Harbeck and Tang (2017): an optional
convolutional front-end for profile signals, stacked stateful LSTMs and a
sigmoid output at every time step, trained with truncated backpropagation
through time. Each batch row is a *lane* that carries consecutive chunks of
one long shot; when the shot ends, the lane takes the next one and only that
lane's state is reset (`keras_mpfp16.layers.LaneBatcher` and `reset_lanes`).

The metric is the paper's: a shot raises an alarm at threshold t when the
output exceeds t at any step before the last `--warning-steps`; the ROC AUC
over all thresholds is computed exactly from every shot's score, gathered
from all ranks.

    python examples/disruption_predictor.py                     # synthetic shots
    python examples/disruption_predictor.py --conv              # + profile front-end
    mpirun -np 4 python examples/disruption_predictor.py        # four ranks
    python examples/disruption_predictor.py --data /work/shared/data/SelfRegulationSCP1.npz

Data: built-in synthetic shots (`examples/shots.py`: six channels, 200-600
steps, ~15% disruptive with precursors) or, with `--data`, the EEG set
SelfRegulationSCP1.npz (one label per trial, downsampled 4x to 224 steps).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import shots as shot_data  # noqa: E402  (examples/shots.py, next to this file)

import keras_mpfp16 as kmp  # noqa: E402
from keras_mpfp16.layers import LaneBatcher, reset_lanes  # noqa: E402

LSTM_LAYERS = {"kmp": kmp.layers.LSTM, "keras": keras.layers.LSTM}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--data",
        metavar="PATH",
        help="SelfRegulationSCP1.npz (real EEG) instead of synthetic shots",
    )
    data.add_argument(
        "--shots", type=int, default=1200, help="synthetic training shots"
    )
    data.add_argument(
        "--test-shots", type=int, default=400, help="synthetic test shots"
    )
    data.add_argument("--min-length", type=int, default=200, help="synthetic shots")
    data.add_argument("--max-length", type=int, default=600, help="synthetic shots")
    data.add_argument(
        "--warning-steps",
        type=int,
        default=None,
        help="alarms in the last steps of a shot are too late and ignored "
        "(default 10 for synthetic shots, 0 for --data)",
    )
    model = p.add_argument_group("model")
    model.add_argument(
        "--conv",
        action="store_true",
        help="convolutional front-end over a per-step 16-point profile "
        "(synthetic shots only)",
    )
    model.add_argument("--units", type=int, default=64, help="LSTM units (FRNN: 200)")
    model.add_argument("--depth", type=int, default=2, help="stacked LSTM layers")
    model.add_argument(
        "--lstm",
        choices=sorted(LSTM_LAYERS),
        default="kmp",
        help="keras_mpfp16.layers.LSTM (float32 carry) or keras.layers.LSTM",
    )
    train = p.add_argument_group("training")
    train.add_argument("--lanes", type=int, default=16, help="lanes (batch) per rank")
    train.add_argument("--chunk", type=int, default=128, help="truncated-BPTT length")
    train.add_argument("--epochs", type=int, default=8)
    train.add_argument("--learning-rate", type=float, default=2e-3, help="Adam, lr0")
    train.add_argument(
        "--lr-rule",
        choices=kmp.callbacks.SCALING_RULES,
        default="paper",
        help="LearningRateScaler rule for N ranks; paper: lr0*N/(1+N/100)",
    )
    train.add_argument("--warmup-epochs", type=float, default=1.0)
    train.add_argument(
        "--positive-weight",
        type=float,
        default=None,
        help="loss weight of steps whose target is 1 (default 4 for synthetic "
        "shots, where they are rare; 1 for --data, whose classes are balanced)",
    )
    train.add_argument(
        "--policy",
        default="float32",
        choices=["float32", "mixed_float16", "mixed_bfloat16"],
    )
    train.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a tiny run for CI: 48+32 short shots (every 8th trial with --data), "
        "2 epochs, 8 units, 4 lanes of 32 steps",
    )
    args = p.parse_args(argv)
    if args.conv and args.data:
        p.error("--conv needs profile signals; the EEG set (--data) has none")
    if args.quick:
        args.shots, args.test_shots, args.epochs, args.units = 48, 32, 2, 8
        args.min_length, args.max_length, args.lanes, args.chunk = 40, 100, 4, 32
    if args.warning_steps is None:
        args.warning_steps = 0 if args.data else 10
    if args.positive_weight is None:
        args.positive_weight = 1.0 if args.data else 4.0
    return args


def load_data(args):
    """(train, test) shots, identical on every rank."""
    if args.data:
        train, test = shot_data.load_eeg_shots(args.data, downsample=4)
        if args.quick:  # every 8th trial (the files are sorted by class)
            train, test = (
                train.subset(slice(None, None, 8)),
                test.subset(slice(None, None, 8)),
            )
        return train, test
    kwargs = dict(
        min_length=args.min_length,
        max_length=args.max_length,
        profile_points=16 if args.conv else 0,
    )
    train = shot_data.generate_shots(args.shots, seed=2 * args.seed, **kwargs)
    test = shot_data.generate_shots(args.test_shots, seed=2 * args.seed + 1, **kwargs)
    return train, test


def build_model(features, profile_points, args):
    """Stateful model with a fixed batch of `lanes` rows of `chunk` steps."""
    inputs = keras.Input(batch_shape=(args.lanes, args.chunk, features))
    x = inputs
    if profile_points:
        # FRNN's front-end: a small 1-D CNN over each step's profile (the
        # radial axis, not time), its features joined to the scalar signals.
        scalars = x[..., : features - profile_points]
        profile = keras.ops.expand_dims(x[..., features - profile_points :], -1)
        encoder = keras.Sequential(
            [
                keras.Input((profile_points, 1)),
                keras.layers.Conv1D(8, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling1D(2),
                keras.layers.Conv1D(8, 3, padding="same", activation="relu"),
                keras.layers.GlobalMaxPooling1D(),
            ],
            name="profile_encoder",
        )
        x = keras.layers.Concatenate()(
            [scalars, keras.layers.TimeDistributed(encoder)(profile)]
        )
    lstm = LSTM_LAYERS[args.lstm]
    for _ in range(args.depth):
        x = lstm(args.units, stateful=True, return_sequences=True)(x)
    # float32 output: the loss and the alarm scores stay in full precision.
    outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="disruption_predictor")


def idle_chunk(lanes, chunk, features):
    """A step with no data: zero inputs, zero weight, every lane reset."""
    x = np.zeros((lanes, chunk, features), "float32")
    y = np.zeros((lanes, chunk, 1), "float32")
    return x, y, np.zeros((lanes, chunk), "float32")


def reset_flags(batcher, steps):
    """(steps, lanes) booleans: lanes that start a shot, or are idle, per step."""
    flags = np.ones((steps, batcher.lanes), dtype=bool)
    for k, step in enumerate(batcher.schedule):
        flags[k] = [slot is None or slot[1] == 0 for slot in step]
    return flags


class LaneResets(keras.callbacks.Callback):
    """Zeroes the lanes that start a new shot before every training step.

    `fit` calls `on_train_batch_begin` right before it runs the step, so the
    reset lands between the previous chunk and this one.
    """

    def __init__(self, flags_per_epoch):
        super().__init__()
        self.flags_per_epoch = flags_per_epoch
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        reset_lanes(self.model, self.flags_per_epoch[self.epoch][batch])


def lane_steps(batchers, steps, features, positive_weight):
    """Yields every epoch's chunks, each epoch padded with idle steps to `steps`."""
    for batcher in batchers:
        done = 0
        for chunk in batcher:
            weight = chunk.sample_weight * (
                1.0 + (positive_weight - 1.0) * chunk.y[..., 0]
            )
            yield chunk.x, chunk.y, weight
            done += 1
        for _ in range(steps - done):
            yield idle_chunk(batcher.lanes, batcher.chunk_length, features)


def predict_shots(model, shots, lanes, chunk):
    """Per-step outputs (one 1-D array per shot) of a stateful lane model."""
    outputs = [np.zeros(len(s), "float64") for s in shots.signals]
    if not len(shots):
        return outputs
    batcher = LaneBatcher(shots.signals, lanes=lanes, chunk_length=chunk)
    for step, piece in zip(batcher.schedule, batcher):
        reset_lanes(model, piece.reset)
        out = np.asarray(model.predict_on_batch(piece.x))[..., 0]
        for lane, slot in enumerate(step):
            if slot is not None:
                index, start = slot
                n = len(outputs[index][start : start + chunk])
                outputs[index][start : start + n] = out[lane, :n]
    return outputs


def global_auc(model, test_mine, args):
    """Per-shot ROC AUC over all ranks' test shots, identical on every rank."""
    outputs = predict_shots(model, test_mine, args.lanes, args.chunk)
    scores = shot_data.alarm_scores(outputs, args.warning_steps)
    scores = kmp.allgather(scores.astype("float64"))
    labels = kmp.allgather(test_mine.disruptive.astype("int8"))
    return shot_data.roc_auc(scores, labels), len(scores), int(labels.sum())


class ShotAUC(keras.callbacks.Callback):
    """Adds the global test AUC to every epoch's logs (all ranks compute it).

    Safe inside `fit`: the next epoch's first chunk resets every lane.
    """

    def __init__(self, test_mine, args):
        super().__init__()
        self.test_mine, self.args = test_mine, args

    def on_epoch_end(self, epoch, logs=None):
        auc, _, _ = global_auc(self.model, self.test_mine, self.args)
        if logs is not None:
            logs["test_auc"] = auc


def main(argv=None):
    args = parse_args(argv)
    keras.config.set_dtype_policy(args.policy)
    keras.utils.set_random_seed(args.seed)  # same initial weights everywhere
    rank, size = kmp.rank(), kmp.size()
    train, test = load_data(args)
    label = "positive" if args.data else "disruptive"  # what a label-1 shot is

    # Every rank gets its own shots: dealt round-robin from one seeded
    # permutation, the same number per rank (the last len % N are unused).
    order = np.random.default_rng(args.seed).permutation(len(train))
    train_mine = train.subset(kmp.shard(order))
    test_mine = test.subset(kmp.shard(np.arange(len(test)), drop_remainder=False))

    # One lane schedule per epoch (a new shot order each epoch). Ranks'
    # schedules differ in length; all run the longest, padded with idle
    # steps of zero weight, because every step is a collective.
    batchers = [
        LaneBatcher(
            train_mine.signals,
            train_mine.targets,
            lanes=args.lanes,
            chunk_length=args.chunk,
            shuffle=True,
            seed=1000 * args.seed + epoch,
        )
        for epoch in range(args.epochs)
    ]
    local_steps = max(len(b) for b in batchers)
    steps = int(kmp.allreduce(np.int64(local_steps), op="max"))
    flags = [reset_flags(b, steps) for b in batchers]

    model = build_model(train.features, train.profile_points, args)
    model.compile(
        optimizer=kmp.DistributedOptimizer(
            keras.optimizers.Adam(args.learning_rate, clipnorm=1.0)
        ),
        loss="binary_crossentropy",
    )
    if rank == 0:
        model.summary()
        print(
            f"ranks {size}, {len(train)} training shots "
            f"({int(train.disruptive.sum())} {label}), {len(test)} test shots, "
            f"{args.lanes} lanes x {args.chunk} steps per rank, {steps} steps/epoch, "
            f"policy {args.policy}, LSTM {args.lstm}",
            flush=True,
        )

    callbacks = [
        LaneResets(flags),
        kmp.callbacks.LearningRateScaler(
            rule=args.lr_rule, warmup_epochs=args.warmup_epochs
        ),
        ShotAUC(test_mine, args),
    ]
    started = time.time()
    model.fit(
        lane_steps(batchers, steps, train.features, args.positive_weight),
        steps_per_epoch=steps,
        epochs=args.epochs,
        callbacks=callbacks,
        shuffle=False,  # the lane schedules are already shuffled, per epoch
        verbose=2 if rank == 0 else 0,
    )
    seconds = time.time() - started
    auc, count, positives = global_auc(model, test_mine, args)
    if rank == 0:
        print(
            f"test AUC: {auc:.4f} over {count} shots ({positives} {label}), "
            f"warning time {args.warning_steps} steps, training {seconds:.1f} s",
            flush=True,
        )
    return auc


if __name__ == "__main__":
    main()
