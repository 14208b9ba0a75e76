"""Replica state: one model on every rank, all of its state, from the first step.

What makes the ranks' models one model, and when:

- **Before the first step of every `fit`** (`on_train_begin`, after the
  user's callbacks, so after `BackupAndRestore` restored rank 0): all ranks
  check that they train the same variables (the model signature), agree on
  the epoch to start from, and take rank 0's values of *every* variable of
  the model (trainable, non-trainable, random-seed state) and of the
  optimizer (slots, iteration counter, loss scale). Ranks that built their
  models from different random seeds start from rank 0's model, and the
  first update is a one-process update from rank 0's initial weights.
- **Every train step**: gradients are averaged (the optimizer); non-trainable
  variables that training changes (BatchNormalization's moving statistics,
  any other non-trainable variable of a trainable layer) are averaged in the
  same MPI call as the metric increments (`averaged_variables`), so they are
  identical on every rank after every step; and every rank's learning rate
  and optimizer settings are compared (`hyperparameter_slots`): ranks that
  differ stop together with an error naming them and their values.
  With `DistributedOptimizer(non_trainable_sync="epoch")` the non-trainable
  variables are averaged at the end of every epoch, before validation and
  at the end of `fit` instead.

Variables of frozen layers (`layer.trainable = False`) never change in
training and are only broadcast; stateful RNN states are per-rank (each
rank's lanes carry its own sequences) and are never touched.
"""

from __future__ import annotations

import zlib

import keras
import numpy as np
from keras import ops

from keras_mpfp16 import backend as backends
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime.mpi import collectives, world
from keras_mpfp16.sync.checks import UNSEEDED_CHOICE_HINT, check_same_variables
from keras_mpfp16.sync.input_spec import traced_input_spec


def averaged_variables(model) -> list:
    """The non-trainable variables whose per-step changes are averaged over ranks.

    Non-trainable weights of trainable layers (BatchNormalization's moving
    mean and variance, custom running statistics), numeric dtypes only.
    Excluded: weights of frozen layers (they never change), random-seed
    state (it evolves identically on every rank) and metrics.
    """
    frozen = set()
    for layer in keras_internals.flatten_layers(model):
        if not layer.trainable:
            frozen.update(id(v) for v in layer.weights)
    out = []
    for v in model.non_trainable_weights:
        if id(v) in frozen:
            continue
        dtype = keras.backend.standardize_dtype(v.dtype)
        if dtype == "bool" or dtype.startswith("string"):
            continue
        out.append(v)
    return out


def replica_variables(model) -> list:
    """Every variable that must be identical on all ranks: the model's
    (trainable, non-trainable, seed state) and its optimizer's."""
    seen, out = set(), []
    optimizer = getattr(model, "optimizer", None)
    for v in list(model.variables) + list(getattr(optimizer, "variables", [])):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _settings_fingerprint(optimizer) -> float:
    """The optimizer's settings other than its learning rate, as one number.

    Its public plain-Python settings (`beta_1`, `weight_decay`, `momentum`,
    `clipnorm`, ...) are constants of the traced step: a rank that changed
    one and retraced differs here. Read when the step is traced.
    """
    inner = optimizer
    while getattr(inner, "inner_optimizer", None) is not None:
        inner = inner.inner_optimizer
    settings = sorted(
        (name, value)
        for name, value in vars(inner).items()
        if not name.startswith("_")
        and isinstance(value, (bool, int, float, str, type(None)))
    )
    return float(zlib.crc32(repr(settings).encode()))


_HYPERPARAMETER_MESSAGE = (
    "keras_mpfp16: ranks trained this step with different optimizer settings, "
    "so their replicas would diverge. One row per rank (rank 0 first): "
    "[learning rate, fingerprint of the other optimizer settings]:\n{}\n"
    "Something changed the optimizer on some ranks only (a callback that saw "
    "rank-local logs, or code run on one rank). Make every rank take the same "
    "decision, e.g. from the global logs keras_mpfp16 provides. "
    + UNSEEDED_CHOICE_HINT.replace("{", "{{").replace("}", "}}")
)


def hyperparameter_slots(model):
    """`(values, message)` for `MetricReduction(rank_slots=...)`: every rank's
    learning rate of this step and its optimizer-settings fingerprint."""
    optimizer = model.optimizer
    rate = ops.cast(optimizer.learning_rate, "float64")
    return [rate, _settings_fingerprint(optimizer)], _HYPERPARAMETER_MESSAGE


def is_built(model) -> bool:
    """Whether every layer of `model` has its variables (Keras's own test)."""
    return all(layer.built for layer in keras_internals.flatten_layers(model))


