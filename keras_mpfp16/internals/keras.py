"""Every private Keras access of keras_mpfp16, behind named accessors.

Each entry of `REGISTRY` is one private thing (a `keras.src` name, a
private attribute or method of a Keras object, or a Keras method we call or
override in a way Keras does not document) with the feature that needs it.
Module-level internals and method signatures are checked when this module
is imported: if any is missing, importing it (and so `keras_mpfp16`) raises
one `KerasInternalsError` listing each missing one, the feature affected and
the installed Keras version. Instance attributes are checked at first use
(when a model is compiled or a callback is set on it), with the same error.
`keras_probes.check()` probes every entry, instance attributes included (used by
`tests/test_internals.py` at both ends of the tested range); the probes live
in `internals/keras_probes.py`.

How to add one: register an `Internal` with `_register`, resolve or check it
at import if it exists at module level, write an accessor that raises
`_error(entry, ...)` when the internal is missing at use, add a probe to
`keras_probes.py`'s `PROBES`, and list it in docs/architecture.md's seam
section.

Backend-neutral: imports only `keras` (no TensorFlow), like the layers.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from keras_mpfp16.internals import Internal, KerasInternalsError

REGISTRY: dict[str, Internal] = {}
_import_problems: list[tuple[Internal, str]] = []


def _register(accessor: str, internal: str, feature: str) -> Internal:
    entry = Internal(accessor=accessor, internal=internal, feature=feature)
    REGISTRY[accessor] = entry
    return entry


def _error(entry: Internal, detail: str) -> KerasInternalsError:
    return KerasInternalsError([(entry, detail)])


def _resolve(entry: Internal, module: str, attr: str) -> Any:
    """`module.attr`, or None with the problem recorded for the import error."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        _import_problems.append((entry, f"{type(exc).__name__}: {exc}"))
        return None


def _signature_problem(fn: Any, params: Sequence[str]) -> str | None:
    """Why `fn` does not take `params` (after `self`, in order), or None."""
    if fn is None:
        return "it is not defined"
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read ({exc})"
    if names and names[0] == "self":
        names = names[1:]
    if names[: len(params)] != list(params):
        return f"it takes ({', '.join(names)}), expected ({', '.join(params)}, ...)"
    return None


def _check_signature(entry: Internal, fn: Any, params: Sequence[str]) -> None:
    problem = _signature_problem(fn, params)
    if problem is not None:
        _import_problems.append((entry, problem))


# -- layers: the fused time loop and reads without autocast -------------------

RNN_LOOP = _register(
    "keras.rnn_loop",
    "keras.src.backend.rnn",
    "the float32-carry time loop of keras_mpfp16.layers.LSTM/GRU",
)
_rnn = _resolve(RNN_LOOP, "keras.src.backend", "rnn")
if _rnn is not None:
    # The keyword arguments the layers pass (keras_mpfp16/layers/recurrent.py).
    _check_signature(
        RNN_LOOP,
        _rnn,
        (
            "step_function",
            "inputs",
            "initial_states",
            "go_backwards",
            "mask",
            "constants",
            "unroll",
            "input_length",
            "time_major",
            "zero_output_for_mask",
            "return_all_outputs",
        ),
    )


def rnn_loop(step_function: Callable, inputs: Any, initial_states: list, **kwargs):
    """The backend's fused RNN time loop, as Keras's own `RNN` layer runs it.

    A `tf.while_loop` on TensorFlow, `lax.scan` on JAX, a Python loop on
    PyTorch. Keras 3 exports no public equivalent with masking,
    `go_backwards` and `return_all_outputs`.

    Args:
        step_function: `(inputs_t, states) -> (output_t, new_states)`.
        inputs: The sequence (time-major if `time_major=True`).
        initial_states: List of initial state tensors.
        **kwargs: `go_backwards`, `mask`, `unroll`, `input_length`,
            `time_major`, `zero_output_for_mask`, `return_all_outputs`.

    Returns:
        `(last_output, outputs, new_states)`.
    """
    return _rnn(step_function, inputs, initial_states, **kwargs)


FUSED_RNN = _register(
    "keras.fused_rnn",
    "keras.src.backend.lstm / keras.src.backend.gru",
    "the float32 cuDNN path of keras_mpfp16.layers.LSTM/GRU on a GPU",
)
_fused = {
    "lstm": _resolve(FUSED_RNN, "keras.src.backend", "lstm"),
    "gru": _resolve(FUSED_RNN, "keras.src.backend", "gru"),
}


def fused_rnn(kind: str) -> Callable:
    """The backend's fused kernel for `kind` (`"lstm"` or `"gru"`).

    On TensorFlow with a GPU it is cuDNN; where the backend has none for the
    arguments it raises `NotImplementedError`, as Keras's layers expect.
    Arguments as Keras's `LSTM.inner_loop`/`GRU.inner_loop` pass them.
    """
    return _fused[kind]


