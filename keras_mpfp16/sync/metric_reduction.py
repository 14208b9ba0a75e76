"""The in-step metric reduction: every callback's logs describe all ranks' data.

Keras metric state is additive: a `Mean` holds (total, count), a confusion-
matrix metric holds counts, `AUC` holds per-threshold counts, the loss
tracker is a `Mean` weighted by batch size. Summing every rank's per-step
*increment* of that state therefore gives exactly the state one process
would have after seeing all ranks' batches. A `MetricReduction` does this
inside the train and test steps:

1. read the metric variables (the global state so far) and zero them,
2. run the original step (the variables now hold this rank's increment),
3. allreduce-sum the increments (one small fused MPI call),
4. assign state + summed increments, and return logs recomputed from it.

Because this happens inside the step, the progress bar and every callback,
in whatever order they are listed, see global, sample-weighted values (not a
mean of per-rank means), per batch and per epoch, for training and
validation.

The same call can carry more per-step state (the replica-state layer above
(`sync.replica`) uses it for the averaged non-trainable variables and the per-rank
learning-rate check): `averaged` variables travel as deltas and are set to
their value before the step plus the mean delta, and `rank_slots` give every
rank's values to every rank. Nothing costs a second MPI call.

Unequal validation steps. Training steps are equal on all ranks (see
`keras_mpfp16.shard`; the step counts are checked when training begins).
Validation data split over ranks may give one rank a batch more than
another. Each test step's reduction therefore also carries a flag "I am
still evaluating"; a rank that has run out of batches keeps joining the
reduction with zero increments (and adds the others' increments to its
state) until no rank is still evaluating, right before Keras turns the state
into logs. Every rank ends with the same, complete, global state.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import keras
import numpy as np
from keras import ops

from keras_mpfp16 import backend as backends
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.supervision import preemption
from keras_mpfp16.sync import step_hooks

# Outermost of the step hooks, so logs added by inner hooks (the learning
# rate) pass through and the metric reduction sees the whole step.
_PRIORITY = 100
KEY = "keras_mpfp16.GlobalMetrics"


def metric_variables(model) -> list:
    """The model's metric state variables, in a fixed order, without duplicates."""
    seen, out = set(), []
    for metric in model.metrics:
        for v in metric.variables:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def _flat64(tensors) -> list:
    return [ops.reshape(ops.cast(t, "float64"), [-1]) for t in tensors]


