"""Cuts long sequences into lanes of consecutive chunks for truncated BPTT.

Each batch row is a "lane": it carries one long sequence chunk after chunk,
so a stateful recurrent layer continues that sequence from one batch to the
next. When a lane's sequence ends, the lane takes the next sequence and only
its state is reset (`reset_lanes(model, chunk.reset)`). This is the scheme of
the FRNN code for disruption prediction: truncated BPTT over chunks of 128
steps of sequences thousands of steps long.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from keras_mpfp16 import _validate


class LaneChunk(NamedTuple):
    """One training step of a `LaneBatcher`.

    Attributes:
        x: Inputs, shape `(lanes, chunk_length, *features)`.
        y: Targets, shape `(lanes, chunk_length, *target_shape)`, or None when
            the batcher has no targets.
        sample_weight: float32 `(lanes, chunk_length)`: 1 for real time steps,
            0 for padding (the tail of a sequence's last chunk, idle lanes).
        reset: bool `(lanes,)`: True where the lane starts a new sequence (or
            is idle) with this chunk; reset those lanes' state first.
    """

    x: np.ndarray
    y: np.ndarray | None
    sample_weight: np.ndarray
    reset: np.ndarray


class LaneBatcher:
    """Deterministic lane schedule over long sequences, chunk by chunk.

    Sequences are taken in order (or in one seeded random order) and assigned
    to lanes as lanes become free, lane 0 first. A sequence occupies its lane
    for `ceil(length / chunk_length)` consecutive steps; its last chunk is
    right-padded with zeros and zero `sample_weight`, and the next sequence on
    that lane starts at the next step with `reset=True` for that lane.

    End of data: when no sequence is left, free lanes stay idle (zero inputs,
    zero weights, `reset=True`) until the last busy lane finishes; the
    iteration stops after the last step holding real data. No data is
    dropped, and padded steps carry zero weight, so they add nothing to a
    loss computed with `sample_weight`.

    Args:
        sequences: Sequence of arrays, each `(length_i, *features)`, with the
            same feature shape.
        targets: Optional sequence of per-step target arrays, each
            `(length_i, *target_shape)`, aligned with `sequences`.
        lanes: Number of lanes (the batch size of the stateful model).
        chunk_length: Time steps per chunk (the truncation length).
        shuffle: If True, visit the sequences in a random order drawn once
            from `seed`; iterating again repeats the same schedule.
        seed: Seed for `shuffle`. Use a different seed per epoch for a new
            order.

    Example:

    >>> batcher = LaneBatcher(signals, labels, lanes=16, chunk_length=128)
    >>> for chunk in batcher:
    ...     reset_lanes(model, chunk.reset)
    ...     model.train_on_batch(chunk.x, chunk.y,
    ...                          sample_weight=chunk.sample_weight)
    """

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        targets: Sequence[np.ndarray] | None = None,
        *,
        lanes: int,
        chunk_length: int,
        shuffle: bool = False,
        seed: int | None = None,
    ):
        self.lanes = _validate.positive_int("lanes", lanes)
        self.chunk_length = _validate.positive_int("chunk_length", chunk_length)
        self.shuffle = _validate.one_of("shuffle", shuffle, (True, False))
        seed = _validate.non_negative_int("seed", seed, allow_none=True)
        self.sequences = [np.asarray(s) for s in sequences]
        self.targets = None if targets is None else [np.asarray(t) for t in targets]
        self._validate()
        order = np.arange(len(self.sequences))
        if self.shuffle:
            order = np.random.default_rng(seed).permutation(order)
        self.order = order
        self._schedule = self._build_schedule()

    def _validate(self) -> None:
        if not self.sequences:
            raise ValueError("`sequences` is empty; LaneBatcher needs at least one.")
        feature_shape = self.sequences[0].shape[1:]
        for i, seq in enumerate(self.sequences):
            if seq.ndim < 2 or seq.shape[0] == 0 or seq.shape[1:] != feature_shape:
                raise ValueError(
                    f"sequences[{i}] has shape {seq.shape}; every sequence must "
                    f"be (length >= 1, *{feature_shape}) like sequences[0]."
                )
        if self.targets is None:
            return
        if len(self.targets) != len(self.sequences):
            raise ValueError(
                f"`targets` has {len(self.targets)} entries for "
                f"{len(self.sequences)} sequences; they must match one to one."
            )
        target_shape = self.targets[0].shape[1:]
        for i, (seq, target) in enumerate(zip(self.sequences, self.targets)):
            if target.ndim < 1 or target.shape[0] != seq.shape[0]:
                raise ValueError(
                    f"targets[{i}] has shape {target.shape} for a sequence of "
                    f"length {seq.shape[0]}; targets are per time step."
                )
            if target.shape[1:] != target_shape:
                raise ValueError(
                    f"targets[{i}] has shape {target.shape}; every target must "
                    f"be (length, *{target_shape}) like targets[0]."
                )

    def _build_schedule(self) -> list[list[tuple[int, int] | None]]:
        """Per step, per lane: (sequence index, start) or None when idle."""
        pending = list(self.order)[::-1]  # pop() takes the next in order
        current: list[tuple[int, int] | None] = [None] * self.lanes
        schedule = []
        while True:
            step = []
            for lane in range(self.lanes):
                slot = current[lane]
                if slot is not None:
                    index, start = slot
                    start += self.chunk_length
                    slot = (
                        (index, start) if start < len(self.sequences[index]) else None
                    )
                if slot is None and pending:
                    slot = (int(pending.pop()), 0)
                current[lane] = slot
                step.append(slot)
            if all(slot is None for slot in step):
                return schedule
            schedule.append(step)

    @property
    def schedule(self) -> list[list[tuple[int, int] | None]]:
        """Per step, per lane: `(sequence index, start step)`, None if idle.

        Maps each row of each chunk back to its source, e.g. to gather
        per-sequence predictions.
        """
        return [list(step) for step in self._schedule]

    def __len__(self) -> int:
        """Number of chunks (training steps) in one pass over the data."""
        return len(self._schedule)

    def __iter__(self) -> Iterator[LaneChunk]:
        for step in self._schedule:
            yield self._chunk(step)

    def _chunk(self, step) -> LaneChunk:
        length = self.chunk_length
        first = self.sequences[0]
        x = np.zeros((self.lanes, length) + first.shape[1:], dtype=first.dtype)
        y = None
        if self.targets is not None:
            t0 = self.targets[0]
            y = np.zeros((self.lanes, length) + t0.shape[1:], dtype=t0.dtype)
        weight = np.zeros((self.lanes, length), dtype="float32")
        reset = np.ones((self.lanes,), dtype=bool)
        for lane, slot in enumerate(step):
            if slot is None:
                continue
            index, start = slot
            piece = self.sequences[index][start : start + length]
            x[lane, : len(piece)] = piece
            if y is not None:
                y[lane, : len(piece)] = self.targets[index][start : start + length]
            weight[lane, : len(piece)] = 1.0
            reset[lane] = start == 0
        return LaneChunk(x, y, weight, reset)