_DEFERRED_SYNC_WARNING = (
    "keras_mpfp16: the model is not built when fit starts and could not be "
    "built from the shapes of its input ({why}), so the ranks are synced "
    "inside the first update instead (as in a custom training loop): the "
    "first update averages gradients that each rank computed at its own "
    "initial weights, and only trainable and optimizer variables are taken "
    "from rank 0. For the first update one process would make, build the "
    "model before fit (call it on a batch: model(x[:1])) or seed every rank "
    "alike (keras.utils.set_random_seed)."
)


def build_before_fit(model, arguments: dict) -> bool:
    """Builds a model that is not built yet, as Keras's own `fit` would build it.

    Keras (TensorFlow backend, no strategy) builds such a model - a
    subclassed model, or a `Sequential` without an `Input` - while it traces
    the first train step, which is too late for `sync_from_root`: rank 0's
    initial weights must exist before the first step to be broadcast. This
    runs Keras's own pre-`fit` build (`Model._symbolic_build`, the one it
    runs under a `tf.distribute` strategy) from the input spec the first
    step would be traced with (`input_spec.traced_input_spec`: batch
    dimension None wherever Keras leaves it None), so the model's inputs,
    build config and saved file are what Keras's `fit` makes of the same
    input. No step runs and no MPI call is made.

    Args:
        model: The model `fit` was called on.
        arguments: `fit`'s bound arguments (after `validation_split` was
            turned into `validation_data`); `"x"` is replaced when it is a
            Python generator whose first batches were read.

    Returns:
        Whether the model is built now. False for an input Keras's data
        adapter does not take or a model Keras could not build symbolically
        (warned); `sync_from_root` then leaves the sync to the first update.
    """
    if is_built(model):
        return True
    try:
        spec = traced_input_spec(arguments)
    except Exception as exc:  # noqa: BLE001 - Keras's fit raises it again
        why = f"its input: {type(exc).__name__}: {exc}"
    else:
        why = ""
        try:
            keras_internals.symbolic_build(model, spec)
        except Exception as exc:  # noqa: BLE001 - Keras raises it again in the step
            why = f"{type(exc).__name__}: {exc}"
    if is_built(model):
        return True
    world.warn_once_per_job(_DEFERRED_SYNC_WARNING.format(why=why), stacklevel=3)
    return False


def sync_from_root(model) -> None:
    """Before the first step: the model signature check, then rank 0's value of
    every model and optimizer variable on every rank (one fused broadcast).

    A model that is still not built (see `build_before_fit`) has no variables
    to send yet: then nothing happens here and the optimizer's first update
    syncs, as in a custom training loop, after its model signature check.
    The ranks agree on this branch when they run the same script: each ran
    the same pre-`fit` build on inputs of the same shapes.
    """
    optimizer = model.optimizer
    if not is_built(model):
        return
    if not optimizer.built:
        # Keras would build it inside the first (traced) train step, with the
        # same variables; its state must exist now to be broadcast.
        optimizer.build(model.trainable_variables)
    variables = replica_variables(model)
    check_same_variables(variables, what="variables (model and optimizer)")
    backends.bridge().broadcast_variables(variables, root=0)
    backends.bridge().mark_synced(model.optimizer)
    # `check_replicas_every` compares everything but the averaged statistics,
    # which the forward pass changes locally before the check and the step's
    # reduction then makes equal again.
    averaged = {id(v) for v in averaged_variables(model)}
    optimizer.set_replica_variables([v for v in variables if id(v) not in averaged])


def agree_on_initial_epoch(model) -> None:
    """The epoch `fit` starts from, as rank 0 has it (after a restore there)."""
    value = keras_internals.get_initial_epoch(model)
    mine = np.int64(-1 if value is None else value)
    root = int(collectives.broadcast(np.asarray([mine]))[0])
    keras_internals.set_initial_epoch(model, None if root < 0 else root)


def average_non_trainable(model, baseline: list | None) -> list:
    """Host side ("epoch" mode): averages the changes of `averaged_variables`
    since `baseline` (their values at the last sync) over ranks.

    Returns:
        The new baseline (the averaged values).
    """
    variables = averaged_variables(model)
    if not variables:
        return []
    values = backends.bridge().variable_values(variables)
    if baseline is None or len(baseline) != len(values):
        baseline = values  # first sync after the broadcast: nothing changed yet
    deltas = np.concatenate(
        [
            (np.asarray(v, np.float64) - np.asarray(b, np.float64)).reshape(-1)
            for v, b in zip(values, baseline)
        ]
    )
    mean = collectives.allreduce(deltas, op="average", name="non-trainable averaging")
    out, offset = [], 0
    for var, b in zip(variables, baseline):
        size = int(np.prod(var.shape))
        new = (
            np.asarray(b, np.float64).reshape(-1) + mean[offset : offset + size]
        ).astype(keras.backend.standardize_dtype(var.dtype))
        new = new.reshape(var.shape)
        var.assign(new)
        out.append(new)
        offset += size
    return out
