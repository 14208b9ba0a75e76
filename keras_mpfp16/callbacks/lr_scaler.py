"""`LearningRateScaler`: the single-worker learning rate, scaled for N workers.

The callback is a thin shell around `lr_schedule.scaled_learning_rate`. The
rate is computed inside the train step from an in-graph batch counter, so
every step gets its exact rate even with `steps_per_execution > 1` (when
Keras calls batch callbacks only every few batches), and the rate a step
used is returned in that step's logs as `learning_rate`.

How it reaches the optimizer: the innermost optimizer's learning rate (its
float variable, or its `LearningRateSchedule`) is left in place as the
single-worker base and temporarily replaced by `ScaledLearningRate`, a
callable the optimizer calls for its rate. Its optimizer variables are
unchanged, so checkpoints keep the base rate, and a checkpoint written while
training loads with the original learning rate (see `from_config`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_mpfp16 import _validate
from keras_mpfp16.callbacks.lr_schedule import (
    DEFAULT_N0,
    scale_factor,
    scaled_learning_rate,
    validate_rule,
    validate_schedule_args,
)
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.optimizer import DistributedOptimizer
from keras_mpfp16.runtime import progress
from keras_mpfp16.runtime.mpi import collectives, world
from keras_mpfp16.sync import step_hooks

# Inside the metric reduction (priority 100): the rate is set before the step.
_PRIORITY = 10
_KEY = "keras_mpfp16.LearningRateScaler"


def innermost_optimizer(optimizer):
    """The optimizer that owns the learning rate (unwraps loss-scale wrappers)."""
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


@keras.saving.register_keras_serializable(package="keras_mpfp16")
class ScaledLearningRate:
    """What the optimizer calls for its rate while a `LearningRateScaler` runs.

    Calling it returns the rate of the current step (computed in the train
    step). Assigning to it (`optimizer.learning_rate = x`, as
    `keras.callbacks.ReduceLROnPlateau` does) rescales the schedule by
    `x / current rate` from then on, instead of being overwritten by the next
    step.

    It is never saved: `get_config` holds the single-worker learning rate it
    stands in for, and `from_config` returns that, so a model saved while
    training loads with its original optimizer settings.
    """

    def __init__(self, scaler: LearningRateScaler, original: Any):
        self._scaler = scaler
        self.original = original

    def __call__(self):
        return self._scaler._rate

    def assign(self, value) -> None:
        self._scaler._rescale(float(ops.convert_to_numpy(value)))

    def get_config(self) -> dict[str, Any]:
        original = self.original
        if isinstance(original, keras.Variable):
            value = float(ops.convert_to_numpy(original))
        elif isinstance(original, keras.optimizers.schedules.LearningRateSchedule):
            value = keras.optimizers.schedules.serialize(original)
        else:
            value = float(original)
        return {"learning_rate": value}

    @classmethod
    def from_config(cls, config):
        value = config["learning_rate"]
        if isinstance(value, dict):
            return keras.optimizers.schedules.deserialize(value)
        return value


class LearningRateScaler(keras.callbacks.Callback):
    """Scales the single-worker learning rate for N workers, with warmup and decay.

    The optimizer keeps the single-worker recipe's learning rate `lr0` (a
    float, or a `LearningRateSchedule`, evaluated at the optimizer's own
    step). At fractional epoch `e` (epoch + batches done / batches per epoch)
    each train step uses

        lr(e) = min(max_lr, lr0 * ramp(e) * decay(e) * multiplier)

    where `ramp` goes linearly from 1 to the scale factor over
    `warmup_epochs` and stays there (Goyal et al. 2017), the factor is
    N ("linear"), sqrt(N) ("sqrt"), N / (1 + N / n0) ("paper": Svyatkovskiy
    et al. 2017, FRNN's rule with n0 = 100) or 1 ("none"), and `decay(e)` is
    `decay ** e` (FRNN: 0.97) or a callable's value. The formula is
    `keras_mpfp16.callbacks.scaled_learning_rate`.

    The rate is computed inside each train step from an in-graph batch
    counter: every step gets its exact rate, also with
    `steps_per_execution > 1`; it is identical on all ranks (all inputs are)
    and returned in the step's logs as `learning_rate` (so the progress bar,
    every callback and `History` see it).

    Resuming: the position is the epoch Keras reports (`initial_epoch`) plus
    the batches done in it, and the base `lr0` stays in the optimizer, so
    `fit(..., initial_epoch=k)` on a loaded checkpoint continues the schedule
    exactly, also in the middle of the warmup. A `fit` resuming from a
    step-level backup (`BackupAndRestore(save_freq=K)`, a preemption)
    continues at the step it resumes at. Relaunched on another number of
    ranks, N is the new one (the factor is computed from `keras_mpfp16.size()`
    when `num_workers` is not given), and rank 0 says so once on stderr:
    `keras_mpfp16: resumed at 2 ranks (backup written at 3):
    LearningRateScaler's rate is now X (was Y; ...)`.

    `keras.callbacks.ReduceLROnPlateau` composes: its
    `optimizer.learning_rate = new_lr` multiplies the schedule by
    `new_lr / current rate` from then on (`multiplier` above); the warmup and
    decay continue on top, and `max_lr` still caps. Rank 0's multiplier is
    broadcast at every epoch start, so all ranks use the same rate even if
    their plateau decisions differed; use `GlobalMetrics` so they see the
    same metrics. The multiplier is not saved in checkpoints (like
    ReduceLROnPlateau's own state). Do not combine with
    `keras.callbacks.LearningRateScheduler`, which sets absolute rates.

    After `fit`, the optimizer's own learning rate (`lr0`) is back in place.

    Args:
        rule: `"linear"` (default), `"sqrt"`, `"paper"` or `"none"`.
        warmup_epochs: Epochs (fractional allowed) over which the rate ramps
            from `lr0` to the scaled rate, updated every batch. 0 (default):
            no warmup.
        decay: None (default), a per-epoch factor in (0, 1] applied as
            `decay ** epoch` with fractional epochs, or a callable
            `epoch -> multiplier` (called inside the train step with a scalar
            float32 tensor: use `keras.ops`).
        max_lr: Cap on the rate, or None (FRNN used 0.1).
        num_workers: N. Defaults to `keras_mpfp16.size()`; give it to study a
            large N on one machine.
        n0: The constant of the rule `"paper"` (default 100).
        base_learning_rate: `lr0` as a float, overriding the optimizer's
            learning rate.
        steps_per_epoch: Batches per epoch, for the fractional epoch. By
            default Keras's count; needed when that is unknown (e.g. a
            `tf.data.Dataset` of unknown cardinality) and warmup or decay are
            used.
        verbose: 1 prints the rate at the start of every epoch (rank 0).

    Example:

    ```python
    import keras_mpfp16 as kmp

    model.compile(optimizer=kmp.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss="mse")
    scaler = kmp.callbacks.LearningRateScaler(rule="linear", warmup_epochs=5)
    model.fit(*kmp.shard(x, y), batch_size=32, epochs=90, callbacks=[scaler])
    ```
    """

    def __init__(
        self,
        rule: str = "linear",
        warmup_epochs: float = 0.0,
        decay: float | Callable[[Any], Any] | None = None,
        max_lr: float | None = None,
        num_workers: int | None = None,
        n0: float = DEFAULT_N0,
        base_learning_rate: float | None = None,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ):
        super().__init__()
        self.rule = validate_rule(rule)
        validate_schedule_args(warmup_epochs, decay, max_lr)
        self.num_workers = _validate.positive_int(
            "num_workers", num_workers, allow_none=True
        )
        scale_factor(self.rule, self.num_workers or 1, n0)  # validates n0
        self.warmup_epochs = float(warmup_epochs)
        self.decay = decay if callable(decay) or decay is None else float(decay)
        self.max_lr = None if max_lr is None else float(max_lr)
        self.n0 = float(n0)
        self.base_learning_rate = _validate.number(
            "base_learning_rate", base_learning_rate, minimum=0, allow_none=True
        )
        self.steps_per_epoch = _validate.positive_int(
            "steps_per_epoch", steps_per_epoch, allow_none=True
        )
        # verbose=True is common in Keras scripts: it means 1.
        self.verbose = int(verbose) if isinstance(verbose, bool) else verbose
        self.verbose = _validate.non_negative_int("verbose", self.verbose)

        # State read inside the train step. Plain variables of the callback,
        # not of the model or optimizer: nothing about checkpoints changes.
        def var(value, dtype):
            return keras.Variable(value, dtype=dtype, trainable=False)

        self._epoch = var(0.0, "float32")  # epoch index (from Keras)
        self._batch = var(0, "int64")  # batches done in this epoch
        self._inv_steps = var(0.0, "float32")  # 1 / batches per epoch
        self._multiplier = var(1.0, "float32")  # external changes
        self._rate = var(0.0, "float32")  # the rate of the current step
        self._proxy: ScaledLearningRate | None = None
        self._optimizer = None

    # -- the schedule ---------------------------------------------------------------

    @property
    def factor(self) -> float:
        n = self.num_workers if self.num_workers is not None else world.size()
        return scale_factor(self.rule, n, self.n0)

    def _base_rate(self):
        if self.base_learning_rate is not None:
            return ops.convert_to_tensor(float(self.base_learning_rate), "float32")
        original = self._proxy.original
        if isinstance(original, keras.optimizers.schedules.LearningRateSchedule):
            return ops.cast(original(self._optimizer.iterations), "float32")
        return ops.cast(ops.convert_to_tensor(original), "float32")

    def _current_rate(self, factor: float | None = None):
        epoch = self._epoch + ops.cast(self._batch, "float32") * self._inv_steps
        rate = scaled_learning_rate(
            epoch,
            self._base_rate(),
            self.factor if factor is None else factor,
            warmup_epochs=self.warmup_epochs,
            decay=self.decay,
            max_lr=self.max_lr,
            multiplier=self._multiplier,
            xp=ops,
        )
        return ops.cast(rate, "float32")

    def _wrap_train(self, step):
        def wrapped(data):
            rate = self._current_rate()
            self._rate.assign(rate)
            logs = step(data)
            self._batch.assign_add(1)
            if isinstance(logs, dict):
                logs = {**logs, "learning_rate": rate}
            return logs

        return wrapped

    def _rescale(self, new_rate: float) -> None:
        current = float(ops.convert_to_numpy(self._rate))
        if current > 0:
            self._multiplier.assign(
                float(ops.convert_to_numpy(self._multiplier)) * new_rate / current
            )
        self._rate.assign(new_rate)

    # -- installation -----------------------------------------------------------

    def set_model(self, model):
        super().set_model(model)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or self._proxy is not None:
            return
        inner = innermost_optimizer(optimizer)
        original = keras_internals.get_learning_rate_slot(inner)
        # Another scaler's stand-in (left by a fit that raised, or a second
        # scaler): the latest scaler takes over, from the same base rate.
        while isinstance(original, ScaledLearningRate):
            original = original.original
        if not isinstance(
            original,
            (keras.Variable, keras.optimizers.schedules.LearningRateSchedule),
        ) and not isinstance(original, (int, float)):
            raise TypeError(
                "LearningRateScaler needs an optimizer whose learning rate is a "
                "float or a keras.optimizers.schedules.LearningRateSchedule; "
                f"received {type(original).__name__}."
            )
        self._optimizer = inner
        self._proxy = ScaledLearningRate(self, original)
        # Direct attribute, not the `learning_rate` setter: the setter would
        # untrack the optimizer's learning-rate variable and change what
        # checkpoints hold.
        keras_internals.set_learning_rate_slot(inner, self._proxy)
        step_hooks.install(
            model, _KEY, train=self._wrap_train, priority=_PRIORITY, owner=self
        )

    def _remove(self):
        if self._proxy is None:
            return
        if keras_internals.get_learning_rate_slot(self._optimizer) is self._proxy:
            keras_internals.set_learning_rate_slot(
                self._optimizer, self._proxy.original
            )
        step_hooks.uninstall(self.model, _KEY, owner=self)
        self._proxy = None
        self._optimizer = None

    # -- callback hooks -------------------------------------------------------------

    def on_train_begin(self, logs=None):
        if self._proxy is None:
            return
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            if self.warmup_epochs > 0 or self.decay is not None:
                raise ValueError(
                    "LearningRateScaler needs the number of batches per epoch for "
                    "its warmup/decay, and Keras does not know it for this data; "
                    "pass steps_per_epoch=... to the callback."
                )
            steps = 1  # the epoch fraction is unused
        self._inv_steps.assign(1.0 / steps)
        self._multiplier.assign(1.0)

    def on_epoch_begin(self, epoch, logs=None):
        progress.set_epoch(epoch)  # for the gradient reduction's step check
        if self._proxy is None:
            return
        if self._data_parallel():
            # Rank 0's external changes (ReduceLROnPlateau) win everywhere.
            mult = np.asarray([ops.convert_to_numpy(self._multiplier)], np.float64)
            self._multiplier.assign(float(collectives.broadcast(mult)[0]))
        self._epoch.assign(float(epoch))
        # A fit resuming in the middle of this epoch starts at its step.
        resumed = progress.resumed()
        resumed = resumed if resumed is not None and resumed[0] == epoch else None
        self._batch.assign(resumed[1] if resumed is not None else 0)
        self._rate.assign(self._current_rate())
        if resumed is not None:
            self._announce_resize(resumed[2])
        if self.verbose > 0 and world.is_root():
            print(
                f"\nEpoch {epoch + 1}: LearningRateScaler sets the learning rate to "
                f"{float(ops.convert_to_numpy(self._rate)):.6g}."
            )

    def _announce_resize(self, written_at: int | None) -> None:
        """Rank 0, once per resume: the rate for this number of ranks when
        the backup was written by another (`num_workers` not given)."""
        size = world.size()
        if written_at in (None, size) or self.num_workers is not None:
            return
        if not world.is_root():
            return
        now = float(ops.convert_to_numpy(self._rate))
        was = float(
            ops.convert_to_numpy(
                self._current_rate(scale_factor(self.rule, written_at, self.n0))
            )
        )
        sys.stderr.write(
            f"keras_mpfp16: resumed at {size} ranks (backup written at "
            f"{written_at}): LearningRateScaler's rate is now {now:.6g} "
            f"(was {was:.6g}; rule {self.rule!r})\n"
        )
        sys.stderr.flush()

    def on_train_end(self, logs=None):
        self._remove()

    def _data_parallel(self) -> bool:
        """True when the ranks train one model together (and must agree)."""
        return world.size() > 1 and isinstance(
            self.model.optimizer, DistributedOptimizer
        )

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments; `from_config` rebuilds the callback.

        A callable `decay` is saved with `keras.saving.serialize_keras_object`,
        which needs it registered (`@keras.saving.register_keras_serializable`)
        so it can be found again by name.

        Raises:
            ValueError: if `decay` is a callable that cannot be saved that way.
        """
        return {
            "rule": self.rule,
            "warmup_epochs": self.warmup_epochs,
            "decay": _serialize_decay(self.decay),
            "max_lr": self.max_lr,
            "num_workers": self.num_workers,
            "n0": self.n0,
            "base_learning_rate": self.base_learning_rate,
            "steps_per_epoch": self.steps_per_epoch,
            "verbose": self.verbose,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LearningRateScaler:
        config = dict(config)
        if isinstance(config.get("decay"), dict):
            config["decay"] = keras.saving.deserialize_keras_object(config["decay"])
        return cls(**config)


def _serialize_decay(decay: Any) -> Any:
    """`decay` for a config: a number, None, or a callable's Keras serialization."""
    if decay is None or not callable(decay):
        return decay
    hint = (
        "Register it with @keras.saving.register_keras_serializable() (a "
        "module-level function, or a class with get_config), or pass a "
        "per-epoch factor in (0, 1] instead."
    )
    if getattr(decay, "__name__", None) == "<lambda>":
        raise ValueError(
            "LearningRateScaler.get_config cannot save decay, a lambda: Keras "
            f"restores callables by registered name. {hint} Received: decay={decay!r}"
        )
    try:
        config = keras.saving.serialize_keras_object(decay)
        restored = keras.saving.deserialize_keras_object(config)
    except Exception as exc:  # noqa: BLE001 - re-raised with the fix
        raise ValueError(
            f"LearningRateScaler.get_config cannot save decay={decay!r}: {exc} {hint}"
        ) from exc
    if inspect.isfunction(decay) and restored is not decay:
        raise ValueError(
            f"LearningRateScaler.get_config cannot save decay={decay!r}: its name "
            f"restores {restored!r}, another object. {hint}"
        )
    return config