AUTOCAST_SCOPE = _register(
    "keras.read_uncast",
    "keras.src.backend.AutocastScope",
    "reading the float32 master weights and carry under mixed precision "
    "(keras_mpfp16.layers)",
)
_AutocastScope = _resolve(AUTOCAST_SCOPE, "keras.src.backend", "AutocastScope")


def autocast_scope(dtype: str | None) -> Any:
    """Keras's autocast scope: float variables read as `dtype` inside it
    (None: in their own dtype)."""
    return _AutocastScope(dtype)


def read_uncast(variable: keras.Variable) -> Any:
    """`variable`'s value in its own dtype, ignoring any autocast scope.

    Inside a mixed-precision layer call every float variable reads as the
    compute dtype; the recurrent layers need the float32 master copy. The
    result stays differentiable with respect to the variable.
    """
    with _AutocastScope(None):
        return variable.value


# -- the XLA decision of `compile` ---------------------------------------------

MODEL_SUPPORTS_JIT = _register(
    "keras.wrap_model_supports_jit",
    "keras.src.trainers.trainer.model_supports_jit",
    "the XLA fallback (a multi-process DistributedOptimizer model compiled "
    "with jit_compile='auto' or True trains without XLA instead of failing "
    "at its first step)",
)
_trainer_module = None
try:
    _trainer_module = importlib.import_module("keras.src.trainers.trainer")
except ImportError as _exc:  # pragma: no cover - depends on the Keras version
    _import_problems.append((MODEL_SUPPORTS_JIT, f"ImportError: {_exc}"))
else:
    _check_signature(
        MODEL_SUPPORTS_JIT,
        getattr(_trainer_module, "model_supports_jit", None),
        ("model",),
    )

_GUARD_MARK = "_keras_mpfp16_wrapped"


def trainer_module() -> Any:
    """`keras.src.trainers.trainer`, whose `model_supports_jit` `compile`
    consults (None if it could not be imported)."""
    return _trainer_module


def wrap_model_supports_jit(make_wrapper: Callable[[Callable], Callable]) -> None:
    """Replaces Keras's `model_supports_jit(model)` by `make_wrapper(original)`.

    Keras asks this function whether to XLA-compile a model, both for
    `jit_compile="auto"` in `compile()` and when `jit_compile` is set. The
    wrapper is installed once; later calls are no-ops.

    Args:
        make_wrapper: `original -> wrapper`, where `wrapper(model) -> bool`.

    Raises:
        KerasInternalsError: if this Keras has no such function.
    """
    original = getattr(_trainer_module, "model_supports_jit", None)
    if original is None:
        raise _error(MODEL_SUPPORTS_JIT, "it is not defined")
    if getattr(original, _GUARD_MARK, False):
        return
    wrapper = make_wrapper(original)
    setattr(wrapper, _GUARD_MARK, True)
    wrapper._keras_mpfp16_original = original
    _trainer_module.model_supports_jit = wrapper


def unwrap_model_supports_jit() -> bool:
    """Puts Keras's own `model_supports_jit` back (undoes the wrapper above).

    Returns:
        Whether a wrapper was removed.
    """
    current = getattr(_trainer_module, "model_supports_jit", None)
    if not getattr(current, _GUARD_MARK, False):
        return False
    _trainer_module.model_supports_jit = current._keras_mpfp16_original
    return True


def model_supports_jit_wrapped() -> bool:
    """Whether Keras's `model_supports_jit` is wrapped now."""
    current = getattr(_trainer_module, "model_supports_jit", None)
    return bool(getattr(current, _GUARD_MARK, False))


# -- optimizers ----------------------------------------------------------------

OPTIMIZER_LEARNING_RATE = _register(
    "keras.get_learning_rate_slot",
    "keras.optimizers.Optimizer._learning_rate",
    "LearningRateScaler (putting its per-step rate in place of the "
    "optimizer's learning rate without untracking the learning-rate "
    "variable, as the public setter would)",
)


def get_learning_rate_slot(optimizer: keras.optimizers.Optimizer) -> Any:
    """What the optimizer holds as its learning rate, unevaluated.

    A `keras.Variable` (float learning rate), a `LearningRateSchedule`, or a
    callable. The public `optimizer.learning_rate` returns the *current
    value* instead.
    """
    try:
        return optimizer._learning_rate
    except AttributeError:
        raise _error(
            OPTIMIZER_LEARNING_RATE,
            f"{type(optimizer).__name__} has no `_learning_rate` attribute",
        ) from None


