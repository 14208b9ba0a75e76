"""Wrapping a model's train and test steps from callbacks.

Keras's `CallbackList` calls `set_model` on every callback before `fit`
calls `make_train_function()` (keras/src/backend/tensorflow/trainer.py), so a
callback can replace the model's `train_step` / `test_step` there and reset
`train_function` / `test_function` so they are rebuilt around the new step.
Code in the step runs before any callback sees the step's logs, which makes
the result independent of the order callbacks are listed in.

Several callbacks may hook the same model: this module keeps one registry
per model and composes the hooks in a fixed order (by `priority`, lowest
innermost), so installing and removing them in any order is safe.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from keras_mpfp16.internals import keras as keras_internals

StepWrapper = Callable[[Callable], Callable]


@dataclass
class _Hook:
    priority: int
    train: StepWrapper | None
    test: StepWrapper | None
    owner: object


@dataclass
class _Registry:
    # The steps as they were before the first hook: an instance attribute the
    # user set (restored as such) or None (the class's method).
    own_train: Callable | None
    own_test: Callable | None
    hooks: dict


_registries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def install(
    model,
    key,
    *,
    train: StepWrapper | None = None,
    test: StepWrapper | None = None,
    priority: int = 0,
    owner: object = None,
) -> None:
    """Adds (or replaces) the hook `key` on `model` and rebuilds its steps.

    Keys name a role ("one metric reduction"), so a hook left behind by a
    `fit` that raised (Keras then skips `on_train_end`) is replaced, not
    stacked, by the next one.

    Args:
        model: A Keras model.
        key: Any hashable naming the hook's role.
        train: `step -> step` wrapper for `train_step`, or None.
        test: `step -> step` wrapper for `test_step`, or None.
        priority: Lower is applied first (innermost).
        owner: Who installed it; `uninstall` with another owner is a no-op.
    """
    reg = _registries.get(model)
    if reg is None:
        reg = _Registry(
            own_train=model.__dict__.get("train_step"),
            own_test=model.__dict__.get("test_step"),
            hooks={},
        )
        _registries[model] = reg
    reg.hooks[key] = _Hook(priority, train, test, owner)
    _rebuild(model, reg)


def uninstall(model, key, owner: object = None) -> None:
    """Removes the hook `key` if `owner` installed it; rebuilds the model's steps."""
    reg = _registries.get(model)
    if reg is None or key not in reg.hooks or reg.hooks[key].owner is not owner:
        return
    del reg.hooks[key]
    _rebuild(model, reg)
    if not reg.hooks:
        del _registries[model]


def installed(model, key, owner: object = None) -> bool:
    """Whether hook `key` is on `model` (installed by `owner`, when given)."""
    reg = _registries.get(model)
    if reg is None or key not in reg.hooks:
        return False
    return owner is None or reg.hooks[key].owner is owner


def _restore(model, name: str, own: Callable | None) -> None:
    if own is not None:
        setattr(model, name, own)
    elif name in model.__dict__:
        delattr(model, name)


def _rebuild(model, reg: _Registry) -> None:
    _restore(model, "train_step", reg.own_train)
    _restore(model, "test_step", reg.own_test)
    train, test = model.train_step, model.test_step
    for hook in sorted(reg.hooks.values(), key=lambda h: h.priority):
        if hook.train is not None:
            train = hook.train(train)
        if hook.test is not None:
            test = hook.test(test)
    if reg.hooks:
        model.train_step = train
        model.test_step = test
    # Traced functions captured the old steps: have Keras build new ones.
    keras_internals.reset_step_functions(model, ("train", "test"))
