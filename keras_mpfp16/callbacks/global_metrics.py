"""Exact global metrics: every callback's logs describe all ranks' data.

Keras metric state is additive: a `Mean` holds (total, count), a confusion-
matrix metric holds counts, `AUC` holds per-threshold counts, the loss
tracker is a `Mean` weighted by batch size. Summing every rank's per-step
*increment* of that state therefore gives exactly the state one process
would have after seeing all ranks' batches. `GlobalMetrics` does this inside
the train and test steps:

1. read the metric variables (the global state so far) and zero them,
2. run the original step (the variables now hold this rank's increment),
3. allreduce-sum the increments (one small fused MPI call),
4. assign state + summed increments, and return logs recomputed from it.

Because this happens inside the step, the progress bar and every callback,
in whatever order they are listed, see global, sample-weighted values (not a
mean of per-rank means), per batch and per epoch, for training and
validation.

Unequal validation steps. Training steps are equal on all ranks (see
`keras_mpfp16.shard`; the step counts are checked when training begins).
Validation data sharded with `drop_remainder=False` may give one rank a step
more than another. Each test step's reduction therefore also carries a flag
"I am still evaluating"; a rank that has run out of batches keeps joining
the reduction with zero increments (and adds the others' increments to its
state) until no rank is still evaluating, right before Keras turns the state
into logs. Every rank ends with the same, complete, global state.
"""

from __future__ import annotations

import math
import warnings

import keras
import numpy as np
from keras import ops

from keras_mpfp16 import backend as backends
from keras_mpfp16 import runtime
from keras_mpfp16.callbacks import step_hooks
from keras_mpfp16.runtime import progress

# Outermost of the step hooks, so logs added by inner hooks (the learning
# rate) pass through and the metric reduction sees the whole step.
_PRIORITY = 100
_KEY = "keras_mpfp16.GlobalMetrics"


def metric_variables(model) -> list:
    """The model's metric state variables, in a fixed order, without duplicates."""
    seen, out = set(), []
    for metric in model.metrics:
        for v in metric.variables:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