def set_learning_rate_slot(optimizer: keras.optimizers.Optimizer, value: Any) -> None:
    """Puts `value` (a variable, schedule or callable) in the learning-rate slot.

    Unlike the public `optimizer.learning_rate = callable` setter, this does
    not untrack the optimizer's learning-rate variable, so checkpoints keep
    holding it and putting the variable back restores the original state.
    Keras calls a callable in the slot for the rate of every step.
    """
    get_learning_rate_slot(optimizer)  # raises if the slot is gone
    optimizer._learning_rate = value


OPTIMIZER_TRAINABLE_VARIABLES = _register(
    "keras.optimizer_trainable_variables",
    "keras.optimizers.Optimizer._trainable_variables",
    "DistributedOptimizer.apply(grads) called without trainable_variables",
)


def optimizer_trainable_variables(optimizer: keras.optimizers.Optimizer) -> list:
    """The variables `optimizer.build(...)` was given, in order."""
    try:
        return list(optimizer._trainable_variables)
    except AttributeError:
        raise _error(
            OPTIMIZER_TRAINABLE_VARIABLES,
            f"{type(optimizer).__name__} has no `_trainable_variables` attribute "
            "(is it built?)",
        ) from None


OPTIMIZER_VARIABLE_INDEX = _register(
    "keras.optimizer_variable_index",
    "keras.optimizers.Optimizer._get_variable_index",
    "DistributedOptimizer gradient accumulation (one accumulator per variable)",
)
_check_signature(
    OPTIMIZER_VARIABLE_INDEX,
    getattr(keras.optimizers.Optimizer, "_get_variable_index", None),
    ("variable",),
)


def optimizer_variable_index(
    optimizer: keras.optimizers.Optimizer, variable: keras.Variable
) -> int:
    """The position of `variable` among the variables the optimizer was built with."""
    return optimizer._get_variable_index(variable)


BASE_OPTIMIZER_BUILD = _register(
    "keras.build_optimizer_base",
    "keras.optimizers.Optimizer.build called past LossScaleOptimizer.build",
    "DistributedOptimizer.build (its own loss-scale variables instead of "
    "LossScaleOptimizer's)",
)
if not issubclass(keras.optimizers.LossScaleOptimizer, keras.optimizers.Optimizer):
    _import_problems.append(  # pragma: no cover - depends on the Keras version
        (BASE_OPTIMIZER_BUILD, "LossScaleOptimizer is not a keras.optimizers.Optimizer")
    )
_check_signature(BASE_OPTIMIZER_BUILD, keras.optimizers.Optimizer.build, ("variables",))


def build_optimizer_base(optimizer: keras.optimizers.Optimizer, var_list: list) -> None:
    """Runs `keras.optimizers.Optimizer.build` on a `LossScaleOptimizer` subclass.

    Skips `LossScaleOptimizer.build`, which would create the loss-scale
    variables a subclass creates itself.
    """
    keras.optimizers.Optimizer.build(optimizer, var_list)


# -- callbacks -----------------------------------------------------------------

MODEL_CHECKPOINT_HOOKS = _register(
    "keras.checkpoint_file_path",
    "keras.callbacks.ModelCheckpoint._save_model / _get_file_path / _should_save_model",
    "AtomicModelCheckpoint (rank-0, atomic checkpoint writes)",
)
# The method a ModelCheckpoint subclass overrides to take over the writing.
MODEL_CHECKPOINT_SAVE_METHOD = "_save_model"
_check_signature(
    MODEL_CHECKPOINT_HOOKS,
    getattr(keras.callbacks.ModelCheckpoint, MODEL_CHECKPOINT_SAVE_METHOD, None),
    ("epoch", "batch", "logs"),
)
_check_signature(
    MODEL_CHECKPOINT_HOOKS,
    getattr(keras.callbacks.ModelCheckpoint, "_get_file_path", None),
    ("epoch", "batch", "logs"),
)
_check_signature(
    MODEL_CHECKPOINT_HOOKS,
    getattr(keras.callbacks.ModelCheckpoint, "_should_save_model", None),
    ("epoch", "batch", "logs", "filepath"),
)


def checkpoint_file_path(
    callback: keras.callbacks.ModelCheckpoint, epoch: int, batch: int | None, logs
) -> str:
    """The file `callback` would write now (its `filepath` template filled in)."""
    return callback._get_file_path(epoch, batch, logs)


def checkpoint_should_save(
    callback: keras.callbacks.ModelCheckpoint,
    epoch: int,
    batch: int | None,
    logs,
    filepath: str,
) -> bool:
    """Whether `callback` writes now (`save_best_only`, monitor, ...).

    Updates the callback's best value as Keras does.
    """
    return callback._should_save_model(epoch, batch, logs, filepath)


