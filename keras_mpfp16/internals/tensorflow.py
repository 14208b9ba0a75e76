"""Every private TensorFlow access of keras_mpfp16, behind named accessors.

Imported only by the TensorFlow bridge modules (`keras_mpfp16/backend/`),
the code that handles TensorFlow objects. Same rules as
`internals/keras.py`: resolved at import, one `KerasInternalsError` naming
the installed versions and the feature affected if anything is missing,
`check()` probes each accessor.
"""

from __future__ import annotations

import importlib

import tensorflow as tf
from tensorflow.python.eager import context as _eager_context

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

DATASET_GRAPH = Internal(
    accessor="tensorflow.dataset_graph",
    internal="tf.data.Dataset._inputs() / _functions() (their traced "
    "ConcreteFunction .graph), a shuffle's _reshuffle_each_iteration / _seed / "
    "_seed2, and tensorflow.python.framework.op_def_registry.get",
    feature="the data check's read of a tf.data pipeline (shard, the evaluation "
    "split): which parts can be read without changing what the pipeline yields",
)
REGISTRY[DATASET_GRAPH.accessor] = DATASET_GRAPH
try:
    _op_def_get = importlib.import_module(
        "tensorflow.python.framework.op_def_registry"
    ).get
except (ImportError, AttributeError) as exc:  # pragma: no cover - TF version
    _import_problems.append((DATASET_GRAPH, f"{type(exc).__name__}: {exc}"))

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


def dataset_inputs(dataset) -> list:
    """The datasets `dataset` reads from (its direct inputs), in order."""
    return list(dataset._inputs())


def dataset_function_ops(dataset) -> list[str]:
    """The op types in the functions `dataset` runs (map, filter, flat_map, ...),
    nested functions included (a traced function's graph carries its library)."""
    names = []
    for wrapper in dataset._functions():
        graph_def = wrapper.function.graph.as_graph_def()
        names += [node.op for node in graph_def.node]
        for function in graph_def.library.function:
            names += [node.op for node in function.node_def]
    return names


def op_is_stateful(op_type: str) -> bool:
    """Whether TensorFlow registers `op_type` as stateful (unknown: True)."""
    op_def = _op_def_get(op_type)
    return True if op_def is None else bool(op_def.is_stateful)


def shuffle_settings(dataset) -> tuple[bool, bool]:
    """`(reshuffle_each_iteration, seeded)` of a `Dataset.shuffle` result.

    Unseeded (no `seed`, no global seed) is the two seeds 0: each process
    draws its own order.
    """
    seeds = (int(dataset._seed), int(dataset._seed2))
    return bool(dataset._reshuffle_each_iteration), seeds != (0, 0)


def _probe_dataset_graph() -> None:
    base = tf.data.Dataset.range(4)
    mapped = base.map(tf.strings.as_string)
    if [type(d).__name__ for d in dataset_inputs(mapped)] != [type(base).__name__]:
        raise AssertionError("dataset_inputs(map) does not name its input")
    if "AsString" not in dataset_function_ops(mapped):
        raise AssertionError("dataset_function_ops(map) misses AsString")
    if op_is_stateful("AsString") or not op_is_stateful("PyFunc"):
        raise AssertionError("op_is_stateful: AsString/PyFunc wrong")
    # A shuffle without `seed` takes its seeds from a global seed when one is
    # set (`keras.utils.set_random_seed`, `tf.random.set_seed`): then it is
    # seeded, the same order in every process that set the same seed.
    global_seed = _eager_context.global_seed() is not None
    if shuffle_settings(base.shuffle(4)) != (True, global_seed):
        raise AssertionError("shuffle_settings of a shuffle without a seed")
    if shuffle_settings(base.shuffle(4, seed=1, reshuffle_each_iteration=False)) != (
        False,
        True,
    ):
        raise AssertionError("shuffle_settings of a seeded shuffle")


def check() -> dict[str, str | None]:
    """`{accessor: None}` if it works as the package needs, else what went wrong."""
    results: dict[str, str | None] = {}
    for internal, probe in (
        (IN_XLA_CONTEXT, _probe_in_xla_context),
        (DEVICES_INITIALIZED, _probe_devices_initialized),
        (DATASET_GRAPH, _probe_dataset_graph),
    ):
        try:
            probe()
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            results[internal.accessor] = f"{type(exc).__name__}: {exc}"
        else:
            results[internal.accessor] = None
    return results


__all__ = [
    "REGISTRY",
    "check",
    "dataset_function_ops",
    "dataset_inputs",
    "devices_initialized",
    "in_xla_context",
    "op_is_stateful",
    "shuffle_settings",
]