class GlobalMetrics(keras.callbacks.Callback):
    """Makes the logs of `fit` and `evaluate` exact over all ranks.

    Add it to the callbacks of `fit` (it may be anywhere in the list). While
    it is active, the loss and every compiled metric, per batch and per
    epoch, for training and validation, are the values one process would
    compute over the union of all ranks' data: sample-weighted, not a mean of
    per-rank means. The metric variables themselves hold the global state, so
    `model.get_metrics_result()` is global as well.

    Exact for metrics whose state is a sum over samples (all of Keras's
    `Mean`-based metrics such as `"accuracy"` and `"mae"`, `Sum`,
    confusion-matrix metrics such as `Precision`/`Recall`/`F1Score`, `AUC`,
    `MeanIoU`, `R2Score`, and the loss). A metric whose state is not additive
    (e.g. one that stores a running maximum, or assigns instead of adding)
    would be summed over ranks anyway: keep such metrics out of a
    distributed run, or compute them with `keras_mpfp16.allgather`.

    Keys that a custom `train_step`/`test_step` returns and that are not the
    name of one of `model.metrics` pass through unchanged (they stay local).

    The reduction is active during `fit` (and during `evaluate` or `predict`
    calls that receive this callback) and removed at their end, so a later
    `model.evaluate(...)` on one rank only does not wait for the others.
    With one process it does nothing.

    Args:
        check_steps: Check, when training begins, that all ranks run the same
            number of training steps per epoch, and raise a `ValueError`
            listing them if not (instead of a hang in the first mismatched
            collective).

    Example:

    ```python
    import keras_mpfp16 as kmp

    x, y = kmp.shard(x, y)
    val = kmp.shard(x_val, y_val, drop_remainder=False)
    model.compile(optimizer=kmp.DistributedOptimizer("adam"),
                  loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=3, validation_data=val,
              callbacks=[kmp.callbacks.GlobalMetrics()])
    ```
    """

    def __init__(self, check_steps: bool = True):
        super().__init__()
        self.check_steps = bool(check_steps)
        self._active = False
        self._in_step = False  # Python-level: while a step is traced or run eagerly
        self._finish_pending = False  # an evaluation must finish the protocol
        self._training = False
        self._own_get_metrics_result = None

    # -- installation -------------------------------------------------------------

    def set_model(self, model):
        super().set_model(model)
        if runtime.size() == 1 or not getattr(model, "compiled", False):
            return
        if self._active:
            return
        self._guard_jit(model)
        # One reduction per model: a later GlobalMetrics (or one in the next
        # fit, after a fit that raised) replaces an earlier one.
        step_hooks.install(
            model,
            _KEY,
            train=self._wrap,
            test=self._wrap,
            priority=_PRIORITY,
            owner=self,
        )
        own = model.__dict__.get("get_metrics_result")
        while isinstance(getattr(own, "__self__", None), GlobalMetrics):
            own = own.__self__._own_get_metrics_result
        self._own_get_metrics_result = own
        model.get_metrics_result = self._get_metrics_result
        self._active = True

    def _remove(self):
        if not self._active:
            return
        model = self.model
        step_hooks.uninstall(model, _KEY, owner=self)
        if model.__dict__.get("get_metrics_result") == self._get_metrics_result:
            if self._own_get_metrics_result is not None:
                model.get_metrics_result = self._own_get_metrics_result
            else:
                del model.get_metrics_result
        self._own_get_metrics_result = None
        self._active = False

    @staticmethod
    def _guard_jit(model):
        # The reduction is an MPI call from the host, which XLA cannot compile.
        if getattr(model, "jit_compile", False):
            warnings.warn(
                "keras_mpfp16: GlobalMetrics turns off XLA (jit_compile) for this "
                "model: the metric reduction is an MPI call from the host inside "
                "the step, which XLA cannot compile.",
                stacklevel=3,
            )
            model.jit_compile = False

    # -- the in-step reduction -----------------------------------------------------

    def _reduce_in_step(self, step, data):
        model = self.model
        variables = metric_variables(model)
        # ops.copy, not convert_to_tensor: on TensorFlow the latter returns
        # the variable itself, which would be read *after* the step.
        state = [ops.copy(v) for v in variables]
        for v in variables:
            v.assign(ops.zeros(v.shape, v.dtype))
        logs = step(data)
        increments = [ops.copy(v) for v in variables]
        # One float64 vector (exact for counts < 2**53) whose last entry is
        # 1: "this rank ran a step" (see `_finish_evaluation`).
        flat = ops.concatenate(
            [ops.reshape(ops.cast(t, "float64"), [-1]) for t in increments]
            + [ops.ones((1,), "float64")]
        )
        (summed,) = backends.bridge().allreduce_tensors([flat], op="sum")
        offset = 0
        for v, s in zip(variables, state):
            size = math.prod(v.shape)
            part = ops.reshape(summed[offset : offset + size], v.shape)
            v.assign(ops.add(s, ops.cast(part, v.dtype)))
            offset += size
        return self._merge_logs(logs)

    def _merge_logs(self, logs):
        if not isinstance(logs, dict):
            return logs
        fresh = self._original_get_metrics_result()
        return {k: fresh.get(k, v) for k, v in logs.items()}

    def _wrap(self, step):
        def wrapped(data):
            self._in_step = True
            try:
                return self._reduce_in_step(step, data)
            finally:
                self._in_step = False

        return wrapped

    # -- end of an evaluation: ranks with fewer batches catch up ------------------

    def _original_get_metrics_result(self):
        if self._own_get_metrics_result is not None:
            return self._own_get_metrics_result()
        return type(self.model).get_metrics_result(self.model)

    def _get_metrics_result(self):
        # Keras calls this inside the step (compute_metrics) and after the
        # last batch of an epoch or evaluation (_get_metrics_result_or_logs).
        if self._finish_pending and not self._in_step:
            self._finish_pending = False
            self._finish_evaluation()
        return self._original_get_metrics_result()

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
            # the in-step reduction in `allreduce_tensors`, which it matches.
            summed = runtime.allreduce(zeros, op="sum")
            if summed[-1] == 0:
                return
            offset = 0
            for v, size in zip(variables, sizes):
                if size:
                    part = summed[offset : offset + size].reshape(v.shape)
                    v.assign(ops.add(v, ops.cast(part, v.dtype)))
                offset += size

    # -- callback hooks -------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._training = True
        if self._active and self.check_steps:
            steps = (self.params or {}).get("steps")
            table = runtime.allgather(np.int64(-1 if steps is None else steps))
            if (table >= 0).all() and len(set(table.tolist())) > 1:
                raise ValueError(
                    "Ranks would run different numbers of training steps per epoch: "
                    + ", ".join(f"rank {r}: {s}" for r, s in enumerate(table.tolist()))
                    + ". Every rank must run the same number of steps; shard the "
                    "training data with keras_mpfp16.shard(...) (drop_remainder=True)."
                )

    def on_epoch_begin(self, epoch, logs=None):
        # Lets the gradient reduction's step check name the epoch too.
        progress.set_epoch(epoch)

    def on_train_end(self, logs=None):
        self._training = False
        self._remove()

    def on_test_begin(self, logs=None):
        if self._active:
            # Every rank enters the evaluation, even one without batches, so
            # every rank joins `_finish_evaluation` when Keras reads the logs.
            self._finish_pending = True

    def on_test_end(self, logs=None):
        if not self._training:  # evaluate(callbacks=[GlobalMetrics()])
            self._remove()

    def on_predict_end(self, logs=None):
        if not self._training:
            self._remove()

    def get_config(self):
        return {"check_steps": self.check_steps}
