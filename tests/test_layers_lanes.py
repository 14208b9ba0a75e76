"""LaneBatcher and reset_lanes: truncated BPTT over lanes of long sequences."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import pytest

from keras_mpfp16.layers import GRU, LSTM, LaneBatcher, reset_lanes


@pytest.fixture(autouse=True)
def restore_policy():
    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


def ramp_sequences(lengths, features=1):
    """Sequence i holds values 100 * i + t, so every step is identifiable."""
    return [
        (100 * i + np.arange(n, dtype="float32"))[:, None].repeat(features, axis=1)
        for i, n in enumerate(lengths)
    ]


def test_schedule_pads_resets_and_ends():
    sequences = ramp_sequences([5, 3, 7, 2])
    targets = [s[:, 0].astype("int32") for s in sequences]
    chunks = list(LaneBatcher(sequences, targets, lanes=2, chunk_length=3))
    assert len(chunks) == len(LaneBatcher(sequences, lanes=2, chunk_length=3)) == 4

    expected_x = [
        [[0, 1, 2], [100, 101, 102]],
        [[3, 4, 0], [200, 201, 202]],  # seq 0 ends (padded); seq 2 starts on lane 1
        [[300, 301, 0], [203, 204, 205]],  # seq 3 starts on lane 0
        [[0, 0, 0], [206, 0, 0]],  # lane 0 idle at the end of the data
    ]
    expected_weight = [
        [[1, 1, 1], [1, 1, 1]],
        [[1, 1, 0], [1, 1, 1]],
        [[1, 1, 0], [1, 1, 1]],
        [[0, 0, 0], [1, 0, 0]],
    ]
    expected_reset = [[True, True], [False, True], [True, False], [True, False]]
    for chunk, x, w, r in zip(chunks, expected_x, expected_weight, expected_reset):
        np.testing.assert_array_equal(chunk.x[..., 0], x)
        np.testing.assert_array_equal(chunk.y, np.asarray(x, "int32"))
        np.testing.assert_array_equal(chunk.sample_weight, w)
        np.testing.assert_array_equal(chunk.reset, r)
        assert chunk.x.shape == (2, 3, 1) and chunk.sample_weight.dtype == np.float32


def test_every_step_appears_once_in_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=13)
    sequences = ramp_sequences(lengths)
    seen = {i: [] for i in range(len(lengths))}
    for chunk in LaneBatcher(sequences, lanes=3, chunk_length=8, shuffle=True, seed=4):
        for lane in range(3):
            values = chunk.x[lane, chunk.sample_weight[lane] == 1, 0]
            for v in values:
                seen[int(v) // 100].append(int(v) % 100)
    for i, n in enumerate(lengths):
        assert seen[i] == list(range(n))


def test_deterministic_and_seeded():
    sequences = ramp_sequences([4, 9, 2, 6, 5])

    def schedule(**kwargs):
        return [
            c.x.tolist()
            for c in LaneBatcher(sequences, lanes=2, chunk_length=3, **kwargs)
        ]

    assert schedule() == schedule()
    assert schedule(shuffle=True, seed=1) == schedule(shuffle=True, seed=1)
    orders = {
        tuple(
            LaneBatcher(sequences, lanes=2, chunk_length=3, shuffle=True, seed=s).order
        )
        for s in range(6)
    }
    assert len(orders) > 1
    batcher = LaneBatcher(sequences, lanes=2, chunk_length=3)
    assert [c.x.tolist() for c in batcher] == [c.x.tolist() for c in batcher]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"lanes": 0, "chunk_length": 3},
            r"`lanes`: expected an integer >= 1. Received: lanes=0",
        ),
        (
            {"lanes": 2, "chunk_length": 2.5},
            r"`chunk_length`: .* Received: chunk_length=2\.5",
        ),
        ({"lanes": True, "chunk_length": 3}, r"`lanes`: .* Received: lanes=True"),
        (
            {"lanes": 2, "chunk_length": 3, "shuffle": True, "seed": -1},
            r"`seed`: expected None or an integer >= 0. Received: seed=-1",
        ),
        (
            {"lanes": 2, "chunk_length": 3, "shuffle": "yes"},
            r"`shuffle`: expected one of True, False. Received: shuffle='yes'",
        ),
    ],
)
def test_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LaneBatcher(ramp_sequences([3]), **kwargs)


def test_bad_sequences_and_targets():
    with pytest.raises(ValueError, match="empty"):
        LaneBatcher([], lanes=1, chunk_length=2)
    with pytest.raises(ValueError, match=r"sequences\[1\] has shape \(3, 2\)"):
        LaneBatcher([np.zeros((3, 1)), np.zeros((3, 2))], lanes=1, chunk_length=2)
    with pytest.raises(ValueError, match=r"sequences\[0\] has shape \(0, 1\)"):
        LaneBatcher([np.zeros((0, 1))], lanes=1, chunk_length=2)
    with pytest.raises(ValueError, match="2 entries for 1 sequences"):
        LaneBatcher(
            [np.zeros((3, 1))], [np.zeros(3), np.zeros(3)], lanes=1, chunk_length=2
        )
    with pytest.raises(
        ValueError, match=r"targets\[0\] has shape \(2,\) for a sequence of length 3"
    ):
        LaneBatcher([np.zeros((3, 1))], [np.zeros(2)], lanes=1, chunk_length=2)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_lanes_through_stateful_model_equal_whole_sequences(cls):
    """Chunked stateful inference with lane resets == each sequence in one pass."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(0)
    sequences = [rng.normal(size=(n, 3)).astype("float32") for n in (11, 4, 9, 6, 7)]
    lanes, chunk_length, units = 2, 4, 5
    keras.utils.set_random_seed(0)
    stateful = keras.Sequential(
        [
            keras.Input(batch_shape=(lanes, chunk_length, 3)),
            cls(units, stateful=True, return_sequences=True),
        ]
    )
    whole = keras.Sequential(
        [keras.Input((None, 3)), cls(units, return_sequences=True)]
    )
    whole.set_weights(stateful.get_weights())

    batcher = LaneBatcher(sequences, lanes=lanes, chunk_length=chunk_length)
    pieces = {i: [] for i in range(len(sequences))}
    for step, chunk in zip(batcher.schedule, batcher):
        reset_lanes(stateful, chunk.reset)
        # A direct call: on JAX, Keras's predict() does not carry RNN states.
        outputs = np.asarray(keras.ops.cast(stateful(chunk.x), "float32"))
        for lane, slot in enumerate(step):
            if slot is not None:
                valid = chunk.sample_weight[lane] == 1
                pieces[slot[0]].append(outputs[lane, valid])
    for i, sequence in enumerate(sequences):
        reference = np.asarray(whole.predict_on_batch(sequence[None]), "float32")[0]
        np.testing.assert_allclose(np.concatenate(pieces[i]), reference, atol=2e-3)


def test_train_on_batch_with_lanes_runs():
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(1)
    sequences = [rng.normal(size=(n, 2)).astype("float32") for n in (9, 5, 7)]
    targets = [rng.normal(size=(len(s), 1)).astype("float32") for s in sequences]
    model = keras.Sequential(
        [
            keras.Input(batch_shape=(2, 4, 2)),
            LSTM(4, stateful=True, return_sequences=True),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    for chunk in LaneBatcher(sequences, targets, lanes=2, chunk_length=4):
        reset_lanes(model, chunk.reset)
        loss = model.train_on_batch(chunk.x, chunk.y, sample_weight=chunk.sample_weight)
        assert np.isfinite(loss)
