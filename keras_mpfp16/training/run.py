"""One multi-process `fit` or `evaluate`: the callbacks and state around it.

`fit_run` / `evaluate_run` (context managers over a `DistributedRun`)
prepare what Keras is given; the two callbacks a run adds bracket the
user's:

- `_RunFirst` (first in the list): epoch-mode averaging of non-trainable
  state before any other callback's `on_epoch_end` (checkpoints) and before
  validation; marks evaluations for the uneven-steps protocol.
- `_RunLast`: before the first step, after the user's `on_train_begin`
  (so after `BackupAndRestore` restored rank 0), the replica sync of
  `sync.replica`, the equal-steps check and the start epoch agreement.
- `training.preemption.Preemption` (last, in `fit`): stops every rank at
  the step they agree on after a SIGTERM/SIGUSR1, with a backup, and
  resumes a backup written mid-epoch at its step; the library's own backup
  (when `fit` has no `BackupAndRestore`) is listed before `_RunLast`.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator

import keras

from keras_mpfp16.callbacks.global_metrics import GlobalMetrics
from keras_mpfp16.callbacks.timeline import Timeline
from keras_mpfp16.data.split import split_for_evaluation
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime import progress, trace
from keras_mpfp16.runtime.mpi import collectives, world
from keras_mpfp16.runtime.supervision import preemption
from keras_mpfp16.sync import replica
from keras_mpfp16.sync.checks import check_equal_steps
from keras_mpfp16.sync.metric_reduction import MetricReduction
from keras_mpfp16.sync.xla import guard_jit
from keras_mpfp16.training import agreement, files, wire_auto
from keras_mpfp16.training import preemption as training_preemption

_reductions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_OWNER = "keras_mpfp16.training"
# Keras's epoch iterator warns "Your input ran out of data; interrupting
# training" when a rank's part of split evaluation data has fewer batches
# than it expected or none at all (fewer batches than ranks). The split made
# it so on purpose and the summed metrics are still exact, so the warning is
# wrong there; printed by each such rank, it was N - batches copies of one
# false alarm per job (issue 31: 11 of them at N = 24).
_RAN_OUT = "Your input ran out of data"


@contextlib.contextmanager
def split_evaluation_quiet() -> Iterator[None]:
    """Hides Keras's "ran out of data" warning while this rank evaluates its
    part of split data (which may be empty); every other warning shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_RAN_OUT)
        yield


def reduction_for(model) -> MetricReduction:
    """The model's metric reduction, installed around its steps once and kept
    (inactive outside collective runs, so a later retrace is never needed)."""
    reduction = _reductions.get(model)
    if reduction is None:
        optimizer = model.optimizer

        def averaged():
            if optimizer.non_trainable_sync != "step":
                return []
            return replica.averaged_variables(model)

        reduction = MetricReduction(
            model,
            averaged=averaged,
            rank_slots=lambda: replica.hyperparameter_slots(model),
        )
        reduction.set_active(False)
        guard_jit(model, "keras_mpfp16's multi-process fit/evaluate")
        reduction.install(owner=_OWNER)
        _reductions[model] = reduction
    return reduction


def _callback_list(callbacks) -> list:
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return list(callbacks.callbacks)
    return list(callbacks)


