"""The package's import-time work: `bootstrap()`, its steps in order, run once.

`import keras_mpfp16` itself loads nothing heavy (no Keras, TensorFlow or
mpi4py), so a process that only needs a light part of the package (the
launch wrapper, `python -m keras_mpfp16.runtime.launch`, `kmp-launch`, which
supervises a job as long as it lives; `keras_mpfp16.config`;
`keras_mpfp16.runtime`) stays light, however Python was started. The
bootstrap runs, once per process, at the first of:

- `import keras_mpfp16` when Keras or TensorFlow is already imported;
- the first import of Keras or TensorFlow (or JAX, PyTorch) after
  `import keras_mpfp16` (before it loads: seen through Python's `import`
  audit event, PEP 578), so `import keras_mpfp16; import keras` has the Keras
  objects registered (for `keras.saving.load_model`) and the patches in
  place, and the thread defaults and the GPU binding are in the environment
  before TensorFlow starts, as when `import keras_mpfp16` did it all;
- the first import of one of the package's Keras-facing modules
  (`keras_mpfp16.layers`, `keras_mpfp16.training`, ...: anything but the
  `LIGHT` ones);
- the first public name used (`kmp.shard`, `kmp.DistributedOptimizer`,
  `kmp.layers`, `from keras_mpfp16 import *`; the package's PEP 562
  `__getattr__`).

Its steps, in order (`STEPS`; the reason for the order is each step's
docstring): root-only stdout when asked (light: at the import itself,
`AT_IMPORT`), the per-rank thread defaults, the GPU binding, the seam check,
the non-root ranks' Keras output silenced, the public API (the Keras
objects registered), the Keras patches. A step that raised is run again at
the next trigger; a step that completed never is.

This module imports nothing at import time: each step imports what it needs.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable

# Imports that start the bootstrap (top-level names) when it has not run:
# Keras, and the frameworks that read the thread and GPU environment when
# they start.
TRIGGERS = frozenset({"keras", "tensorflow", "jax", "torch"})

# Modules of the package that do not start it: the runtime (no Keras), the
# settings and their public face, the command-line entry (each tool imports
# what it needs, which starts the bootstrap where it imports Keras).
LIGHT = (
    "keras_mpfp16._bootstrap",
    "keras_mpfp16._deprecation",
    "keras_mpfp16._settings",
    "keras_mpfp16._validate",
    "keras_mpfp16.__main__",
    "keras_mpfp16.config",
    "keras_mpfp16.runtime",
)


def _root_stdout_only() -> None:
    """`KERAS_MPFP16_ROOT_STDOUT_ONLY=1`: stdout of ranks other than 0 (as the
    launcher announces them) to `os.devnull`, from `import keras_mpfp16` on.
    Light (no Keras, no MPI call): `arm()` runs it at the import itself."""
    from keras_mpfp16 import rank_output

    if rank_output.root_stdout_only_requested():
        rank_output.root_stdout_only()


def _thread_defaults() -> None:
    """Per-rank thread-pool defaults: in the environment before the backend
    starts its thread pools (before TensorFlow is imported)."""
    from keras_mpfp16.runtime.process import threads

    threads.apply_thread_defaults()


def _gpu_binding() -> None:
    """`CUDA_VISIBLE_DEVICES` when `KERAS_MPFP16_BIND_GPUS=1`: before
    TensorFlow starts CUDA (before the seam imports Keras)."""
    from keras_mpfp16.runtime.process import gpus

    if gpus.bind_requested():
        from keras_mpfp16.backend.devices import bind_gpus

        bind_gpus()


def _seam_check() -> None:
    """Keras's internals the package uses, resolved: one `KerasInternalsError`
    naming each missing one and its feature (imports Keras)."""
    importlib.import_module("keras_mpfp16.internals.keras")


def _quiet_non_root_ranks() -> None:
    """Keras's output on ranks other than 0 (as the launcher announces them:
    no MPI call) gated off before Keras can print, e.g. `model.summary()`
    before the optimizer exists."""
    from keras_mpfp16 import rank_output

    rank_output.install_output_gate()


def _public_api() -> None:
    """The public names (`keras_mpfp16._api`) bound on the package; importing
    them registers the package's Keras objects (`DistributedOptimizer`, the
    layers, `LearningRateScaler`) for `.keras` files."""
    api = importlib.import_module("keras_mpfp16._api")
    package = sys.modules["keras_mpfp16"]
    for name in api.__all__:
        setattr(package, name, getattr(api, name))
    package.__all__ = list(api.__all__)


def _keras_patches() -> None:
    """The Keras patches (`training.patches`, unless
    `KERAS_MPFP16_PATCH_KERAS=0`): last, when everything they wrap exists."""
    from keras_mpfp16.training import patches

    patches.install_from_env()


# The bootstrap, in order: (name, step).
STEPS: tuple[tuple[str, Callable[[], None]], ...] = (
    ("root_stdout_only", _root_stdout_only),
    ("thread_defaults", _thread_defaults),
    ("gpu_binding", _gpu_binding),
    ("seam_check", _seam_check),
    ("quiet_non_root_ranks", _quiet_non_root_ranks),
    ("public_api", _public_api),
    ("keras_patches", _keras_patches),
)

_lock = threading.RLock()
# The steps `arm()` runs at `import keras_mpfp16` itself, whatever comes next.
AT_IMPORT = ("root_stdout_only",)
# Steps completed in this process, in order.
completed: list[str] = []
_running = False


def done() -> bool:
    """True once every step has run."""
    return len(completed) == len(STEPS)


def bootstrap(until: str | None = None) -> None:
    """Runs the steps not yet completed, in `STEPS` order (idempotent).

    Args:
        until: the last step to run now (default: all of them).

    Raises:
        Whatever a step raises (e.g. `KerasInternalsError` from the seam
        check); the step runs again at the next call.
    """
    global _running
    if done():
        return
    with _lock:
        if _running:  # a step's own imports: the outer call goes on
            return
        _running = True
        try:
            for name, step in STEPS:
                if name not in completed:
                    step()
                    completed.append(name)
                if name == until:
                    break
        finally:
            _running = False


def is_light(module: str) -> bool:
    """Whether importing `module` leaves the bootstrap for later."""
    return any(module == m or module.startswith(m + ".") for m in LIGHT)


def starts_bootstrap(module: str) -> bool:
    """Whether importing `module` (not yet loaded) starts the bootstrap."""
    top = module.partition(".")[0]
    if top in TRIGGERS:
        return True
    return top == "keras_mpfp16" and module != "keras_mpfp16" and not is_light(module)


def on_audit_event(event: str, args: tuple) -> None:
    """The `import` audit event (PEP 578): before a module not yet in
    `sys.modules` is loaded. Starts the bootstrap for `starts_bootstrap`
    modules; nothing once it has run."""
    if event != "import" or done() or _running:
        return
    if starts_bootstrap(args[0]):
        bootstrap()


def _audit_hook(event: str, args: tuple) -> None:
    # Delegates to the module as it is now in sys.modules (a test that
    # imports the package afresh gets its own state; hooks are permanent).
    if event != "import":
        return
    module = sys.modules.get(__name__)
    if module is not None:
        module.on_audit_event(event, args)


_hook_added = False


def hook_added() -> bool:
    """Whether this process has the import audit hook (the patch registry's
    `import_audit_hook` row)."""
    return _hook_added


def arm() -> None:
    """At `import keras_mpfp16`: bootstrap now if Keras or TensorFlow is
    already imported, else at the first trigger (see the module docstring)."""
    global _hook_added
    if TRIGGERS & sys.modules.keys():
        bootstrap()
        return
    bootstrap(until=AT_IMPORT[-1])
    if not _hook_added:
        sys.addaudithook(_audit_hook)
        _hook_added = True