class MetricReduction:
    """The in-step reduction of one model's metric state across ranks.

    Installed around the model's `train_step`/`test_step` (see `step_hooks`)
    and kept there: whether a step reduces is decided at run time by
    `active` (a variable read inside the step), so switching between
    evaluations that all ranks run together and evaluations one rank runs
    alone never retraces the step functions.

    Args:
        model: The compiled model.
        averaged: Callable returning the variables whose per-step changes
            are averaged over ranks in train steps (read when the train step
            is traced).
        rank_slots: Callable returning `(values, message)` when the train
            step is traced: `values` is a list of float scalars that every
            rank contributes; when the gathered `(ranks, len(values))` table
            has rows that differ, training stops on every rank with
            `message` (a format string whose `{}` receives the table).
            None: no slots.
    """

    def __init__(
        self,
        model,
        averaged: Callable[[], list] | None = None,
        rank_slots: Callable[[], tuple] | None = None,
    ):
        self.model = model
        self.averaged = averaged
        self.rank_slots = rank_slots
        # Host-side state, written by callbacks between steps.
        self.active = keras.Variable(1, dtype="int32", trainable=False)
        self.finish_pending = False
        self._in_step = False
        self._own_get_metrics_result = None
        self._host_active = True  # the host's copy of `active`
        self._installed = False

    # -- installation -------------------------------------------------------------

    def install(self, owner: object) -> None:
        model = self.model
        step_hooks.install(
            model,
            KEY,
            train=self._wrap_train,
            test=self._wrap_test,
            priority=_PRIORITY,
            owner=owner,
        )
        own = model.__dict__.get("get_metrics_result")
        while isinstance(getattr(own, "__self__", None), MetricReduction):
            own = own.__self__._own_get_metrics_result
        self._own_get_metrics_result = own
        model.get_metrics_result = self._get_metrics_result
        keras_internals.override_metrics_result_or_logs(model, self._result_or_logs)
        self._installed = True

    def uninstall(self, owner: object) -> None:
        if not self._installed:
            return
        model = self.model
        step_hooks.uninstall(model, KEY, owner=owner)
        if model.__dict__.get("get_metrics_result") == self._get_metrics_result:
            if self._own_get_metrics_result is not None:
                model.get_metrics_result = self._own_get_metrics_result
            else:
                del model.get_metrics_result
        keras_internals.override_metrics_result_or_logs(model, None)
        self._own_get_metrics_result = None
        self._installed = False

    def set_active(self, active: bool) -> None:
        self._host_active = bool(active)
        self.active.assign(1 if active else 0)

    # -- the in-step reduction -----------------------------------------------------

    def _reduce(self, flat, training: bool = True):
        bridge = backends.bridge()
        # Train and test steps reduce on separate communicators: a rank in a
        # validation step never meets another's train step (different sizes).
        kind = "train" if training else "test"
        return ops.cond(
            ops.greater(self.active, 0),
            lambda: bridge.allreduce_tensors(
                [flat],
                op="sum",
                carry_preemption=True,
                name=f"metric reduction ({kind} step)",
                channel=kind,
            )[0],
            lambda: flat,
        )

    def _reduce_in_step(self, step, data, training: bool):
        variables = metric_variables(self.model)
        # ops.copy, not convert_to_tensor: on TensorFlow the latter returns
        # the variable itself, which would be read *after* the step. Read and
        # zero only once the batch exists: with a dataset of unknown length
        # the step after the last batch fails inside the iterator, and state
        # zeroed before that would be lost.
        state = backends.bridge().after(data, [ops.copy(v) for v in variables])
        zeros = backends.bridge().after(
            state, [ops.zeros(v.shape, v.dtype) for v in variables]
        )
        for v, z in zip(variables, zeros):
            v.assign(z)
        averaged = list(self.averaged()) if (training and self.averaged) else []
        before = [ops.copy(v) for v in averaged]
        slots, message = (
            self.rank_slots() if (training and self.rank_slots) else ([], "")
        )
        logs = step(data)
        increments = [ops.copy(v) for v in variables]
        deltas = [ops.subtract(ops.copy(v), b) for v, b in zip(averaged, before)]
        n, r = world.size(), world.rank()
        parts = _flat64(increments) + _flat64(deltas)
        if slots:
            row = ops.stack([ops.cast(s, "float64") for s in slots])
            onehot = ops.convert_to_tensor(np.eye(n)[r][:, None], "float64")
            parts.append(ops.reshape(onehot * row[None, :], [-1]))
        # The last entry is 1: "this rank ran a step" (see `_finish_evaluation`).
        parts.append(ops.ones((1,), "float64"))
        summed = self._reduce(ops.concatenate(parts), training)
        offset = 0
        for v, s in zip(variables, state):
            size = math.prod(v.shape)
            part = ops.reshape(summed[offset : offset + size], v.shape)
            v.assign(ops.add(s, ops.cast(part, v.dtype)))
            offset += size
        for v, b in zip(averaged, before):
            size = math.prod(v.shape)
            mean = ops.reshape(summed[offset : offset + size], v.shape) / n
            # before + mean delta: an unchanged variable keeps its exact bits.
            v.assign(ops.cast(ops.add(ops.cast(b, "float64"), mean), v.dtype))
            offset += size
        if slots:
            table = ops.reshape(summed[offset : offset + n * len(slots)], (n, -1))
            differs = ops.any(ops.not_equal(table, table[0:1]))
            backends.bridge().raise_if(differs, message, table)
        return self._merge_logs(logs)

    def _merge_logs(self, logs):
        if not isinstance(logs, dict):
            return logs
        fresh = self._original_get_metrics_result()
        return {k: fresh.get(k, v) for k, v in logs.items()}

    def _wrap(self, step, training: bool):
        def wrapped(data):
            self._in_step = True
            try:
                return self._reduce_in_step(step, data, training)
            finally:
                self._in_step = False

        return wrapped

    def _wrap_train(self, step):
        return self._wrap(step, training=True)

    def _wrap_test(self, step):
        return self._wrap(step, training=False)

    # -- end of an evaluation: ranks with fewer batches catch up ------------------

    def _original_get_metrics_result(self):
        if self._own_get_metrics_result is not None:
            return self._own_get_metrics_result()
        return type(self.model).get_metrics_result(self.model)

    def _get_metrics_result(self):
        # Keras calls this inside the step (compute_metrics) and after the
        # last batch of an epoch or evaluation (_get_metrics_result_or_logs).
        if self.finish_pending and not self._in_step:
            self.finish_pending = False
            self._finish_evaluation()
        return self._original_get_metrics_result()

    def _result_or_logs(self, logs):
        # Keras returns the step logs as they are when they do not hold every
        # metric - in particular `{}` on a rank that had no batch to evaluate
        # (fewer batches than ranks). Its metric state is the global state
        # all the same (`_finish_evaluation`): return it, as on the others.
        result = keras_internals.original_metrics_result_or_logs(self.model, logs)
        if not logs and self._host_active:
            return self.model.get_metrics_result()
        return result

    def _finish_evaluation(self):
        """Joins the test-step reductions with zeros until every rank is done.

        Each in-step reduction sums [increments..., 1]; here a rank sends
        [0..., 0]. The last entry of the sum counts ranks still evaluating:
        when it is 0 every rank is here and all leave together. Until then,
        the summed increments are the other ranks' batches, added to our state.
        """
        variables = metric_variables(self.model)
        sizes = [math.prod(v.shape) for v in variables]
        zeros = np.zeros(sum(sizes) + 1, dtype=np.float64)
        while True:
            # The same call (and collective name, for the stall inspector) as
            # the in-step reduction in `allreduce_tensors`, which it matches,
            # with the preemption flag too.
            summed = preemption.allreduce_carrying(
                zeros, name="metric reduction (test step)", channel="test"
            )
            if summed[-1] == 0:
                return
            offset = 0
            for v, size in zip(variables, sizes):
                if size:
                    part = summed[offset : offset + size].reshape(v.shape)
                    v.assign(ops.add(v, ops.cast(part, v.dtype)))
                offset += size
