"""A synthetic stand-in for `keras.datasets.imdb`: same shapes, learnable sentiment.

For machines that cannot download IMDB (this project's CI and test machine
reach no dataset hosts). `load_data(num_words)` returns what
`keras.datasets.imdb.load_data(num_words=...)` returns: 25,000 training and
25,000 test reviews as lists of word indices (1 = start, 2 = out of
vocabulary, words from 3 on), labels 0/1, balanced.

How a review is made: a length between 40 and 600 words (IMDB's median is
~230), words drawn from a Zipf-like distribution over the vocabulary, and
about 5% of the positions replaced by "sentiment words": 100 word indices
chosen once as positive and 100 as negative, taken from the review's own
class 80% of the time and from the other class 20% of the time. A model has
to find those words among ~200 ordinary ones and weigh them. How soon it
does depends on the seed and the number of steps: with the default 5%,
keras.io's bidirectional LSTM ended one epoch (one process, 2026-12-01) at
0.53-0.90 validation accuracy over seeds at batch 32 and 0.69-0.91 at batch
64 (the global batch of np=2), where the real set gives about 0.85-0.88.
`sentiment_rate=0.08` makes one epoch reliable (0.948-0.963 over three
seeds at batch 64, one process). These are one-off observations, not
benchmark results. Deterministic for a given seed; plain numpy, no Keras.
"""

from __future__ import annotations

import json
import time

import numpy as np

START, OOV, INDEX_FROM = 1, 2, 3


def load_data(
    num_words: int = 20000,
    num_train: int = 25000,
    num_test: int = 25000,
    seed: int = 113,
    sentiment_rate: float = 0.05,
    consistency: float = 0.8,
):
    """Synthetic IMDB: `((x_train, y_train), (x_test, y_test))`.

    Args:
        num_words: Vocabulary size, as `keras.datasets.imdb.load_data`'s.
        num_train: Training reviews.
        num_test: Test reviews.
        seed: Everything is derived from it.
        sentiment_rate: Fraction of a review's words that are sentiment words.
        consistency: Probability that a sentiment word belongs to the
            review's own class.

    Returns:
        `(x_train, y_train), (x_test, y_test)`: x as lists of lists of ints,
        y as int64 arrays.
    """
    rng = np.random.default_rng(seed)
    words = np.arange(INDEX_FROM, num_words)
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    frequency = 1.0 / ranks**1.07
    frequency /= frequency.sum()
    # Sentiment words: mid-frequency words, 100 per class.
    candidates = rng.permutation(words[100 : min(len(words), 8000)])
    positive, negative = candidates[:100], candidates[100:200]

    def reviews(count):
        labels = rng.integers(0, 2, size=count)
        xs = []
        for label in labels:
            length = int(np.clip(rng.lognormal(5.3, 0.6), 40, 600))
            review = rng.choice(words, size=length, p=frequency)
            marked = rng.random(length) < sentiment_rate
            own = rng.random(length) < consistency
            from_positive = np.where(own, label == 1, label == 0)
            chosen = np.where(
                from_positive,
                rng.choice(positive, size=length),
                rng.choice(negative, size=length),
            )
            review = np.where(marked, chosen, review)
            xs.append([START] + review.tolist())
        return xs, labels.astype(np.int64)

    return reviews(num_train), reviews(num_test)


class PhaseTimer:
    """Benchmark harness: wall time of each phase of `fit`, printed as JSON.

    A Keras callback (built lazily so this module stays importable without
    Keras): training (first batch to last batch), validation, the gap from
    the last batch to validation, from validation to the end of the epoch,
    and from `on_train_end` to `report()` (fit's own teardown). Times are
    from the moment the timer was created.
    """

    def __new__(cls):
        import keras

        class _PhaseTimer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.t0 = time.perf_counter()
                self.marks: dict = {}

            def _mark(self, name):
                self.marks.setdefault(name, time.perf_counter() - self.t0)

            def on_train_begin(self, logs=None):
                self._mark("train_begin")

            def on_train_batch_end(self, batch, logs=None):
                self.marks["last_batch"] = time.perf_counter() - self.t0

            def on_test_begin(self, logs=None):
                self._mark("test_begin")

            def on_test_end(self, logs=None):
                self._mark("test_end")

            def on_epoch_end(self, epoch, logs=None):
                self._mark("epoch_end")

            def on_train_end(self, logs=None):
                self._mark("train_end")

            def report(self, **extra):
                m = dict(self.marks, returned=time.perf_counter() - self.t0)
                phases = {
                    "train_s": m["last_batch"] - m["train_begin"],
                    "to_validation_s": m["test_begin"] - m["last_batch"],
                    "validation_s": m["test_end"] - m["test_begin"],
                    "to_epoch_end_s": m["epoch_end"] - m["test_end"],
                    "teardown_s": m["returned"] - m["train_end"],
                }
                print(json.dumps({"phases": phases, **extra}), flush=True)

        return _PhaseTimer()
