"""The package's layering, read from the source (docs/architecture.md's rule).

Imports flow one way:

    _validate, _settings ← runtime ← internals, rank_output ← backend ← sync
        ← optimizer/data/layers ← callbacks ← training
        ← the entry points (package, config, doctor, benchmark)

and inside the runtime, by job:

    process ← mpi ← trace ← supervision ← the runtime package itself

This test parses every module (imports inside functions included: a lazy
import hides a circle, it does not remove it) and fails on an import from a
higher layer, on an import circle between modules, and on a private name
(`_x`) imported from another module.
"""

from __future__ import annotations

import ast

import pytest
from package_tree import MODULES, PACKAGE

# Lowest first. A module may import its own layer and those below it.
LAYERS = [
    # argument checks, the settings registry, old paths that still work
    {"_validate", "_settings", "_deprecation"},
    {"runtime"},  # MPI + numpy only
    # the seam (every private Keras / TensorFlow access); Keras's console
    # output by rank
    {"internals", "rank_output"},
    {"backend"},  # the only code that touches backend tensors
    {"sync"},  # what keeps N ranks one model
    {"optimizer", "data", "layers"},  # Keras-facing objects
    {"callbacks"},
    {"training"},  # the collective fit/evaluate, the Keras patches
    # entry points: the package, its names and its import-time work, the tools
    {"", "_api", "_bootstrap", "config", "doctor", "__main__", "benchmark"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}

# Inside `runtime`, lowest first; "" is the runtime package's own modules
# (`__init__`, `progress`, the `launch` command).
RUNTIME_LAYERS = ["process", "mpi", "trace", "supervision", ""]
RUNTIME_LEVEL = {name: i for i, name in enumerate(RUNTIME_LAYERS)}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _runtime_layer(module: str) -> str | None:
    """The runtime sub-layer of a module, None outside the runtime."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] != "runtime":
        return None
    if len(parts) > 3 or (len(parts) == 3 and _is_package(module)):
        return parts[2]
    return ""


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str):
    """`(target module, imported name or None, line)` for every package import."""
    path = MODULES[module]
    package = module if _is_package(module) else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "keras_mpfp16":
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "keras_mpfp16":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in MODULES:  # `from keras_mpfp16 import runtime`: a module
                    yield sub, None, node.lineno
                else:
                    yield source, alias.name, node.lineno


EDGES = [
    (module, target, name, line)
    for module in MODULES
    for target, name, line in _imports(module)
]


def test_every_module_is_in_a_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(LEVEL))
    assert not unknown, f"add these to LAYERS (and docs/architecture.md): {unknown}"


def test_no_import_from_a_higher_layer():
    upward = [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {t} "
        f"({_layer(m) or 'package'} -> {_layer(t) or 'package'})"
        for m, t, _, line in EDGES
        if LEVEL[_layer(t)] > LEVEL[_layer(m)]
    ]
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def test_every_runtime_module_is_in_a_sub_layer():
    unknown = sorted(
        {_runtime_layer(m) for m in MODULES if _runtime_layer(m) is not None}
        - set(RUNTIME_LEVEL)
    )
    assert not unknown, (
        f"add these to RUNTIME_LAYERS (and docs/architecture.md): {unknown}"
    )


def test_no_import_from_a_higher_runtime_sub_layer():
    upward = [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {t} "
        f"({_runtime_layer(m) or 'runtime'} -> {_runtime_layer(t) or 'runtime'})"
        for m, t, _, line in EDGES
        if _runtime_layer(m) is not None
        and _runtime_layer(t) is not None
        and RUNTIME_LEVEL[_runtime_layer(t)] > RUNTIME_LEVEL[_runtime_layer(m)]
    ]
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def test_no_private_name_is_imported_from_another_module():
    private = [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {name} from {t}"
        for m, t, name, line in EDGES
        if name
        and name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))  # __version__
        and t != m
    ]
    assert not private, "give these a public name where they live:\n" + "\n".join(
        private
    )


def _cycles(graph: dict) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_between_modules():
    graph: dict[str, set] = {m: set() for m in MODULES}
    for m, t, _, _ in EDGES:
        if t == m or (m.startswith(t + ".") and _is_package(t)):
            # A module importing its own package's __init__ (where the
            # package's public names live) is Python's normal direction.
            continue
        graph[m].add(t)
    circles = _cycles(graph)
    assert not circles, f"import circles: {circles}"


def test_no_import_circle_between_layers():
    graph: dict[str, set] = {}
    for m, t, _, _ in EDGES:
        if _layer(m) != _layer(t):
            graph.setdefault(_layer(m), set()).add(_layer(t))
    assert not _cycles(graph), f"layers that need each other: {_cycles(graph)}"


@pytest.mark.parametrize("layer", ["runtime", "_validate", "_settings", "_deprecation"])
def test_lowest_layers_import_no_keras(layer):
    for module, path in MODULES.items():
        if _layer(module) != layer:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in {"keras", "tensorflow", "jax"}, (
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {name}"
                )
