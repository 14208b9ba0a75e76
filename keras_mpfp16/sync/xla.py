"""The XLA guard: a step with an MPI call from the host is not XLA-compiled.

A model trained by a DistributedOptimizer on more than one process calls MPI
from the host in the middle of its train step (the gradient reduction, the
metric reduction), which XLA cannot compile. Two guards keep such models
off XLA:

- `guard_jit(model, what)` turns `jit_compile` off on one model, with a
  warning; the metric reduction calls it when it wraps a model's steps.
- `install_jit_guard(needs_guard)` wraps Keras's own XLA decision
  (`model_supports_jit`, asked by `compile()` for `jit_compile="auto"`, True
  on GPU machines, and for an explicit `jit_compile=True`) through the seam,
  so models for which `needs_guard(model)` is true answer False: Keras then
  trains without XLA instead of failing at the first step, and warns once.
  It is one of the Keras patches `training.patches` installs.

If a Keras release no longer has the hook, installing the guard raises
`KerasInternalsError` naming the Keras version and this feature; it never
silently does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime.mpi.world import warn_once_per_job

_XLA_WARNING = (
    "keras_mpfp16: XLA compilation (jit_compile) is turned off for this model: "
    "with more than one process the DistributedOptimizer reduces gradients "
    "with an MPI call from the host inside the train step, which XLA cannot "
    "compile. The model trains without XLA."
)


def guard_jit(model, what: str) -> None:
    """Turns XLA off for `model`: an in-step MPI call cannot be XLA-compiled."""
    if getattr(model, "jit_compile", False):
        # Every rank runs the same script: said once per job, by rank 0.
        warn_once_per_job(
            f"keras_mpfp16: {what} turns off XLA (jit_compile) for this model: "
            "the metric reduction is an MPI call from the host inside the step, "
            "which XLA cannot compile.",
            stacklevel=3,
        )
        model.jit_compile = False


def install_jit_guard(needs_guard: Callable[[object], bool]) -> bool:
    """Wraps Keras's XLA decision (once; later calls do nothing).

    Args:
        needs_guard: `model -> bool`: whether the model's train step calls
            MPI from the host (then it is compiled without XLA). It must not
            make a collective call: `compile` runs on whatever ranks call
            it, e.g. a `load_model` on rank 0 alone.

    Returns:
        True. (Kept for callers written when a missing hook returned False.)

    Raises:
        KerasInternalsError: if this Keras has no `model_supports_jit` hook.
    """
    warned = []

    def make_wrapper(original):
        def supports_jit(model):
            if needs_guard(model):
                if not warned:
                    warned.append(True)
                    warn_once_per_job(_XLA_WARNING, stacklevel=3)
                return False
            return original(model)

        return supports_jit

    keras_internals.wrap_model_supports_jit(make_wrapper)
    return True


def uninstall_jit_guard() -> bool:
    """Puts Keras's own XLA decision back. Returns whether it was wrapped."""
    return keras_internals.unwrap_model_supports_jit()


def jit_guard_installed() -> bool:
    """Whether Keras's XLA decision is wrapped by the guard now."""
    return keras_internals.model_supports_jit_wrapped()
