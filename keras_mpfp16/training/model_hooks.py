"""The two entry points: `keras.Model.fit` and `keras.Model.evaluate`.

`install()` (run by `import keras_mpfp16`) wraps both methods of
`keras.Model`, once. For a model whose optimizer is not a
`DistributedOptimizer` the wrappers call Keras's method unchanged. For one
that is:

- `fit` (always collective): with more than one process, `run_fit` - the
  replica sync before the first step, global logs, split validation, safe
  file-writing callbacks (see `training.run`); with one process, Keras's fit.
- `evaluate`: ranks ask the rendezvous (`runtime.rendezvous`) whether all of
  them called it. Together: `run_evaluate` splits the batches over the
  ranks and returns the global metrics on every rank. Alone (e.g. rank 0
  evaluating a model it loaded): Keras's evaluate, no collective.
- `fit` and `evaluate` refuse a model that another distribution engine (a
  `tf.distribute` strategy, a `keras.distribution`) would also distribute
  (`optimizer.engines`; the optimizer's constructor refuses a scope too).
- `predict` is not wrapped: each rank predicts its own input, as in Keras
  (`keras_mpfp16.split_predict` splits one input over the ranks).

Both run with Keras's tf.data pipelines for array inputs not autotuned
(`internals.keras.array_datasets_without_autotune`: removes a stall of up to
60 s each time an epoch's iterator is destroyed). Set
`KERAS_MPFP16_TFDATA_AUTOTUNE=1` to keep Keras's pipelines as they are.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings

import keras

from keras_mpfp16 import runtime
from keras_mpfp16.callbacks.global_metrics import GlobalMetrics
from keras_mpfp16.callbacks.rank_output import quiet_non_root_ranks
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.optimizer import DistributedOptimizer, engines
from keras_mpfp16.runtime import env, rendezvous, world
from keras_mpfp16.training import files, run

AUTOTUNE_ENV = "KERAS_MPFP16_TFDATA_AUTOTUNE"  # registered in runtime.env
_MARK = "_keras_mpfp16_hook"
_REFUSED = "{}() of a model compiled with a DistributedOptimizer"


def uses_distributed_optimizer(model) -> bool:
    """Whether `model` is compiled with a `keras_mpfp16.DistributedOptimizer`."""
    return isinstance(getattr(model, "optimizer", None), DistributedOptimizer)


def _input_pipelines():
    if env.get("TFDATA_AUTOTUNE"):
        return contextlib.nullcontext()
    if keras.backend.backend() != "tensorflow":
        return contextlib.nullcontext()
    return keras_internals.array_datasets_without_autotune()


def _bind(original, args, kwargs) -> dict:
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    extra = arguments.pop("kwargs", None)  # evaluate(**kwargs)
    if extra:
        arguments.update(extra)
    return arguments


def _wrap_fit(original):
    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if not uses_distributed_optimizer(self):
            return original(self, *args, **kwargs)
        engines.check_no_other_engine(self, _REFUSED.format("fit"))
        with _input_pipelines():
            if runtime.size() == 1:
                return original(self, *args, **kwargs)
            quiet_non_root_ranks()
            return run.run_fit(original, _bind(original, (self, *args), kwargs))

    setattr(fit, _MARK, True)
    return fit


def _wrap_evaluate(original):
    @functools.wraps(original)
    def evaluate(self, *args, **kwargs):
        if not uses_distributed_optimizer(self):
            return original(self, *args, **kwargs)
        if not kwargs.get("_use_cached_eval_dataset"):
            engines.check_no_other_engine(self, _REFUSED.format("evaluate"))
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
                kwargs.get("_use_cached_eval_dataset")
                or world.launched_size() == 1
                or not runtime.is_initialized()
                or runtime.size() == 1
            ):
                return original(self, *args, **kwargs)
            verdict = rendezvous.enter("evaluate")
            arguments = _bind(original, (self, *args), kwargs)
            if verdict.together:
                quiet_non_root_ranks()
                return run.run_evaluate(original, arguments)
            if verdict.note:
                warnings.warn(f"keras_mpfp16: {verdict.note}", stacklevel=2)
            arguments["callbacks"] = _without_global_metrics(arguments["callbacks"])
            return original(**arguments)

    setattr(evaluate, _MARK, True)
    return evaluate


def _without_global_metrics(callbacks):
    if not callbacks or isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    kept = [cb for cb in callbacks if not isinstance(cb, GlobalMetrics)]
    if len(kept) != len(callbacks):
        warnings.warn(
            "keras_mpfp16: GlobalMetrics ignored: this rank evaluates alone "
            "(the other ranks did not call evaluate), so there is nothing to "
            "combine its metrics with.",
            stacklevel=3,
        )
    return kept


def install() -> None:
    """Wraps `keras.Model.fit`, `evaluate`, `save` and `save_weights`
    (idempotent; `save`/`save_weights`: see `training.files.wrap_save`)."""
    for name, wrap in (
        ("fit", _wrap_fit),
        ("evaluate", _wrap_evaluate),
        ("save", files.wrap_save),
        ("save_weights", files.wrap_save),
    ):
        original = getattr(keras.Model, name)
        if getattr(original, _MARK, False):
            continue
        setattr(keras.Model, name, wrap(original))
