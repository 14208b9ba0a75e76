"""Shots: long multichannel sequences with rare events, and the per-shot metric.

The data model of disruption prediction (FRNN, Svyatkovskiy et al. 2017;
Kates-Harbeck et al. 2019): a "shot" is one plasma discharge, a multichannel
time series of variable length; a minority of shots end in a disruption,
announced by precursors in the last tens of steps. A predictor outputs a
score per time step; a shot raises an alarm at threshold `t` when its score
exceeds `t` at any step before the last `warning_steps` (an alarm that late
is useless). Disruptive shots with an alarm are true positives,
non-disruptive shots with an alarm false positives; the figure of merit is
the area under that ROC curve over all thresholds.

This module has no Keras and no MPI:

- `generate_shots`: a synthetic shot set (the built-in data of the examples).
- `load_eeg_shots`: the real EEG set `SelfRegulationSCP1.npz` in the same
  form (whole-sequence labels).
- `alarm_scores`, `roc_auc`: the per-shot metric, exact (no binning).
"""

from __future__ import annotations

import dataclasses

import numpy as np

SCALAR_CHANNELS = ("current", "locked_mode", "radiation", "mhd", "density", "beta")


@dataclasses.dataclass
class Shots:
    """A set of shots.

    Attributes:
        signals: One float32 array per shot, `(length_i, features)`.
        targets: One float32 array per shot, `(length_i, 1)`: the per-step
            training target (1 inside the alarm window of a disruptive shot).
        disruptive: bool `(num_shots,)`, the per-shot label.
        profile_points: How many of the last features form a 1-D profile
            (e.g. a radial temperature profile) per time step; 0 if none.
    """

    signals: list[np.ndarray]
    targets: list[np.ndarray]
    disruptive: np.ndarray
    profile_points: int = 0

    def __len__(self) -> int:
        return len(self.signals)

    @property
    def features(self) -> int:
        return self.signals[0].shape[-1]

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.signals])

    def subset(self, indices) -> Shots:
        """The shots at `indices` (an index array, a slice or a mask)."""
        keep = np.arange(len(self))[indices]
        return Shots(
            [self.signals[i] for i in keep],
            [self.targets[i] for i in keep],
            self.disruptive[keep],
            self.profile_points,
        )

    def stacked(self) -> np.ndarray:
        """All signals as one `(num_shots, length, features)` array (equal lengths)."""
        if len(set(self.lengths.tolist())) != 1:
            raise ValueError("stacked() needs shots of equal length.")
        return np.stack(self.signals)


def _ar1_noise(rng, shape, phi: float, sigma: float) -> np.ndarray:
    """Stationary AR(1) noise along axis 1 of `shape` (n, time, channels)."""
    n, steps, channels = shape
    eps = rng.normal(0.0, sigma * np.sqrt(1.0 - phi**2), size=shape).astype("float32")
    out = np.empty(shape, dtype="float32")
    out[:, 0] = rng.normal(0.0, sigma, size=(n, channels))
    for t in range(1, steps):
        out[:, t] = phi * out[:, t - 1] + eps[:, t]
    return out