class checkpoint_bookkeeping_only:  # noqa: N801 - used like a function
    """Context manager: a `ModelCheckpoint` keeps its books but writes nothing.

    While active, the callback's writing hook (`_save_model`) only fills in
    the file name and runs Keras's own save decision
    (`checkpoint_should_save`, which updates `best`); no directory is made
    and nothing is saved. For ranks other than 0, so that every rank's
    callback object holds the state rank 0's does. Removes the instance
    attribute on exit (restoring one the user had set).
    """

    def __init__(self, callback: keras.callbacks.ModelCheckpoint):
        self.callback = callback
        self._own = None

    def __enter__(self):
        callback = self.callback
        self._own = callback.__dict__.get(MODEL_CHECKPOINT_SAVE_METHOD)

        def bookkeeping(epoch, batch, logs):
            path = checkpoint_file_path(callback, epoch, batch, logs)
            checkpoint_should_save(callback, epoch, batch, logs, path)

        setattr(callback, MODEL_CHECKPOINT_SAVE_METHOD, bookkeeping)
        return self

    def __exit__(self, *exc):
        if self._own is not None:
            setattr(self.callback, MODEL_CHECKPOINT_SAVE_METHOD, self._own)
        else:
            delattr(self.callback, MODEL_CHECKPOINT_SAVE_METHOD)
        return False


STEP_FUNCTIONS = _register(
    "keras.reset_step_functions",
    "Model.train_function / test_function / predict_function, rebuilt by "
    "make_*_function around the instance's train_step / test_step",
    "callbacks that wrap the train/test step (GlobalMetrics, LearningRateScaler)",
)
for _name in ("make_train_function", "make_test_function", "make_predict_function"):
    if not callable(getattr(keras.Model, _name, None)):
        _import_problems.append(  # pragma: no cover - depends on the Keras version
            (STEP_FUNCTIONS, f"keras.Model.{_name} is not defined")
        )

_STEP_FUNCTION_NAMES = {
    "train": "train_function",
    "test": "test_function",
    "predict": "predict_function",
}


def reset_step_functions(
    model: keras.Model, which: Sequence[str] = ("train", "test")
) -> None:
    """Drops `model`'s compiled step functions so Keras traces them again.

    Needed after replacing `model.train_step` / `test_step` on the instance:
    `fit`/`evaluate` rebuild a function that is None, and the rebuilt one
    calls the instance's current step.

    Args:
        model: A Keras model.
        which: Any of `"train"`, `"test"`, `"predict"`.
    """
    for kind in which:
        name = _STEP_FUNCTION_NAMES[kind]
        if not hasattr(model, name):
            raise _error(
                STEP_FUNCTIONS,
                f"{type(model).__name__} has no `{name}` attribute",
            )
        setattr(model, name, None)


# -- the multi-process fit/evaluate (keras_mpfp16.training, the lead's) -------

FLATTEN_LAYERS = _register(
    "keras.flatten_layers",
    "keras.layers.Layer._flatten_layers",
    "replica state: telling frozen layers' weights from the non-trainable "
    "statistics that are averaged over ranks",
)
_check_signature(
    FLATTEN_LAYERS,
    getattr(keras.layers.Layer, "_flatten_layers", None),
    ("include_self", "recursive"),
)