class DistributedRun:
    """What one collective `fit` or `evaluate` needs around Keras's own."""

    def __init__(self, model, training: bool):
        self.model = model
        self.training = training
        self.reduction = reduction_for(model)
        self.check_steps = True
        self.baseline: list | None = None  # epoch-mode averaging
        self.validation_split = False  # validation data dealt over the ranks
        self.batch_size: int | None = None  # per rank, for array inputs
        self._quiet: contextlib.ExitStack | None = None

    @property
    def epoch_mode(self) -> bool:
        return self.model.optimizer.non_trainable_sync == "epoch"

    def callbacks(self, callbacks):
        """The user's callbacks made safe, between our first and last.

        In `fit`, every decision taken from the list (the backup to restore
        and write, the library's own backup, the timelines, the equal-steps
        check) is rank 0's (`training.agreement`): lists that differ between
        ranks (Horovod's `if rank == 0: callbacks.append(...)`) make no
        collective on some ranks only.
        """
        given, user, timelines = [], [], []
        for cb in _callback_list(callbacks):
            if isinstance(cb, GlobalMetrics):
                # Redundant: logs are already global. Keep its settings.
                self.check_steps = cb.check_steps
                continue
            if isinstance(cb, Timeline):
                # First: its step spans then hold the step itself, not the
                # other callbacks' per-batch work.
                timelines.append(cb)
                continue
            given.append(cb)
            user.append(files.make_safe(cb))
        if self.training and not timelines:
            from_env = Timeline.from_env()  # KERAS_MPFP16_TIMELINE*
            if from_env is not None:
                timelines.append(from_env)
        agreed = None
        if self.training:
            own_backup = training_preemption.own_backup_enabled()
            agreed = agreement.agree(
                agreement.describe(given, timelines, self.check_steps, own_backup)
            )
            self.check_steps = agreed["check_steps"]
            if not timelines and agreed["timelines"]:
                timelines = [agreement.timeline_from(t) for t in agreed["timelines"]]
        ours = [*timelines, _RunFirst(self), *user, _RunLast(self)]
        if self.training:
            writer, listed = training_preemption.writer_for(
                user, agreed["backup"], agreed["own_backup"]
            )
            if world.is_root():
                training_preemption.remove_stale_temporaries(user, writer)
            if writer is not None:
                # The library's own backup (or, on a rank without rank 0's
                # BackupAndRestore, its stand-in) restores before _RunLast syncs.
                ours[-1:-1] = [writer] if listed else []
                stop = training_preemption.Preemption(writer, self.batch_size)
                ours.insert(len(timelines) + 1, stop.front)  # after _RunFirst
                ours.append(stop)
        if self.training and wire_auto.wanted(self.model):
            ours.append(wire_auto.WireAuto())  # wire_dtype="auto"
        ours.append(_RunEnd(self))  # last: after every other on_train_end
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks.callbacks[:] = ours
            callbacks.set_model(self.model)
            return callbacks
        return ours

    def split_validation(self, arguments: dict) -> None:
        """Replaces `validation_data` in `fit`'s arguments by this rank's part.

        `validation_split` is first turned into `validation_data` the way
        Keras's `fit` does it (the last rows of `x`, `y`, `sample_weight`),
        so its tail is split over the ranks too when it is the same on every
        rank (training data not sharded), and is each rank's own otherwise.
        """
        fraction = arguments.get("validation_split")
        if fraction and arguments.get("validation_data") is None:
            train, validation = keras_internals.train_validation_split(
                (
                    arguments.get("x"),
                    arguments.get("y"),
                    arguments.get("sample_weight"),
                ),
                fraction,
            )
            arguments["x"], arguments["y"], arguments["sample_weight"] = train
            arguments["validation_data"] = validation
            arguments["validation_split"] = 0.0
        data = arguments.get("validation_data")
        if data is None:
            return
        vx, vy, vsw = keras.utils.unpack_x_y_sample_weight(data)
        part = split_for_evaluation(
            vx,
            vy,
            vsw,
            batch_size=arguments.get("validation_batch_size")
            or arguments.get("batch_size"),
            steps=arguments.get("validation_steps"),
        )
        if part.y is None and part.sample_weight is None:
            arguments["validation_data"] = (
                part.x if not isinstance(data, tuple) else (part.x,)
            )
        else:
            arguments["validation_data"] = (part.x, part.y, part.sample_weight)
        arguments["validation_steps"] = part.steps
        self.validation_split = part.how == "split"

    # -- epoch-mode averaging ---------------------------------------------------

    def average_now(self) -> None:
        if self.epoch_mode:
            self.baseline = replica.average_non_trainable(self.model, self.baseline)


class _RunFirst(keras.callbacks.Callback):
    def __init__(self, run: DistributedRun):
        super().__init__()
        self.run = run

    def on_epoch_begin(self, epoch, logs=None):
        # Lets the gradient reduction's step check name the epoch too.
        progress.set_epoch(epoch)

    def on_test_begin(self, logs=None):
        if self.run.training:
            self.run.average_now()  # validate the averaged model
        # Every rank enters the evaluation, even one without batches, so
        # every rank joins the end-of-evaluation protocol.
        self.run.reduction.finish_pending = True
        if self.run.training and self.run.validation_split:
            self.run._quiet = contextlib.ExitStack()
            self.run._quiet.enter_context(split_evaluation_quiet())

    def on_test_end(self, logs=None):
        if self.run._quiet is not None:
            self.run._quiet.close()
            self.run._quiet = None

    def on_epoch_end(self, epoch, logs=None):
        self.run.average_now()  # before checkpoints write the model


