"""The public API: what `__all__` exports, and that the API page documents it.

Every `::: name` in docs/api.md must be exported: in `keras_mpfp16.__all__`,
or in the `__all__` of the module it is documented under or of one of that
module's parents. `__all__` of the top level and of `runtime` list only what
users call (no submodules of internals, no validators).
"""

import importlib
import re
import types
from pathlib import Path

import pytest

import keras_mpfp16

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
DOCUMENTED = re.findall(r"^::: (\S+)", API_PAGE.read_text(), re.M)


@pytest.mark.parametrize("full", DOCUMENTED)
def test_documented_names_are_exported(full):
    parts = full.split(".")
    leaf = parts[-1]
    exporters = [".".join(parts[:i]) for i in range(1, len(parts))]
    found = leaf in keras_mpfp16.__all__
    for name in exporters:
        module = importlib.import_module(name)
        if leaf in getattr(module, "__all__", ()):
            found = True
    assert found, f"docs/api.md documents {full}, which no __all__ exports"


@pytest.mark.parametrize("package", ["keras_mpfp16", "keras_mpfp16.runtime"])
def test_every_exported_name_exists(package):
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing


def test_runtime_exports_no_modules_or_internals():
    runtime = keras_mpfp16.runtime
    modules = [
        n for n in runtime.__all__ if isinstance(getattr(runtime, n), types.ModuleType)
    ]
    assert not modules
    assert not {"validate_op", "validate_wire_dtype", "allreduce_flat"} & set(
        runtime.__all__
    )


def test_top_level_exports_the_explicit_path():
    for name in ("distributed_fit", "distributed_evaluate", "install_keras_patches"):
        assert name in keras_mpfp16.__all__


def test_names_documented_in_0_2_still_resolve():
    # runtime.world.barrier moved to runtime.collectives: a deprecated alias.
    from keras_mpfp16.runtime.mpi import world

    with pytest.warns(DeprecationWarning, match=r"keras_mpfp16\.barrier\(\)"):
        world.barrier()  # one process: returns at once
