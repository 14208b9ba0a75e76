"""Old module paths that keep working for one release, with a warning.

A module that moved leaves a small module at its old path whose attributes
come from the new one (PEP 562 `__getattr__`), each access raising a
`DeprecationWarning` that names what to use instead. Imports nothing of the
package at import time.
"""

# rewrite_moved_imports: skip (names 0.2's module paths on purpose)

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

REMOVED_IN = "0.4"


def moved_module(
    old: str, new: str, replacements: Mapping[str, str] | None = None
) -> Callable[[str], Any]:
    """The `__getattr__` of the module left at `old`.

    Args:
        old: the old module path, e.g. `"keras_mpfp16.runtime.world"`.
        new: where its code lives now, e.g. `"keras_mpfp16.runtime.mpi.world"`.
        replacements: `{name: what to use instead}` for the public names,
            e.g. `{"init": "keras_mpfp16.init"}`; other names point to `new`.

    Returns:
        A function to assign to the old module's `__getattr__`.
    """
    replacements = dict(replacements or {})

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name)
        instead = replacements.get(name, f"{new}.{name}")
        warnings.warn(
            f"{old}.{name} is deprecated and will be removed in {REMOVED_IN}; "
            f"use {instead}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__


def moved_names(
    package: str,
    names: Mapping[str, str],
    replacements: Mapping[str, str] | None = None,
) -> Callable[[str], Any]:
    """The `__getattr__` of a package whose `__all__` no longer lists `names`.

    Args:
        package: the package, e.g. `"keras_mpfp16.callbacks"`.
        names: `{name: the module that defines it}`; a name whose module is
            the name itself (`{"rank_output": "keras_mpfp16.callbacks.rank_output"}`)
            is that module.
        replacements: `{name: what to use instead}` for names that are
            public elsewhere; the others are called internal.

    Returns:
        A function to assign to the package's `__getattr__`.
    """
    replacements = dict(replacements or {})

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(names[name])
        if names[name].rsplit(".", 1)[-1] == name:
            return module
        if name in replacements:
            advice = f"use {replacements[name]}"
        else:
            advice = f"it is internal (use {names[name]}.{name} if you must)"
        warnings.warn(
            f"{package}.{name} is deprecated and will be removed in {REMOVED_IN}; "
            f"{advice}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(module, name)

    return __getattr__


__all__ = ["REMOVED_IN", "moved_module", "moved_names"]
