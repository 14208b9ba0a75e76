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


def check() -> dict[str, str | None]:
    """`{accessor: None}` if it works as the package needs, else what went wrong."""
    try:
        _probe_in_xla_context()
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        return {IN_XLA_CONTEXT.accessor: f"{type(exc).__name__}: {exc}"}
    return {IN_XLA_CONTEXT.accessor: None}


__all__ = ["REGISTRY", "check", "in_xla_context"]
