"""One collective `fit` or `evaluate`, as a context manager around Keras's own.

`distributed_fit(model, ...)` and `distributed_evaluate(model, ...)` are the
explicit path for code that drives Keras itself: a model class whose own
`fit` does not call `super().fit`, a framework on top of Keras, a script run
with the Keras patches off (`KERAS_MPFP16_PATCH_KERAS=0`). Each yields the
keyword arguments to hand to Keras's `fit` / `evaluate` inside the `with`
block - this rank's part of the validation data, the user's callbacks made
safe between the run's own - and does exactly what the patched
`keras.Model.fit` / `evaluate` do (they are built on these two functions).

For a model not compiled with a `DistributedOptimizer`, and with one
process, the arguments come back as given (bound to Keras's signature): the
same code runs unchanged in a one-process script.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import keras

from keras_mpfp16 import _settings as env
from keras_mpfp16.callbacks.global_metrics import GlobalMetrics
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.optimizer import DistributedOptimizer, engines
from keras_mpfp16.rank_output import quiet_non_root_ranks
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.supervision import rendezvous
from keras_mpfp16.training import run

_REFUSED = "{}() of a model compiled with a DistributedOptimizer"

# Models inside a `distributed_fit` / `distributed_evaluate` block: the
# patched `fit` / `evaluate` called there (e.g. `super().fit(**kwargs)`)
# pass through to Keras's, so nothing is prepared twice.
_in_session: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def uses_distributed_optimizer(model) -> bool:
    """Whether `model` is compiled with a `keras_mpfp16.DistributedOptimizer`."""
    return isinstance(getattr(model, "optimizer", None), DistributedOptimizer)


def in_session(model) -> bool:
    """Whether `model` is inside a `distributed_fit` / `distributed_evaluate`."""
    return _in_session.get(model, 0) > 0


@contextlib.contextmanager
def _session(model) -> Iterator[None]:
    _in_session[model] = _in_session.get(model, 0) + 1
    try:
        yield
    finally:
        _in_session[model] -= 1


def _input_pipelines():
    if env.get("TFDATA_AUTOTUNE"):
        return contextlib.nullcontext()
    if keras.backend.backend() != "tensorflow":
        return contextlib.nullcontext()
    return keras_internals.array_datasets_without_autotune()


def bind_arguments(signature_of: Callable, args: tuple, kwargs: dict) -> dict:
    """`args`/`kwargs` (the model first) bound to `signature_of`'s signature,
    defaults applied, `**kwargs` merged in (Keras's `evaluate(**kwargs)`)."""
    bound = inspect.signature(signature_of).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    extra = arguments.pop("kwargs", None)
    if extra:
        arguments.update(extra)
    return arguments


@contextlib.contextmanager
def fit_arguments(signature_of: Callable, args: tuple, kwargs: dict) -> Iterator[dict]:
    """`distributed_fit` with `"self"` kept in the arguments (for the wrapper)."""
    model, arguments = args[0], bind_arguments(signature_of, args, kwargs)
    with _session(model):
        if not uses_distributed_optimizer(model):
            yield arguments
            return
        engines.check_no_other_engine(model, _REFUSED.format("fit"))
        with _input_pipelines():
            if world.size() == 1:
                yield arguments
                return
            quiet_non_root_ranks()
            with run.fit_run(arguments) as prepared:
                yield prepared


@contextlib.contextmanager
def evaluate_arguments(
    signature_of: Callable, args: tuple, kwargs: dict
) -> Iterator[dict]:
    """`distributed_evaluate` with `"self"` kept in the arguments."""
    model, arguments = args[0], bind_arguments(signature_of, args, kwargs)
    with _session(model):
        if not uses_distributed_optimizer(model):
            yield arguments
            return
        cached = bool(arguments.get(keras_internals.CACHED_EVAL_DATASET_KWARG))
        if not cached:
            engines.check_no_other_engine(model, _REFUSED.format("evaluate"))
        with _input_pipelines():
            # Validation inside a collective fit: already split and global.
            # One process, or MPI not initialised yet: Keras's evaluate. Not
            # initialised means no rank has called fit, shard or any other
            # collective, so this evaluate may be the only MPI-aware call on
            # this rank (e.g. one rank evaluating a model it loaded):
            # initialising here (a collective) could wait for ranks that
            # never come. Every rank alone then computes what one process
            # computes on its data (the same data on every rank: the same
            # numbers as together, see `data.split`).
            if (
                cached
                or world.launched_size() == 1
                or not world.is_initialized()
                or world.size() == 1
            ):
                yield arguments
                return
            verdict = rendezvous.enter("evaluate")
            if verdict.together:
                quiet_non_root_ranks()
                with run.evaluate_run(arguments) as prepared:
                    yield prepared
                return
            if verdict.note:
                warnings.warn(f"keras_mpfp16: {verdict.note}", stacklevel=4)
            arguments["callbacks"] = _without_global_metrics(arguments["callbacks"])
            yield arguments


def _without_global_metrics(callbacks):
    if not callbacks or isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    kept = [cb for cb in callbacks if not isinstance(cb, GlobalMetrics)]
    if len(kept) != len(callbacks):
        warnings.warn(
            "keras_mpfp16: GlobalMetrics ignored: this rank evaluates alone "
            "(the other ranks did not call evaluate), so there is nothing to "
            "combine its metrics with.",
            stacklevel=5,
        )
    return kept


def _keras_method(name: str) -> Callable:
    # Keras's own method (its signature): the patched one wraps it.
    method = getattr(keras.Model, name)
    return inspect.unwrap(method)


@contextlib.contextmanager
def distributed_fit(model: keras.Model, *args: Any, **kwargs: Any) -> Iterator[dict]:
    """The arguments of one collective `fit`, for code that calls Keras's `fit`.

    Prepares exactly what the patched `keras.Model.fit` prepares for a model
    compiled with a `DistributedOptimizer` on more than one process: the
    model built from its first batch if it is not built yet,
    `validation_split` / `validation_data` dealt over the ranks, the user's
    callbacks made safe (file writers on rank 0, the rest keeping their
    books) between the run's own (the sync of rank 0's model before the
    first step, the equal-steps check, the preemption handling), the
    in-step metric reduction switched on. Call Keras's `fit` with the
    yielded arguments *inside* the `with` block, on every rank.

    With one process, or a model compiled with another optimizer, the
    arguments are returned as given: the same code runs in a one-process
    script.

    Args:
        model: The compiled model.
        *args: `fit`'s positional arguments after `self` (`x`, `y`, ...).
        **kwargs: `fit`'s keyword arguments.

    Yields:
        A dict of keyword arguments for `keras.Model.fit(model, **arguments)`
        (or `super().fit(**arguments)` in a subclass).

    Example:

    ```python
    class MyModel(keras.Model):
        def fit(self, x, y, **kwargs):       # does not call super().fit(x, y, ...)
            x = self.preprocess(x)
            with kmp.distributed_fit(self, x, y, **kwargs) as fit_kwargs:
                return super().fit(**fit_kwargs)
    ```
    """
    with fit_arguments(_keras_method("fit"), (model, *args), kwargs) as arguments:
        yield {k: v for k, v in arguments.items() if k != "self"}


@contextlib.contextmanager
def distributed_evaluate(
    model: keras.Model, *args: Any, **kwargs: Any
) -> Iterator[dict]:
    """The arguments of one `evaluate`, for code that calls Keras's `evaluate`.

    What the patched `keras.Model.evaluate` does for a model compiled with a
    `DistributedOptimizer`: when every rank calls it (the rendezvous, see
    `KERAS_MPFP16_EVALUATE_WAIT`), the data is dealt over the ranks and the
    metrics are reduced, so every rank gets the one-process result; a rank
    evaluating alone gets its arguments back, for a plain Keras `evaluate`.

    Args:
        model: The compiled model.
        *args: `evaluate`'s positional arguments after `self`.
        **kwargs: `evaluate`'s keyword arguments.

    Yields:
        A dict of keyword arguments for `keras.Model.evaluate(model, **arguments)`.

    Example:

    ```python
    with kmp.distributed_evaluate(model, x_test, y_test, return_dict=True) as kw:
        logs = keras.Model.evaluate(model, **kw)
    ```
    """
    with evaluate_arguments(
        _keras_method("evaluate"), (model, *args), kwargs
    ) as arguments:
        yield {k: v for k, v in arguments.items() if k != "self"}
