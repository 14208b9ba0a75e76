"""Every private TensorFlow access of keras_mpfp16, behind named accessors.

Imported only by the TensorFlow bridge (`keras_mpfp16/backend/tensorflow.py`),
the one module that handles TensorFlow tensors. Same rules as
`internals/keras.py`: resolved at import, one `KerasInternalsError` naming
the installed versions and the feature affected if anything is missing,
`check()` probes each accessor.
"""

from __future__ import annotations

import importlib

import tensorflow as tf

from keras_mpfp16.internals import Internal, KerasInternalsError

REGISTRY: dict[str, Internal] = {}
_import_problems: list[tuple[Internal, str]] = []

IN_XLA_CONTEXT = Internal(
    accessor="tensorflow.in_xla_context",
    internal="tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext",
    feature="the DistributedOptimizer's in-step XLA check (a clear error naming "
    "jit_compile instead of an XLA compilation failure)",
)
REGISTRY[IN_XLA_CONTEXT.accessor] = IN_XLA_CONTEXT
try:
    _in_xla = importlib.import_module(
        "tensorflow.python.ops.control_flow_util"
    ).GraphOrParentsInXlaContext
except (ImportError, AttributeError) as exc:  # pragma: no cover - TF version
    _import_problems.append((IN_XLA_CONTEXT, f"{type(exc).__name__}: {exc}"))

DEVICES_INITIALIZED = Internal(
    accessor="tensorflow.devices_initialized",
    internal="tensorflow.python.eager.context.context_safe() and its "
    "_physical_devices / _context_handle",
    feature="kmp.bind_gpus()'s 'too late' error (CUDA_VISIBLE_DEVICES set after "
    "TensorFlow set up its devices would silently have no effect)",
)
REGISTRY[DEVICES_INITIALIZED.accessor] = DEVICES_INITIALIZED
try:
    _context_safe = importlib.import_module(
        "tensorflow.python.eager.context"
    ).context_safe
except (ImportError, AttributeError) as exc:  # pragma: no cover - TF version
    _import_problems.append((DEVICES_INITIALIZED, f"{type(exc).__name__}: {exc}"))

if _import_problems:
    raise KerasInternalsError(_import_problems)


def in_xla_context() -> bool:
    """True while tracing a function compiled with XLA (`jit_compile=True`).

    TensorFlow has no public API for this. The graph comes from the public
    `tf.compat.v1.get_default_graph()` (the function graph being traced).
    """
    return bool(_in_xla(tf.compat.v1.get_default_graph()))


def _probe_in_xla_context() -> None:
    seen = []

    def record():
        seen.append(in_xla_context())
        return tf.constant(0.0)

    tf.function(record, jit_compile=True)()
    tf.function(record, jit_compile=False)()
    seen.append(in_xla_context())  # eager
    if seen != [True, False, False]:
        raise AssertionError(
            f"in_xla_context() under jit_compile=True/False/eager gave {seen}"
        )


def devices_initialized() -> bool:
    """Whether TensorFlow has listed its physical devices or started its context.

    Either fixes the devices CUDA sees (`CUDA_VISIBLE_DEVICES` is read when
    CUDA initialises). TensorFlow has no public API that answers without
    initialising them itself. The eager context is created lazily
    (`context_safe()` is None until then); `_physical_devices` is filled by
    the first device query, `_context_handle` by the first operation.
    """
    ctx = _context_safe()
    if ctx is None:
        return False
    _require_context_attributes(ctx)
    return ctx._physical_devices is not None or ctx._context_handle is not None


def _require_context_attributes(ctx) -> None:
    missing = [
        a for a in ("_physical_devices", "_context_handle") if not hasattr(ctx, a)
    ]
    if missing:
        raise KerasInternalsError(
            [(DEVICES_INITIALIZED, f"the eager context has no {', '.join(missing)}")]
        )


def _probe_devices_initialized() -> None:
    tf.constant(0.0)  # the context exists and has started
    if not devices_initialized():
        raise AssertionError("devices_initialized() is False after an operation")


def check() -> dict[str, str | None]:
    """`{accessor: None}` if it works as the package needs, else what went wrong."""
    results: dict[str, str | None] = {}
    for internal, probe in (
        (IN_XLA_CONTEXT, _probe_in_xla_context),
        (DEVICES_INITIALIZED, _probe_devices_initialized),
    ):
        try:
            probe()
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            results[internal.accessor] = f"{type(exc).__name__}: {exc}"
        else:
            results[internal.accessor] = None
    return results


__all__ = ["REGISTRY", "check", "devices_initialized", "in_xla_context"]