class _RunLast(keras.callbacks.Callback):
    def __init__(self, run: DistributedRun):
        super().__init__()
        self.run = run

    def on_train_begin(self, logs=None):
        model = self.run.model
        replica.agree_on_initial_epoch(model)
        recorder = trace.active()
        if recorder is None:
            replica.sync_from_root(model)
        else:
            with recorder.span("initial broadcast", "broadcast"):
                replica.sync_from_root(model)
        if self.run.check_steps:
            check_equal_steps((self.params or {}).get("steps"))
        self.run.baseline = None

    def on_train_end(self, logs=None):
        self.run.average_now()


class _RunEnd(keras.callbacks.Callback):
    """Last in the list: no rank leaves `fit` (or a collective `evaluate`)
    before every file rank 0 wrote for it is complete and in place.

    Rank 0 reaches this `on_train_end` / `on_test_end` after every other
    callback's (Keras calls them in order, after its asynchronous batch
    hooks are flushed): its checkpoints, CSV rows and backups are written
    and renamed into place, and a backup written in the background has been
    waited for (`SafeBackupAndRestore.on_train_end`). One barrier then
    holds the other ranks until rank 0 is there, so `load_model` right
    after `fit` reads the last checkpoint on every rank. Once per `fit` or
    `evaluate`, never per step. (A preemption's stop has its own barrier.)
    """

    def __init__(self, run: DistributedRun):
        super().__init__()
        self.run = run

    def on_train_end(self, logs=None):
        collectives.barrier()

    def on_test_end(self, logs=None):
        if not self.run.training:  # not the validation inside fit
            collectives.barrier()


@contextlib.contextmanager
def fit_run(arguments: dict) -> Iterator[dict]:
    """This process's part of a collective `fit`, around Keras's own.

    Args:
        arguments: `fit`'s bound arguments, `"self"` (the model) included;
            changed in place: validation split over the ranks, callbacks
            bracketed by the run's own.

    Yields:
        `arguments`, ready for Keras's `fit(**arguments)`, called inside the
        `with` block (the metric reduction is active, SIGTERM/SIGUSR1 are
        recorded, a preempted epoch resumes at its step).
    """
    model = arguments["self"]
    run = DistributedRun(model, training=True)
    run.split_validation(arguments)
    # Before Keras's fit: rank 0's variables must exist when it broadcasts
    # them (on_train_begin), not only once the first step is traced. After
    # the validation split: the model is built from the training part, as
    # Keras's fit builds it.
    replica.build_before_fit(model, arguments)
    run.batch_size = training_preemption.input_batch_size(arguments)
    arguments["callbacks"] = run.callbacks(arguments.get("callbacks"))
    run.reduction.set_active(True)
    try:
        with preemption.handling(), keras_internals.skip_steps_of_next_epoch():
            yield arguments
    finally:
        run.reduction.set_active(False)


@contextlib.contextmanager
def evaluate_run(arguments: dict) -> Iterator[dict]:
    """`evaluate` run by all ranks together, split: see `fit_run`."""
    model = arguments["self"]
    run = DistributedRun(model, training=False)
    part = split_for_evaluation(
        arguments.get("x"),
        arguments.get("y"),
        arguments.get("sample_weight"),
        batch_size=arguments.get("batch_size"),
        steps=arguments.get("steps"),
    )
    arguments.update(
        x=part.x, y=part.y, sample_weight=part.sample_weight, steps=part.steps
    )
    arguments["callbacks"] = run.callbacks(arguments.get("callbacks"))
    run.reduction.set_active(True)
    quiet = (
        split_evaluation_quiet() if part.how == "split" else contextlib.nullcontext()
    )
    try:
        with quiet:
            yield arguments
    finally:
        run.reduction.set_active(False)