def flatten_layers(model: keras.layers.Layer) -> list:
    """`model` and every layer nested in it (sublayers of layers included)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


SYMBOLIC_BUILD = _register(
    "keras.symbolic_build",
    "keras.Model._symbolic_build (what Keras's fit runs under a tf.distribute "
    "strategy to build the model before the first step)",
    "replica state: a model not built before fit is built from its data's "
    "shapes, so rank 0's variables exist to be broadcast before the first step",
)
_check_signature(
    SYMBOLIC_BUILD,
    getattr(keras.Model, "_symbolic_build", None),
    ("iterator", "data_batch"),
)


def symbolic_build(model: keras.Model, data_batch: Any) -> None:
    """Builds `model`, its compiled loss/metrics and its optimizer from the
    shapes of `data_batch` (an `(x, y, sample_weight)` batch: arrays, tensors
    or `tf.TensorSpec`s), as Keras does before `fit` under a strategy. No
    step runs; only shapes and dtypes are read."""
    model._symbolic_build(data_batch=data_batch)


INITIAL_EPOCH = _register(
    "keras.get_initial_epoch",
    "Model._initial_epoch (set by BackupAndRestore, read by fit)",
    "resuming: every rank starts fit at the epoch rank 0 restored",
)


def get_initial_epoch(model: keras.Model) -> int | None:
    """The epoch a `BackupAndRestore` restore told `fit` to start from, or None."""
    if not hasattr(model, "_initial_epoch"):
        raise _error(INITIAL_EPOCH, f"{type(model).__name__} has no `_initial_epoch`")
    return model._initial_epoch


def set_initial_epoch(model: keras.Model, epoch: int | None) -> None:
    """Tells `fit` which epoch to start from (what `BackupAndRestore` does)."""
    get_initial_epoch(model)  # raises if Keras no longer has it
    model._initial_epoch = epoch


METRICS_RESULT_OR_LOGS = _register(
    "keras.metrics_result_or_logs",
    "keras.Model._get_metrics_result_or_logs (overridden on the instance)",
    "a rank left without evaluation batches (fewer batches than ranks) "
    "returns the global metrics like the others, not `{}`",
)
_check_signature(
    METRICS_RESULT_OR_LOGS,
    getattr(keras.Model, "_get_metrics_result_or_logs", None),
    ("logs",),
)


def override_metrics_result_or_logs(model: keras.Model, fn: Callable | None) -> None:
    """Makes `model`'s end-of-epoch/evaluation log choice call `fn(logs)`.

    `fn(logs)` replaces Keras's `_get_metrics_result_or_logs(logs)` on this
    instance (`original_metrics_result_or_logs` calls Keras's own); None
    removes the override.
    """
    if not hasattr(model, "_get_metrics_result_or_logs"):
        raise _error(
            METRICS_RESULT_OR_LOGS,
            f"{type(model).__name__} has no `_get_metrics_result_or_logs`",
        )
    if fn is None:
        model.__dict__.pop("_get_metrics_result_or_logs", None)
    else:
        model._get_metrics_result_or_logs = fn


def original_metrics_result_or_logs(model: keras.Model, logs: Any) -> Any:
    """Keras's own `_get_metrics_result_or_logs(logs)` for `model`."""
    return type(model)._get_metrics_result_or_logs(model, logs)


TRAIN_VALIDATION_SPLIT = _register(
    "keras.train_validation_split",
    "keras.src.trainers.data_adapters.array_slicing.train_validation_split",
    "fit(validation_split=...) under mpirun: the validation tail is split over "
    "the ranks like validation_data (not evaluated whole on every rank)",
)
_train_validation_split = _resolve(
    TRAIN_VALIDATION_SPLIT,
    "keras.src.trainers.data_adapters.array_slicing",
    "train_validation_split",
)


def train_validation_split(arrays: tuple, validation_split: float) -> tuple:
    """Keras's own split of `(x, y, sample_weight)` for `fit(validation_split=)`.

    Returns:
        `(train_arrays, validation_arrays)`, exactly as `fit` makes them.
    """
    if _train_validation_split is None:
        raise _error(TRAIN_VALIDATION_SPLIT, "it is not defined")
    return _train_validation_split(arrays, validation_split=validation_split)


DATA_ADAPTER = _register(
    "keras.fit_data_adapter",
    "keras.src.trainers.data_adapters.get_data_adapter",
    "models built as Keras builds them: a model not built before fit is built "
    "from the input spec Keras's own first step would be traced with (the "
    "data adapter's tf.data element spec: batch dimension None where Keras "
    "leaves it None), not from the first batch's shape",
)
_get_data_adapter = _resolve(
    DATA_ADAPTER, "keras.src.trainers.data_adapters", "get_data_adapter"
)
if _get_data_adapter is not None:
    _check_signature(
        DATA_ADAPTER,
        _get_data_adapter,
        (
            "x",
            "y",
            "sample_weight",
            "batch_size",
            "steps_per_epoch",
            "shuffle",
            "class_weight",
        ),
    )


def fit_data_adapter(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    batch_size: int | None = None,
    steps_per_epoch: int | None = None,
    class_weight: dict | None = None,
) -> Any:
    """The data adapter Keras's `fit` makes for these arguments (unshuffled).

    Its `get_tf_dataset().element_spec` is the input spec Keras traces the
    first train step with (TensorFlow backend, no strategy). A Python
    generator is read (Keras peeks its first batches).
    """
    if _get_data_adapter is None:
        raise _error(DATA_ADAPTER, "it is not defined")
    return _get_data_adapter(
        x,
        y,
        sample_weight=sample_weight,
        batch_size=batch_size,
        steps_per_epoch=steps_per_epoch,
        shuffle=False,
        class_weight=class_weight,
    )


INTERACTIVE_LOGGING = _register(
    "keras.gate_interactive_logging",
    "keras.src.utils.io_utils.is_interactive_logging_enabled (the module "
    "attribute print_msg, the progress bar and summary() read)",
    "output once under mpirun: Keras's output stays off on ranks other than 0 "
    "whatever resets Keras's global state (clear_session, "
    "enable_interactive_logging)",
)
_io_utils_enabled = _resolve(
    INTERACTIVE_LOGGING,
    "keras.src.utils.io_utils",
    "is_interactive_logging_enabled",
)


def gate_interactive_logging(gate: Callable[[], bool] | None) -> None:
    """Makes Keras print to stdout only while `gate()` is true (None: no gate).

    Keras's own output (`print_msg`: the progress bar, epoch lines,
    callbacks' messages; `summary()`) goes to stdout when Keras's
    interactive-logging flag is on, and to absl logging otherwise. The flag
    lives in Keras's global state, which `keras.backend.clear_session()`
    resets to on, as does a user's `enable_interactive_logging()`. With a
    gate, those output paths read "on" only when the flag is on *and*
    `gate()` is true; the flag itself (and `keras.config.
    is_interactive_logging_enabled()`) is left to the user. Idempotent: a
    new gate replaces the previous one.
    """
    if _io_utils_enabled is None:
        raise _error(INTERACTIVE_LOGGING, "it is not defined")
    module = importlib.import_module("keras.src.utils.io_utils")
    if gate is None:
        module.is_interactive_logging_enabled = _io_utils_enabled
        return

    def is_interactive_logging_enabled() -> bool:
        return bool(gate()) and _io_utils_enabled()

    is_interactive_logging_enabled.__wrapped__ = _io_utils_enabled
    is_interactive_logging_enabled.__doc__ = _io_utils_enabled.__doc__
    module.is_interactive_logging_enabled = is_interactive_logging_enabled


BACKUP_PATHS = _register(
    "keras.backup_paths",
    "keras.callbacks.BackupAndRestore._weights_path / _training_metadata_path",
    "BackupAndRestore under mpirun (rank 0 writes its two files atomically, as one)",
)


def backup_paths(callback: keras.callbacks.BackupAndRestore) -> tuple[str, str]:
    """The weights file and the metadata file a `BackupAndRestore` reads and writes."""
    try:
        return callback._weights_path, callback._training_metadata_path
    except AttributeError as exc:
        raise _error(BACKUP_PATHS, str(exc)) from None


def set_backup_paths(
    callback: keras.callbacks.BackupAndRestore, weights: str, metadata: str
) -> None:
    """Points a `BackupAndRestore`'s writes (and reads) at other files."""
    backup_paths(callback)  # raises if Keras no longer has them
    callback._weights_path = weights
    callback._training_metadata_path = metadata


WEIGHTS_SNAPSHOT = _register(
    "keras.weights_snapshot",
    "keras.src.saving.saving_lib._save_state / H5IOStore",
    "step-level BackupAndRestore under mpirun (the state copied in the step, "
    "the .weights.h5 file written in the background)",
)
_saving_lib = _resolve(WEIGHTS_SNAPSHOT, "keras.src.saving", "saving_lib")
_save_state = getattr(_saving_lib, "_save_state", None)
_H5IOStore = getattr(_saving_lib, "H5IOStore", None)
if _saving_lib is not None:
    _check_signature(
        WEIGHTS_SNAPSHOT,
        _save_state,
        (
            "saveable",
            "weights_store",
            "assets_store",
            "inner_path",
            "visited_saveables",
        ),
    )
    if _H5IOStore is None:
        _import_problems.append((WEIGHTS_SNAPSHOT, "H5IOStore is not defined"))


def _snapshot_store_class():
    class _SnapshotStore(_H5IOStore):
        """Records what Keras's weight saving would write, as numpy copies:
        `make(path, metadata)` opens an entry, `entry[key] = value` fills it."""

        def __init__(self):  # no file: nothing of H5IOStore's state is used
            self.entries: list[tuple[str, Any, dict]] = []

        def __bool__(self):
            return True

        def make(self, path, metadata=None):
            entry: dict = {}
            self.entries.append((path, metadata, entry))
            return _CopyingEntry(entry)

        def close(self):
            pass

    return _SnapshotStore


class _CopyingEntry:
    def __init__(self, values: dict):
        self.values = values

    def __setitem__(self, key, value):
        self.values[key] = np.array(keras.ops.convert_to_numpy(value), copy=True)

    def __len__(self):
        return len(self.values)


def snapshot_weights(model: keras.Model) -> list:
    """A host-memory copy of everything `model.save_weights` would write
    (the model's and its optimizer's variables, with Keras's file layout).

    Returns:
        An opaque snapshot for `write_weights_snapshot`; nothing in it refers
        to the model any more, so training may go on while it is written.
    """
    if _save_state is None or _H5IOStore is None:
        raise _error(WEIGHTS_SNAPSHOT, "keras.src.saving.saving_lib has changed")
    if not model.built:
        raise ValueError(
            f"Cannot back up model {model.name!r}: it is not built. Build it "
            "(call it on a batch of data) before `fit`."
        )
    store = _snapshot_store_class()()
    try:
        _save_state(
            model,
            weights_store=store,
            assets_store=None,
            inner_path="",
            visited_saveables=set(),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise _error(WEIGHTS_SNAPSHOT, f"{type(exc).__name__}: {exc}") from exc
    return store.entries


def write_weights_snapshot(snapshot: list, path: str) -> None:
    """Writes a `snapshot_weights` copy to `path` (a `.weights.h5` file that
    `model.load_weights` reads, as `model.save_weights` would have written
    it). Touches no Keras object: safe in a background thread."""
    store = _H5IOStore(path, mode="w")
    try:
        for inner_path, metadata, values in snapshot:
            if metadata is None:
                entry = store.make(inner_path)
            else:
                entry = store.make(inner_path, metadata)
            for key, value in values.items():
                entry[key] = value
    finally:
        store.close()


ARRAY_DATASET = _register(
    "keras.array_datasets_without_autotune",
    "keras.src.trainers.data_adapters.array_data_adapter.ArrayDataAdapter.get_tf_dataset",
    "the tf.data teardown workaround (fit/evaluate on arrays without the "
    "up-to-60-s stall when an epoch's input iterator is destroyed)",
)
_array_adapter = _resolve(
    ARRAY_DATASET,
    "keras.src.trainers.data_adapters.array_data_adapter",
    "ArrayDataAdapter",
)
if _array_adapter is not None:
    _check_signature(ARRAY_DATASET, getattr(_array_adapter, "get_tf_dataset", None), ())


def array_data_adapter() -> Any:
    """Keras's `ArrayDataAdapter` class (numpy inputs of fit/evaluate)."""
    return _array_adapter


class array_datasets_without_autotune:  # noqa: N801 - used like a function
    """Context manager: Keras's `tf.data` pipelines for array inputs run
    without tf.data autotuning while it is active.

    Why: each epoch Keras replaces the iterator of the dataset it builds for
    numpy inputs, and destroying an iterator waits for tf.data's autotuning
    thread, which sleeps between optimisation rounds for up to 60 s (its
    period doubles from 10 ms). The wait lands between the last batch and
    validation, after validation, and when `fit` returns: measured here
    0.1-9.5 s per iterator after short runs, 12-35 s reported after
    100-s epochs. With autotuning off there is no such thread; the pipeline
    (an index gather per batch) does not need tuning.

    Re-entrant and thread-safe (the patch is process-wide: the first of
    nested or concurrent scopes installs it, the last one out restores it);
    only affects datasets Keras builds while it is active.
    """

    _depth = 0
    _original = None

    @classmethod
    def active(cls) -> bool:
        """Whether the patch is in place now (some scope is active)."""
        return cls._depth > 0

    # Guards the count and the patch together: two threads entering (or one
    # leaving while another enters) must not both install, or restore early.
    _lock = threading.Lock()

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                original = _array_adapter.get_tf_dataset

                def get_tf_dataset(adapter):
                    import tensorflow as tf

                    options = tf.data.Options()
                    options.autotune.enabled = False
                    return original(adapter).with_options(options)

                cls._original = original
                _array_adapter.get_tf_dataset = get_tf_dataset
            cls._depth += 1
        return self

    def __exit__(self, *exc):
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                _array_adapter.get_tf_dataset = cls._original
                cls._original = None
        return False


EPOCH_ITERATOR = _register(
    "keras.skip_steps_of_next_epoch",
    "keras.src.trainers.epoch_iterator.EpochIterator._enumerate_iterator "
    "(yields (begin_step, end_step, iterator) per step; (step, iterator) in 3.10)",
    "resuming a preempted fit in the middle of an epoch (the steps already "
    "trained are read from the input and not trained again)",
)
_epoch_iterator = _resolve(
    EPOCH_ITERATOR, "keras.src.trainers.epoch_iterator", "EpochIterator"
)
if _epoch_iterator is not None:
    _check_signature(
        EPOCH_ITERATOR, getattr(_epoch_iterator, "_enumerate_iterator", None), ()
    )


class skip_steps_of_next_epoch:  # noqa: N801 - used like a function
    """Context manager: the next epoch Keras's `fit` starts while it is
    active begins at step `steps` instead of 0.

    The batches of the first `steps` steps are still read from the input
    (so the epoch's remaining batches are the ones an uninterrupted run
    would train on) but not trained on; callbacks see the real step
    numbers from `steps` on. `arm(n)` sets the count for the next epoch
    iterator that starts (a training epoch: Keras creates the validation
    iterator after the training steps of the epoch).
    """

    _depth = 0
    _original = None
    _pending = 0

    @classmethod
    def active(cls) -> bool:
        """Whether the patch is in place now (some scope is active)."""
        return cls._depth > 0

    @classmethod
    def arm(cls, steps: int) -> None:
        cls._pending = int(steps)

    def __enter__(self):
        cls = type(self)
        if cls._depth == 0:
            original = _epoch_iterator._enumerate_iterator

            def _enumerate_iterator(iterator_self):
                skip, cls._pending = cls._pending, 0
                for item in original(iterator_self):
                    # Keras >= 3.11 yields (begin_step, end_step, iterator);
                    # 3.10 yields (step, iterator), and `__next__` reads
                    # steps_per_execution batches from it.
                    if len(item) == 3:
                        begin, end, iterator = item
                        batches = end - begin + 1
                    else:
                        begin, iterator = item
                        batches = iterator_self.steps_per_execution
                    if begin < skip:
                        try:
                            for _ in range(batches):
                                next(iterator)
                        except StopIteration:
                            return
                        continue
                    yield item

            cls._original = original
            _epoch_iterator._enumerate_iterator = _enumerate_iterator
        cls._depth += 1
        return self

    def __exit__(self, *exc):
        cls = type(self)
        cls._depth -= 1
        if cls._depth == 0:
            _epoch_iterator._enumerate_iterator = cls._original
            cls._original = None
            cls._pending = 0
        return False


# -- undocumented behaviour of public Keras API -------------------------------
# No private name to resolve: these are things public methods do (or accept)
# that Keras does not document. The probes (keras_probes.py) exercise each at
# the installed Keras; the constants are what the package relies on.

CACHED_EVAL_DATASET_KWARG = "_use_cached_eval_dataset"
FIT_VALIDATION_EVALUATE = _register(
    "keras.CACHED_EVAL_DATASET_KWARG",
    "keras.Model.fit runs validation as "
    "self.evaluate(..., _use_cached_eval_dataset=True)",
    "validation inside a collective fit (training/model_hooks.py tells such "
    "an evaluate from a user's by that keyword)",
)

GET_METRICS_RESULT = "get_metrics_result"
METRICS_RESULT_AT_END = _register(
    "keras.GET_METRICS_RESULT",
    "keras.Model.get_metrics_result, looked up on the instance and called "
    "after the last batch of an epoch and of an evaluation",
    "the metric reduction's end of evaluation (ranks with fewer validation "
    "batches catch up when Keras reads the final metrics)",
)

CALLBACK_LIST_ATTRIBUTE = "callbacks"
CALLBACK_LIST_EDITABLE = _register(
    "keras.CALLBACK_LIST_ATTRIBUTE",
    "keras.callbacks.CallbackList.callbacks (the list edited in place after "
    "construction, then set_model called again)",
    "a collective fit given a CallbackList (the library's callbacks placed "
    "around the user's, training/run.py)",
)


# What the package's patches replace in Keras, by patch (the patch table,
# training/patches.py, names these as its targets).
PATCH_TARGETS = {
    "model_supports_jit": "keras.src.trainers.trainer.model_supports_jit",
    "interactive_logging": ("keras.src.utils.io_utils.is_interactive_logging_enabled"),
    "epoch_iterator": (
        "keras.src.trainers.epoch_iterator.EpochIterator._enumerate_iterator"
    ),
    "array_dataset": (
        "keras.src.trainers.data_adapters.array_data_adapter."
        "ArrayDataAdapter.get_tf_dataset"
    ),
}


# Every problem found on import, in one error.
if _import_problems:
    raise KerasInternalsError(_import_problems)


__all__ = [
    "CACHED_EVAL_DATASET_KWARG",
    "CALLBACK_LIST_ATTRIBUTE",
    "GET_METRICS_RESULT",
    "MODEL_CHECKPOINT_SAVE_METHOD",
    "PATCH_TARGETS",
    "REGISTRY",
    "array_data_adapter",
    "array_datasets_without_autotune",
    "autocast_scope",
    "backup_paths",
    "fit_data_adapter",
    "flatten_layers",
    "gate_interactive_logging",
    "set_backup_paths",
    "get_initial_epoch",
    "set_initial_epoch",
    "build_optimizer_base",
    "checkpoint_bookkeeping_only",
    "checkpoint_file_path",
    "checkpoint_should_save",
    "get_learning_rate_slot",
    "optimizer_trainable_variables",
    "optimizer_variable_index",
    "original_metrics_result_or_logs",
    "override_metrics_result_or_logs",
    "read_uncast",
    "reset_step_functions",
    "rnn_loop",
    "set_learning_rate_slot",
    "skip_steps_of_next_epoch",
    "symbolic_build",
    "train_validation_split",
    "trainer_module",
    "wrap_model_supports_jit",
]