def generate_shots(
    num_shots: int,
    *,
    min_length: int = 200,
    max_length: int = 600,
    disruptive_fraction: float = 0.15,
    horizon: int = 40,
    precursor_strength: float = 2.0,
    decoys_per_100_steps: float = 1.0,
    profile_points: int = 0,
    seed: int = 0,
) -> Shots:
    """Synthetic shots: noisy plasma-like signals, rare disruptions with precursors.

    Six scalar channels (`SCALAR_CHANNELS`): a plasma current with a ramp-up,
    three channels that carry the precursor (a growing locked mode, rising
    radiation, a growing MHD oscillation) and two distractors, all with
    correlated AR(1) noise. A disruptive shot ends in the disruption; its
    precursor starts at a random time between `horizon / 2` and
    `2 * horizon` steps before the end and grows until the end on all three
    precursor channels together. "Decoys" are transient bumps of the same
    size on a single precursor channel, in every shot: an instantaneous
    threshold on one channel cannot separate the classes, the model has to
    combine channels and time.

    With `profile_points > 0` each step also carries a 1-D profile (a
    peaked temperature-like profile over a radius); in disruptive shots its
    core collapses with the precursor. These are the last `profile_points`
    features, for a convolutional front-end.

    The per-step target is 1 in the last `horizon` steps of a disruptive
    shot and 0 elsewhere.

    Args:
        num_shots: How many shots.
        min_length: Shortest shot, in steps.
        max_length: Longest shot; lengths are uniform in [min, max].
        disruptive_fraction: Expected fraction of disruptive shots (real
            data sets: about 10-20%).
        horizon: Length of the alarm window the target marks.
        precursor_strength: Peak precursor amplitude relative to the noise
            (1 = hard, 2 = the default; the difficulty knob).
        decoys_per_100_steps: Expected number of decoy bumps per 100 steps.
        profile_points: Points of the per-step profile; 0 for none.
        seed: Seed of the generator; the same arguments give the same data.

    Returns:
        A `Shots`.
    """
    if not 1 <= min_length <= max_length:
        raise ValueError(
            f"Need 1 <= min_length <= max_length; got {min_length}, {max_length}."
        )
    rng = np.random.default_rng(seed)
    n, steps = num_shots, max_length
    lengths = rng.integers(min_length, max_length + 1, size=n)
    disruptive = rng.random(n) < disruptive_fraction

    # Every shot is generated end-aligned in a (n, max_length) frame: the
    # shot is the last `length` steps, so precursors and targets (defined
    # from the end) are vectorised over all shots.
    to_end = (steps - 1 - np.arange(steps))[None, :]  # steps left until the end
    since_start = np.arange(steps)[None, :] - (steps - lengths)[:, None]

    scalars = _ar1_noise(rng, (n, steps, len(SCALAR_CHANNELS)), phi=0.9, sigma=0.3)
    # Plasma current: ramp-up over 20 steps to a flat top with a slow drift.
    drift = rng.normal(0.0, 0.05, size=(n, 1)) * since_start / max(max_length, 1)
    scalars[..., 0] += np.clip(since_start / 20.0, 0.0, 1.0) * (1.0 + drift)
    # MHD: an oscillation of random frequency and phase, amplitude 0.3.
    freq = rng.uniform(0.05, 0.15, size=(n, 1))
    phase = rng.uniform(0.0, 2 * np.pi, size=(n, 1))
    oscillation = np.sin(2 * np.pi * freq * np.arange(steps)[None, :] + phase)
    mhd_amplitude = np.full((n, steps), 0.3, dtype="float32")

    # Precursor ramp: 0 before the onset, rising to 1 at the disruption.
    onset = rng.integers(max(horizon // 2, 1), 2 * horizon + 1, size=(n, 1))
    onset = np.minimum(onset, lengths[:, None] - 1)
    ramp = np.clip(1.0 - to_end / np.maximum(onset, 1), 0.0, 1.0) * disruptive[:, None]
    ramp = ramp.astype("float32")
    s = precursor_strength
    scalars[..., 1] += s * 0.6 * (np.expm1(2.0 * ramp) / np.expm1(2.0))  # locked mode
    scalars[..., 2] += s * 0.6 * ramp  # radiation
    mhd_amplitude += s * 0.6 * ramp**2

    # Decoys: a bump on one precursor channel, 10-40 steps long.
    expected = decoys_per_100_steps * lengths / 100.0
    for i in np.nonzero(rng.poisson(expected))[0].tolist():
        for _ in range(int(rng.poisson(expected[i])) + 1):
            width = int(rng.integers(10, 41))
            start = int(rng.integers(steps - lengths[i], steps))
            t = np.arange(start, min(start + width, steps))
            bump = s * 0.6 * np.sin(np.pi * (t - start) / width)
            channel = int(rng.integers(0, 3))
            if channel == 2:
                mhd_amplitude[i, t] += bump
            else:
                scalars[i, t, 1 + channel] += bump
    scalars[..., 3] += mhd_amplitude * oscillation

    parts = [scalars]
    if profile_points:
        radius = np.linspace(0.0, 1.0, profile_points, dtype="float32")
        width = rng.uniform(0.35, 0.5, size=(n, 1, 1)).astype("float32")
        profile = np.exp(-((radius / width) ** 2))  # (n, 1, points)
        # Core collapse: the centre drops with the precursor, by 8% at the
        # disruption at the default strength: a hand-made alarm on the core
        # alone gets an AUC of about 0.8, so the profile adds evidence
        # without giving the answer away.
        core = np.exp(-((radius / 0.25) ** 2))
        profile = profile * (1.0 - s * 0.04 * ramp[..., None] * core)
        profile = profile + rng.normal(0.0, 0.1, size=(n, steps, profile_points))
        parts.append(profile.astype("float32"))
    frame = np.concatenate(parts, axis=-1).astype("float32")
    target = ((to_end < horizon) & disruptive[:, None]).astype("float32")

    signals = [frame[i, steps - lengths[i] :] for i in range(n)]
    targets = [target[i, steps - lengths[i] :, None] for i in range(n)]
    return Shots(signals, targets, disruptive, profile_points)


def load_eeg_shots(path: str, downsample: int = 4) -> tuple[Shots, Shots]:
    """The real EEG set SelfRegulationSCP1.npz as (train, test) shots.

    BCI Competition II Ia: 6 channels, 896 steps per trial, one binary label
    per trial (X_train (268, 896, 6), y_train (268,), X_test (293, 896, 6),
    y_test (293,)). Channels are normalised with the training set's mean and
    std; time is downsampled by averaging blocks of `downsample` steps. The
    label becomes the per-step target of every step (the whole trial is
    evidence), and the per-shot label.
    """
    data = np.load(path)
    x_train = data["X_train"].astype("float32")
    mean = x_train.mean(axis=(0, 1), keepdims=True)
    std = x_train.std(axis=(0, 1), keepdims=True)

    def shots(x, y):
        x = (x.astype("float32") - mean) / std
        if downsample > 1:
            steps = x.shape[1] // downsample
            x = x[:, : steps * downsample]
            x = x.reshape(x.shape[0], steps, downsample, x.shape[2]).mean(axis=2)
        labels = np.asarray(y).astype(bool)
        targets = [np.full((x.shape[1], 1), float(v), "float32") for v in labels]
        return Shots(list(x), targets, labels)

    train = shots(data["X_train"], data["y_train"])
    return train, shots(data["X_test"], data["y_test"])


def alarm_scores(outputs, warning_steps: int = 0) -> np.ndarray:
    """Per-shot alarm score: the largest per-step output before the warning time.

    A shot raises an alarm at threshold `t` iff its score exceeds `t`.

    Args:
        outputs: One 1-D array of per-step outputs per shot.
        warning_steps: Ignore the last `warning_steps` steps of each shot
            (an alarm there comes too late to act on). At least the first
            step is always used.
    """
    scores = []
    for out in outputs:
        out = np.asarray(out, dtype="float64").reshape(-1)
        keep = max(len(out) - warning_steps, 1)
        scores.append(out[:keep].max())
    return np.asarray(scores, dtype="float64")


def roc_auc(scores, labels) -> float:
    """Exact area under the ROC curve over all alarm thresholds.

    Equals the probability that a random positive shot scores higher than a
    random negative one, ties counted one half (the trapezoidal area of the
    ROC curve traced by every distinct threshold). NaN if one class is empty.
    """
    scores = np.asarray(scores, dtype="float64").reshape(-1)
    labels = np.asarray(labels).astype(bool).reshape(-1)
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        return float("nan")
    # Mid-ranks: tied scores share the mean of their ranks (a tie counts 1/2).
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse.reshape(-1)]
    u = ranks[labels].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))
