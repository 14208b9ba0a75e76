"""The wrappers of `keras.Model.fit` and `keras.Model.evaluate`.

For a model whose optimizer is not a `DistributedOptimizer` the wrappers
call Keras's method unchanged. For one that is, they run Keras's method
inside `training.sessions.fit_arguments` / `evaluate_arguments` (what
`kmp.distributed_fit` / `kmp.distributed_evaluate` give code that calls
Keras itself):

- `fit` (always collective): with more than one process, the replica sync
  before the first step, global logs, split validation, safe file-writing
  callbacks (see `training.run`); with one process, Keras's fit.
- `evaluate`: ranks ask the rendezvous (`runtime.rendezvous`) whether all of
  them called it. Together: the batches are split over the ranks and every
  rank gets the global metrics. Alone (e.g. rank 0 evaluating a model it
  loaded): Keras's evaluate, no collective.
- Both refuse a model that another distribution engine (a `tf.distribute`
  strategy, a `keras.distribution`) would also distribute
  (`optimizer.engines`).
- `predict` is not wrapped: each rank predicts its own input, as in Keras
  (`keras_mpfp16.split_predict` splits one input over the ranks).

Inside a `distributed_fit` / `distributed_evaluate` block of the same model
(e.g. a subclass's `fit` calling `super().fit(**kwargs)` there), the
wrappers pass through. `training.patches` installs them.
"""

from __future__ import annotations

import functools

from keras_mpfp16.training import sessions

MARK = "_keras_mpfp16_hook"


def _wrap(original, arguments: str):
    """`original` (`keras.Model.fit` or `evaluate`) as one collective run of
    a DistributedOptimizer model, prepared by `sessions.<arguments>`; any
    other model, or a call inside a session, runs `original` as it is."""

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        if not sessions.uses_distributed_optimizer(self) or sessions.in_session(self):
            return original(self, *args, **kwargs)
        prepare = getattr(sessions, arguments)
        with prepare(original, (self, *args), kwargs) as prepared:
            return original(**prepared)

    setattr(wrapped, MARK, True)
    return wrapped


def wrap_fit(original):
    """`keras.Model.fit` (`original`) as a collective fit of DistributedOptimizer models."""
    return _wrap(original, "fit_arguments")


def wrap_evaluate(original):
    """`keras.Model.evaluate` (`original`), collective when every rank calls it."""
    return _wrap(original, "evaluate_arguments")
