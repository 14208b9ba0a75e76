"""The package's modules as files, and what a process imported: for the tests
that read the source (test_layering, test_front_door) or check that a command
stays light (no Keras, TensorFlow or mpi4py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_mpfp16"

# What a light process (the launch wrapper, a `--help`) must not import.
HEAVY = ("keras", "tensorflow", "mpi4py")


def module_name(path: Path) -> str:
    """`keras_mpfp16/runtime/__init__.py` -> `keras_mpfp16.runtime`."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


# {module name: its file}, every module of the package.
MODULES = {
    module_name(p): p
    for p in sorted(PACKAGE.rglob("*.py"))
    if "__pycache__" not in p.parts
}


def imported_modules(importtime_stderr: str) -> set[str]:
    """The modules a `python -X importtime ...` process imported, read from
    its standard error."""
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in importtime_stderr.splitlines()
        if line.startswith("import time:")
    }


def heavy_modules(imported: set[str]) -> list[str]:
    """The `HEAVY` ones among `imported` (and their submodules), sorted."""
    return sorted(m for m in imported if m.split(".")[0] in HEAVY)
