"""`GlobalMetrics`: exact global logs for models compiled with any optimizer.

The reduction itself (`sync.metric_reduction.MetricReduction`) is built into
`fit`/`evaluate` of `DistributedOptimizer` models; this callback installs it
for a `fit`, `evaluate` or `predict` call of any other compiled model.
"""

from __future__ import annotations

import keras

from keras_mpfp16.runtime import progress
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.sync import step_hooks
from keras_mpfp16.sync.checks import check_equal_steps
from keras_mpfp16.sync.metric_reduction import KEY, MetricReduction
from keras_mpfp16.sync.xla import guard_jit


class GlobalMetrics(keras.callbacks.Callback):
    """Makes the logs of `fit` and `evaluate` exact over all ranks.

    A model compiled with a `keras_mpfp16.DistributedOptimizer` does this by
    itself in `fit` and in `evaluate` called on all ranks: this callback is
    then not needed (and harmless: it is not applied twice). Use it for a
    model compiled with any other optimizer whose ranks evaluate different
    data, e.g. `model.evaluate(*kmp.shard(x, y, drop_remainder=False),
    callbacks=[GlobalMetrics()])` on every rank.

    While it is active, the loss and every compiled metric, per batch and per
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

    Used this way, the reduction is active during the `fit`, `evaluate` or
    `predict` call that receives this callback and removed at its end. With
    one process it does nothing.

    Args:
        check_steps: Check, when training begins, that all ranks run the same
            number of training steps per epoch, and raise a `ValueError`
            listing them if not (instead of a hang in the first mismatched
            collective).

    Example:

    ```python
    import keras_mpfp16 as kmp

    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.load_weights("trained.weights.h5")
    logs = model.evaluate(*kmp.shard(x, y, drop_remainder=False),
                          callbacks=[kmp.callbacks.GlobalMetrics()],
                          return_dict=True)  # the same, global, on every rank
    ```
    """

    def __init__(self, check_steps: bool = True):
        super().__init__()
        self.check_steps = bool(check_steps)
        self._reduction: MetricReduction | None = None
        self._training = False

    def set_model(self, model):
        super().set_model(model)
        if world.size() == 1 or not getattr(model, "compiled", False):
            return
        if self._reduction is not None or step_hooks.installed(model, KEY):
            return  # already reduced (by us, or by the DistributedOptimizer's run)
        guard_jit(model, "GlobalMetrics")
        self._reduction = MetricReduction(model)
        self._reduction.install(owner=self)

    def _remove(self):
        if self._reduction is not None:
            self._reduction.uninstall(owner=self)
            self._reduction = None

    def on_train_begin(self, logs=None):
        self._training = True
        if self._reduction is not None and self.check_steps:
            check_equal_steps((self.params or {}).get("steps"))

    def on_epoch_begin(self, epoch, logs=None):
        # Lets the gradient reduction's step check name the epoch too.
        progress.set_epoch(epoch)

    def on_train_end(self, logs=None):
        self._training = False
        self._remove()

    def on_test_begin(self, logs=None):
        if self._reduction is not None:
            # Every rank enters the evaluation, even one without batches, so
            # every rank joins `_finish_evaluation` when Keras reads the logs.
            self._reduction.finish_pending = True

    def on_test_end(self, logs=None):
        if not self._training:  # evaluate(callbacks=[GlobalMetrics()])
            self._remove()

    def on_predict_end(self, logs=None):
        if not self._training:
            self._remove()

    def get_config(self):
        return {"check_steps": self.check_steps}
