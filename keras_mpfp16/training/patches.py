"""Every patch keras_mpfp16 makes to Keras, installed and removed in one place.

`import keras_mpfp16` calls `install()` unless `KERAS_MPFP16_PATCH_KERAS=0`.
The patches, each a pass-through for anything that is not a model compiled
with a `DistributedOptimizer` in a multi-process job:

| patched | by | why |
|---|---|---|
| `keras.Model.fit` | `model_hooks.wrap_fit` | a collective fit: sync, split validation, global logs, safe callbacks |
| `keras.Model.evaluate` | `model_hooks.wrap_evaluate` | a collective evaluate when every rank calls it |
| `keras.Model.save`, `save_weights` | `files.wrap_save` | atomic on every rank (no torn file, no HDF5 lock error) |
| Keras's XLA decision (`model_supports_jit`, through the seam) | `sync.xla` | a step with an MPI call from the host cannot be XLA-compiled |

One more is scoped, not installed: inside a collective `fit`/`evaluate` on
TensorFlow, Keras's array adapter builds its tf.data pipeline without
autotuning (`internals.keras.array_datasets_without_autotune`, undone when
the call returns; `KERAS_MPFP16_TFDATA_AUTOTUNE=1` turns it off).

Without the patches, `kmp.distributed_fit` / `kmp.distributed_evaluate`
(`training.sessions`) give the same run to code that calls Keras's `fit` /
`evaluate` itself; XLA must then be off for the model (`jit_compile=False`,
which the metric reduction sets when it wraps the model's steps).
"""

from __future__ import annotations

import keras

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.sync import xla
from keras_mpfp16.training import files, model_hooks, sessions

_METHODS = (
    ("fit", model_hooks.wrap_fit),
    ("evaluate", model_hooks.wrap_evaluate),
    ("save", files.wrap_save),
    ("save_weights", files.wrap_save),
)


def _needs_xla_guard(model) -> bool:
    # No collective: `compile` runs on whatever ranks call it.
    return sessions.uses_distributed_optimizer(model) and world.launched_size() > 1


# name -> whether keras.Model defined the method itself (not a base class),
# for `uninstall` to restore exactly what was there.
_own_method: dict[str, bool] = {}


def install() -> bool:
    """Installs every Keras patch (idempotent).

    Returns:
        True once the patches are in place.

    Raises:
        KerasInternalsError: if this Keras lacks the XLA hook.
    """
    for name, wrap in _METHODS:
        original = getattr(keras.Model, name)
        if getattr(original, model_hooks.MARK, False):
            continue
        _own_method[name] = name in vars(keras.Model)
        setattr(keras.Model, name, wrap(original))
    xla.install_jit_guard(_needs_xla_guard)
    return True


def install_from_env() -> bool:
    """`install()` unless `KERAS_MPFP16_PATCH_KERAS=0` (at `import keras_mpfp16`)."""
    if not env.get("PATCH_KERAS"):
        return False
    return install()


def uninstall() -> None:
    """Removes every Keras patch: `keras.Model` and Keras's XLA decision are
    Keras's own again (idempotent)."""
    for name, _ in _METHODS:
        current = vars(keras.Model).get(name)
        if current is None or not getattr(current, model_hooks.MARK, False):
            continue
        if _own_method.get(name, True):
            setattr(keras.Model, name, current.__wrapped__)
        else:
            delattr(keras.Model, name)  # Keras defines it on a base class
    xla.uninstall_jit_guard()


def installed() -> dict[str, bool]:
    """Which patches are in place, by what they patch."""
    out = {
        f"keras.Model.{name}": getattr(
            vars(keras.Model).get(name), model_hooks.MARK, False
        )
        for name, _ in _METHODS
    }
    out["model_supports_jit"] = xla.jit_guard_installed()
    return out
