"""A rank's share of a `keras.utils.PyDataset`."""

from __future__ import annotations

import keras


class ShardedPyDataset(keras.utils.PyDataset):
    """The batches of a `PyDataset` that belong to one rank.

    Batches are dealt round-robin: this rank's batch i is the base dataset's
    batch `rank + i * num_ranks`, so the ranks' i-th batches together are the
    base dataset's batches `[i * N, (i + 1) * N)`. With `drop_remainder=True`
    every rank has `len(base) // N` batches (the last `len(base) % N` are
    dropped); otherwise the first `len(base) % N` ranks have one more.
    Worker settings and the epoch hooks are those of the base dataset (each
    rank calls `on_epoch_end` on its own copy of it). Made by
    `keras_mpfp16.shard`.

    Args:
        dataset: The full `PyDataset`, identical on every rank.
        rank: This rank.
        num_ranks: N.
        drop_remainder: See above.
    """

    def __init__(
        self,
        dataset: keras.utils.PyDataset,
        rank: int,
        num_ranks: int,
        drop_remainder: bool = True,
    ):
        super().__init__(
            workers=dataset.workers,
            use_multiprocessing=dataset.use_multiprocessing,
            max_queue_size=dataset.max_queue_size,
        )
        self.dataset = dataset
        self.rank = rank
        self.num_ranks = num_ranks
        self.drop_remainder = drop_remainder

    @property
    def num_batches(self) -> int | None:
        total = self.dataset.num_batches
        if total is None:  # infinite
            return None
        if self.drop_remainder:
            return total // self.num_ranks
        return total // self.num_ranks + (self.rank < total % self.num_ranks)

    def __len__(self) -> int:
        n = self.num_batches
        if n is None:
            raise TypeError("This sharded PyDataset is infinite and has no length.")
        return n

    def __getitem__(self, index: int):
        n = self.num_batches
        if n is not None and not 0 <= index < n:
            raise IndexError(
                f"Batch index {index} out of range for this rank's {n} batches."
            )
        return self.dataset[self.rank + index * self.num_ranks]

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()
