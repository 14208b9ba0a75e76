"""Every change keras_mpfp16 makes outside its own objects: one table, `PATCHES`.

Each row is one change to Keras, TensorFlow or the process (a Keras
function or method replaced, an environment variable set, a standard stream
redirected, a hook or signal handler installed): its name, what it changes
(`targets`), why, when it happens, the setting that leaves it out, and how
it is installed and removed. `installed()` (`kmp.installed_keras_patches()`)
says for every row whether it is in place now; `install()` and `uninstall()`
(`kmp.install_keras_patches()`, `kmp.uninstall_keras_patches()`) put in and
take out the Keras patches, and `uninstall()` also every other row that can
be removed. `tests/test_patches.py` compares the table with what
`import keras_mpfp16` actually changes in a fresh interpreter.

| row | changes | why | when | left out by |
|---|---|---|---|---|
| `keras.Model.fit` | `keras.Model.fit` (`model_hooks.wrap_fit`) | a collective fit: sync, split validation, global logs, safe callbacks | import | `PATCH_KERAS=0` |
| `keras.Model.evaluate` | `keras.Model.evaluate` (`model_hooks.wrap_evaluate`) | a collective evaluate when every rank calls it | import | `PATCH_KERAS=0` |
| `keras.Model.save`, `keras.Model.save_weights` | those methods (`files.wrap_save`) | atomic on every rank (no torn file, no HDF5 lock error) | import | `PATCH_KERAS=0` |
| `model_supports_jit` | Keras's XLA decision (its trainer's `model_supports_jit`, `sync.xla`) | a step with an MPI call from the host cannot be XLA-compiled | import | `PATCH_KERAS=0` |
| `keras.interactive_logging_gate` | Keras's `io_utils.is_interactive_logging_enabled` and interactive-logging flag (`rank_output`) | one progress bar under mpirun: Keras's output off on ranks other than 0, whatever resets Keras's state | import (ranks other than 0), each collective fit/evaluate | `ALL_RANKS_OUTPUT=1` |
| `sys.stdout` | file descriptor 1 (and `sys.stdout` if it writes elsewhere) to `os.devnull` on ranks other than 0 (`rank_output.root_stdout_only`) | all output once, when asked | import with `ROOT_STDOUT_ONLY=1`, or `kmp.root_stdout_only()` | not set (opt-in) |
| `environment.thread_defaults` | `TF_NUM_INTRAOP_THREADS`, `TF_NUM_INTEROP_THREADS`, `OMP_NUM_THREADS` (only those not set) | ranks sharing a node share its cores | import, under a launcher with 2+ ranks on the node | `THREADS=off` |
| `environment.gpu_binding` | `CUDA_VISIBLE_DEVICES` | one GPU per local rank | import with `BIND_GPUS=1`, or `kmp.bind_gpus()` | not set (opt-in) |
| `import_audit_hook` | a `sys.addaudithook` hook (`keras_mpfp16._bootstrap`) | the import-time work at the first Keras/TensorFlow import, not before (the launch wrapper stays light) | import (unless Keras was imported first) | never |
| `keras.EpochIterator._enumerate_iterator` | the epoch iterator's step generator (`internals.keras.skip_steps_of_next_epoch`) | resuming a preempted epoch at its step | each collective fit (scoped) | `PATCH_KERAS=0` (no collective fit) |
| `keras.ArrayDataAdapter.get_tf_dataset` | the array adapter's `get_tf_dataset` (`internals.keras.array_datasets_without_autotune`) | no tf.data autotune thread to wait for when an epoch's iterator is destroyed | each collective fit/evaluate (scoped) | `TFDATA_AUTOTUNE=1` |
| `signal.preemption` | the `SIGTERM` and `SIGUSR1` handlers (`runtime.supervision.preemption.handling`, the user's chained) | an agreed stop at one step on every rank | each collective fit (scoped) | `PATCH_KERAS=0` (no collective fit) |
| `sys.excepthook` | `sys.excepthook`, `sys.exit`, an `atexit` check (`runtime.supervision.failure`) | one rank's failure ends the whole job, never a hang | `kmp.init` (first collective) | `ABORT_ON_EXCEPTION=0` |

"When": *import* rows are put in by `import keras_mpfp16`'s bootstrap
(`keras_mpfp16._bootstrap`, at the first import of Keras or TensorFlow);
*scoped* rows are in place only during the call that needs them, installed
when it starts and removed when it returns, on every path out (context
managers: `installed()` says True only inside such a call); *init* rows
when MPI is initialised.

`KERAS_MPFP16_PATCH_KERAS=0` leaves out the rows that change Keras for
every model: the `fit`/`evaluate`/`save`/`save_weights` wrappers and the XLA
guard (rows with `keras_patch=True`). Without the wrappers no collective
fit starts by itself, so neither do the scoped rows of one (the epoch
iterator, the preemption handlers; `kmp.distributed_fit` /
`kmp.distributed_evaluate` in `training.sessions` still scope them around a
Keras `fit`/`evaluate` the user calls); XLA must then be off for the model
(`jit_compile=False`, which the metric reduction sets when it wraps the
model's steps). It keeps the others, each with its own setting, because
they are not changes to how Keras trains: the output gate
(`ALL_RANKS_OUTPUT`), the stdout redirection (`ROOT_STDOUT_ONLY`), the
environment (`THREADS`, `BIND_GPUS`), the array pipelines' autotuning inside
a collective call (`TFDATA_AUTOTUNE`) and the job-ending hooks
(`ABORT_ON_EXCEPTION`); the import audit hook cannot be removed (PEP 578)
and does nothing once the bootstrap has run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import keras

from keras_mpfp16 import _settings as env
from keras_mpfp16 import rank_output
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.process import gpus, threads
from keras_mpfp16.runtime.supervision import failure, preemption
from keras_mpfp16.sync import xla
from keras_mpfp16.training import files, model_hooks, sessions


@dataclass(frozen=True)
class Patch:
    """One change to Keras, TensorFlow or the process (a row of `PATCHES`).

    Attributes:
        name: the row's key in `installed()`.
        targets: what it changes, as `module.attribute` (Keras's private
            ones from the seam, `internals.keras.PATCH_TARGETS`), `os.environ[KEY]`,
            `sys.stdout`, `fd 1`, ... (the import test reads these).
        reason: why the library makes the change.
        when: `"import"`, `"scoped"` (only during a collective call) or
            `"init"` (when MPI is initialised).
        left_out_by: the setting (or condition) under which it is not made.
        keras_patch: True for the rows `KERAS_MPFP16_PATCH_KERAS=0` leaves
            out and `install()` puts in.
        is_installed: whether it is in place now.
        install: puts it in (None: made by the code that needs it: a scope,
            `kmp.init`, `kmp.bind_gpus`, `kmp.root_stdout_only`).
        uninstall: takes it out (None: cannot be undone; `reason_kept` says why).
        reason_kept: why a row without `uninstall` stays.
    """

    name: str
    targets: tuple[str, ...]
    reason: str
    when: str
    left_out_by: str
    keras_patch: bool
    is_installed: Callable[[], bool]
    install: Callable[[], object] | None = None
    uninstall: Callable[[], object] | None = None
    reason_kept: str = ""


_METHODS = (
    ("fit", model_hooks.wrap_fit),
    ("evaluate", model_hooks.wrap_evaluate),
    ("save", files.wrap_save),
    ("save_weights", files.wrap_save),
)
_WRAPS = dict(_METHODS)


def _needs_xla_guard(model) -> bool:
    # No collective: `compile` runs on whatever ranks call it.
    return sessions.uses_distributed_optimizer(model) and world.launched_size() > 1


# name -> whether keras.Model defined the method itself (not a base class),
# for `uninstall` to restore exactly what was there.
_own_method: dict[str, bool] = {}


def _install_method(name: str) -> None:
    original = getattr(keras.Model, name)
    if getattr(original, model_hooks.MARK, False):
        return
    _own_method[name] = name in vars(keras.Model)
    setattr(keras.Model, name, _WRAPS[name](original))


def _uninstall_method(name: str) -> None:
    current = vars(keras.Model).get(name)
    if current is None or not getattr(current, model_hooks.MARK, False):
        return
    if _own_method.get(name, True):
        setattr(keras.Model, name, current.__wrapped__)
    else:
        delattr(keras.Model, name)  # Keras defines it on a base class


def _method_installed(name: str) -> bool:
    return bool(getattr(vars(keras.Model).get(name), model_hooks.MARK, False))


def _method_row(name: str, reason: str) -> Patch:
    return Patch(
        name=f"keras.Model.{name}",
        targets=(f"keras.Model.{name}",),
        reason=reason,
        when="import",
        left_out_by="KERAS_MPFP16_PATCH_KERAS=0",
        keras_patch=True,
        is_installed=lambda: _method_installed(name),
        install=lambda: _install_method(name),
        uninstall=lambda: _uninstall_method(name),
    )


def _audit_hook_added() -> bool:
    # The bootstrap is above this layer: read its state, do not import it.
    bootstrap = sys.modules.get("keras_mpfp16._bootstrap")
    return bootstrap is not None and bootstrap.hook_added()


_SAVE_REASON = "atomic on every rank (no torn file, no HDF5 lock error)"

# The table. Order: the Keras patches `install()` puts in, then the rest.
PATCHES: tuple[Patch, ...] = (
    _method_row(
        "fit",
        "a collective fit: sync, split validation, global logs, safe callbacks",
    ),
    _method_row("evaluate", "a collective evaluate when every rank calls it"),
    _method_row("save", _SAVE_REASON),
    _method_row("save_weights", _SAVE_REASON),
    Patch(
        name="model_supports_jit",
        targets=(keras_internals.PATCH_TARGETS["model_supports_jit"],),
        reason="a step with an MPI call from the host cannot be XLA-compiled "
        "(a multi-process DistributedOptimizer model compiles without XLA)",
        when="import",
        left_out_by="KERAS_MPFP16_PATCH_KERAS=0",
        keras_patch=True,
        is_installed=xla.jit_guard_installed,
        install=lambda: xla.install_jit_guard(_needs_xla_guard),
        uninstall=xla.uninstall_jit_guard,
    ),
    Patch(
        name="keras.interactive_logging_gate",
        targets=(
            keras_internals.PATCH_TARGETS["interactive_logging"],
            "keras.config.is_interactive_logging_enabled()",
        ),
        reason="one progress bar under mpirun: Keras's output stays off on "
        "ranks other than 0, whatever resets Keras's state (clear_session, "
        "enable_interactive_logging)",
        when="import (ranks other than 0, from the launcher's environment); "
        "each collective fit/evaluate (from the communicator)",
        left_out_by="KERAS_MPFP16_ALL_RANKS_OUTPUT=1",
        keras_patch=False,
        is_installed=rank_output.output_gate_installed,
        install=rank_output.install_output_gate,
        uninstall=rank_output.remove_output_gate,
    ),
    Patch(
        name="sys.stdout",
        targets=("fd 1", "sys.stdout"),
        reason="all standard output on rank 0 only, when asked",
        when="import with KERAS_MPFP16_ROOT_STDOUT_ONLY=1, or "
        "kmp.root_stdout_only() (ranks other than 0)",
        left_out_by="not asked for (opt-in)",
        keras_patch=False,
        is_installed=rank_output.stdout_redirected,
        reason_kept="for good, as documented: output written meanwhile is gone",
    ),
    Patch(
        name="environment.thread_defaults",
        targets=tuple(
            f"os.environ[{key}]"
            for key in (
                "TF_NUM_INTRAOP_THREADS",
                "TF_NUM_INTEROP_THREADS",
                "OMP_NUM_THREADS",
            )
        ),
        reason="ranks sharing a node share its cores (each backend sizes its "
        "thread pools from the whole machine otherwise); never overrides a "
        "variable the user set",
        when="import, before TensorFlow starts (2+ ranks on the node, or "
        "KERAS_MPFP16_THREADS=INTRA,INTER)",
        left_out_by="KERAS_MPFP16_THREADS=off",
        keras_patch=False,
        is_installed=lambda: bool(threads.applied),
        reason_kept="read once, when the backend's thread pools start",
    ),
    Patch(
        name="environment.gpu_binding",
        targets=("os.environ[CUDA_VISIBLE_DEVICES]",),
        reason="one GPU per local rank",
        when="import with KERAS_MPFP16_BIND_GPUS=1, or kmp.bind_gpus()",
        left_out_by="not asked for (opt-in)",
        keras_patch=False,
        is_installed=lambda: bool(gpus.bound),
        reason_kept="read once, when CUDA starts",
    ),
    Patch(
        name="import_audit_hook",
        targets=("sys.addaudithook",),
        reason="the import-time work runs at the first import of Keras or "
        "TensorFlow (before it loads), so `import keras_mpfp16` alone stays "
        "light for the launch wrapper; does nothing once it has run",
        when="import (unless Keras or TensorFlow was imported first)",
        left_out_by="never",
        keras_patch=False,
        is_installed=_audit_hook_added,
        reason_kept="audit hooks cannot be removed (PEP 578)",
    ),
    Patch(
        name="keras.EpochIterator._enumerate_iterator",
        targets=(keras_internals.PATCH_TARGETS["epoch_iterator"],),
        reason="resuming a preempted epoch at its step (the steps already "
        "trained are read, not trained again)",
        when="scoped: each collective fit (training.run)",
        left_out_by="KERAS_MPFP16_PATCH_KERAS=0 (no collective fit starts by "
        "itself; kmp.distributed_fit scopes it)",
        keras_patch=False,
        is_installed=keras_internals.skip_steps_of_next_epoch.active,
        reason_kept="removed when the call returns",
    ),
    Patch(
        name="keras.ArrayDataAdapter.get_tf_dataset",
        targets=(keras_internals.PATCH_TARGETS["array_dataset"],),
        reason="no tf.data autotuning thread to wait for (up to 60 s) when an "
        "epoch's input iterator is destroyed",
        when="scoped: each collective fit/evaluate (training.sessions)",
        left_out_by="KERAS_MPFP16_TFDATA_AUTOTUNE=1",
        keras_patch=False,
        is_installed=keras_internals.array_datasets_without_autotune.active,
        reason_kept="removed when the call returns",
    ),
    Patch(
        name="signal.preemption",
        targets=("signal SIGTERM", "signal SIGUSR1"),
        reason="a preemption signal becomes a stop agreed at one step on every "
        "rank (the user's own handler is chained)",
        when="scoped: each collective fit (training.run)",
        left_out_by="KERAS_MPFP16_PATCH_KERAS=0 (no collective fit starts by "
        "itself; kmp.distributed_fit scopes it)",
        keras_patch=False,
        is_installed=preemption.handling_active,
        reason_kept="removed when the call returns",
    ),
    Patch(
        name="sys.excepthook",
        targets=("sys.excepthook", "sys.exit", "atexit"),
        reason="one rank's exception or sys.exit(n) ends the whole job, never a hang",
        when="init (kmp.init, or the first collective), under an MPI launch",
        left_out_by="KERAS_MPFP16_ABORT_ON_EXCEPTION=0",
        keras_patch=False,
        is_installed=failure.abort_on_exception_installed,
        reason_kept="lives as long as the job",
    ),
)

ROWS = {row.name: row for row in PATCHES}


def install() -> bool:
    """Installs the Keras patches (the rows `KERAS_MPFP16_PATCH_KERAS=0`
    leaves out: `fit`, `evaluate`, `save`, `save_weights`, the XLA guard),
    and the output gate on ranks other than 0 (unless
    `KERAS_MPFP16_ALL_RANKS_OUTPUT=1`). Idempotent.

    Returns:
        True once the patches are in place.

    Raises:
        KerasInternalsError: if this Keras lacks the XLA hook.
    """
    for row in PATCHES:
        if row.keras_patch:
            row.install()
    ROWS["keras.interactive_logging_gate"].install()
    return True


def install_from_env() -> bool:
    """`install()`'s Keras patches unless `KERAS_MPFP16_PATCH_KERAS=0` (at
    `import keras_mpfp16`; the output gate is its own bootstrap step)."""
    if not env.get("PATCH_KERAS"):
        return False
    for row in PATCHES:
        if row.keras_patch:
            row.install()
    return True


def uninstall() -> None:
    """Removes every row that can be removed: `keras.Model` and Keras's XLA
    decision are Keras's own again, and so is Keras's interactive-logging
    check (idempotent). Scoped rows end with their call; the others stay
    (each row's `reason_kept`)."""
    for row in PATCHES:
        if row.uninstall is not None:
            row.uninstall()


def installed() -> dict[str, bool]:
    """Whether each row of the table is in place now, by row name."""
    return {row.name: bool(row.is_installed()) for row in PATCHES}
