"""Rewrites references to moved modules of keras_mpfp16 (issue 29) in a tree.

Usage:

    python tools/rewrite_moved_imports.py [--check] PATH [PATH ...]

Every `.py`, `.md`, `.yml`, `.toml`, `.sh`, `.txt` and `.cfg` file under the
given paths (files or folders; `.git`, `.venv`, `site` and `__pycache__`
skipped) is rewritten in place:

- Python imports of a moved module, in every spelling:
  `import keras_mpfp16.runtime.stall`,
  `from keras_mpfp16.runtime.stall import configure`,
  `from keras_mpfp16.runtime import env, stall as s, allreduce` (split into
  one statement per destination package; a renamed module keeps its local
  name with `as`, e.g. `from keras_mpfp16.runtime.process import
  launcher_env as launcher`, so the code below the import needs no change);
- any other dotted mention `keras_mpfp16.runtime.stall...` (strings such as
  `monkeypatch.setattr("keras_mpfp16.runtime.stall.x", ...)`, mkdocstrings'
  `::: keras_mpfp16.runtime.world.init`, prose).

`keras_mpfp16.runtime.launch` is rewritten in imports only: the command
`python -m keras_mpfp16.runtime.launch` keeps working (the module forwards
to the launch wrapper).

Afterwards, `ruff check --fix` sorts the rewritten imports. With `--check`,
nothing is written; the files that would change are listed
and the exit status is 1 if there are any.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

# Old dotted module path -> new one. Extend this table when modules move again.
MOVES: dict[str, str] = {
    # the settings registry, at the bottom of the package
    "keras_mpfp16.runtime.env": "keras_mpfp16._settings",
    # facts about this process before MPI starts
    "keras_mpfp16.runtime.launcher": "keras_mpfp16.runtime.process.launcher_env",
    "keras_mpfp16.runtime.threads": "keras_mpfp16.runtime.process.threads",
    "keras_mpfp16.runtime.gpus": "keras_mpfp16.runtime.process.gpus",
    # the MPI layer
    "keras_mpfp16.runtime.world": "keras_mpfp16.runtime.mpi.world",
    "keras_mpfp16.runtime.collectives": "keras_mpfp16.runtime.mpi.collectives",
    "keras_mpfp16.runtime.wire": "keras_mpfp16.runtime.mpi.wire",
    "keras_mpfp16.runtime.cuda": "keras_mpfp16.runtime.mpi.cuda",
    # tracing
    # (timeline.py was split into trace/windows, clocks, recorder, merge,
    # session; the trace package exports their names, so `timeline.Window`
    # reads as before through `from keras_mpfp16.runtime import trace as
    # timeline`)
    "keras_mpfp16.runtime.timeline": "keras_mpfp16.runtime.trace",
    "keras_mpfp16.runtime.trace.timeline": "keras_mpfp16.runtime.trace",
    "keras_mpfp16.runtime.scaling": "keras_mpfp16.runtime.trace.scaling",
    # supervision
    "keras_mpfp16.runtime.stall": "keras_mpfp16.runtime.supervision.stall",
    "keras_mpfp16.runtime.stall_messages": (
        "keras_mpfp16.runtime.supervision.stall_messages"
    ),
    "keras_mpfp16.runtime.stall_diagnosis": (
        "keras_mpfp16.runtime.supervision.stall_diagnosis"
    ),
    "keras_mpfp16.runtime.failure": "keras_mpfp16.runtime.supervision.failure",
    "keras_mpfp16.runtime.rendezvous": "keras_mpfp16.runtime.supervision.rendezvous",
    "keras_mpfp16.runtime.preemption": "keras_mpfp16.runtime.supervision.preemption",
    "keras_mpfp16.runtime.services": "keras_mpfp16.runtime.supervision.services",
    "keras_mpfp16.runtime.atomic_files": (
        "keras_mpfp16.runtime.supervision.atomic_files"
    ),
    "keras_mpfp16.runtime.launch": "keras_mpfp16.runtime.supervision.launch_wrapper",
    # Keras's console output by rank: no callback, so not in callbacks/
    "keras_mpfp16.callbacks.rank_output": "keras_mpfp16.rank_output",
}

# Moved, but the old path keeps working as a command
# (`python -m keras_mpfp16.runtime.launch`): only imports are rewritten.
IMPORTS_ONLY = {"keras_mpfp16.runtime.launch"}

SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".txt", ".cfg"}
SKIP_DIRS = {".git", ".venv", "venv", "site", "__pycache__", "node_modules"}

_DOTTED = re.compile(
    "|".join(
        re.escape(old)
        for old in sorted(MOVES, key=len, reverse=True)
        if old not in IMPORTS_ONLY
    )
    + r"(?![\w])"
)


# `from keras_mpfp16.runtime import world` inside a string or a code block
# (one name; the syntax tree handles the statements of a Python file).
_FROM_ONE = re.compile(
    r"\bfrom\s+(keras_mpfp16(?:\.\w+)*)\s+import\s+(\w+)(?:\s+as\s+(\w+))?(?![\w,(])"
)


def _rewrite_from_one(m: re.Match) -> str:
    if m.group(1) in IMPORTS_ONLY:  # `from keras_mpfp16.runtime.launch import x`
        return m.group(0).replace(m.group(1), MOVES[m.group(1)], 1)
    target = f"{m.group(1)}.{m.group(2)}"
    if target not in MOVES:
        return m.group(0)
    package, name = _split(MOVES[target])
    local = m.group(3) or m.group(2)
    return f"from {package} import {name if local == name else f'{name} as {local}'}"


def _rewrite_dotted(text: str) -> str:
    text = _FROM_ONE.sub(_rewrite_from_one, text)
    out, pos = [], 0
    for m in _DOTTED.finditer(text):
        start = m.start()
        if start and (text[start - 1].isalnum() or text[start - 1] == "_"):
            continue
        out.append(text[pos:start])
        out.append(MOVES[m.group(0)])
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def _split(dotted: str) -> tuple[str, str]:
    package, _, name = dotted.rpartition(".")
    return package, name


def _import_from(node: ast.ImportFrom, indent: str, comment: str = "") -> str | None:
    """The rewritten `from package import a, b` statement, or None if unchanged."""
    if node.level or not node.module:
        return None
    if node.module in IMPORTS_ONLY:  # `from keras_mpfp16.runtime.launch import x`
        names = ", ".join(
            a.name if not a.asname else f"{a.name} as {a.asname}" for a in node.names
        )
        return f"{indent}from {MOVES[node.module]} import {names}{comment}"
    groups: dict[str, list[str]] = {}
    changed = False
    for alias in node.names:
        target = f"{node.module}.{alias.name}"
        if target in MOVES:
            package, name = _split(MOVES[target])
            local = alias.asname or alias.name
            groups.setdefault(package, []).append(
                name if local == name else f"{name} as {local}"
            )
            changed = True
        else:
            groups.setdefault(node.module, []).append(
                alias.name if not alias.asname else f"{alias.name} as {alias.asname}"
            )
    if not changed:
        return None
    lines = []
    for package, names in groups.items():
        one = f"{indent}from {package} import {', '.join(names)}"
        if len(one + comment) <= 88:
            lines.append(one + comment)
        else:
            body = "".join(f"{indent}    {n},\n" for n in names)
            lines.append(f"{indent}from {package} import ({comment}\n{body}{indent})")
    return "\n".join(lines)


def rewrite_python(source: str) -> str:
    """Rewrites the imports (via the syntax tree), then any dotted mention."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return _rewrite_dotted(source)
    lines = source.splitlines(keepends=True)
    edits = []  # (first line, last line, replacement), 1-based inclusive
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            first = lines[node.lineno - 1]
            indent = first[: len(first) - len(first.lstrip())]
            found = re.search(r"\s*#\s*noqa.*$", first.rstrip("\r\n"))
            new = _import_from(
                node, indent, "  " + found.group(0).strip() if found else ""
            )
            if new is not None:
                edits.append((node.lineno, node.end_lineno, new))
    for first_line, last_line, new in sorted(edits, reverse=True):
        tail = lines[last_line - 1]
        ending = tail[len(tail.rstrip("\r\n")) :] or "\n"
        lines[first_line - 1 : last_line] = [new + ending]
    # `from keras_mpfp16.runtime.stall import x`, `import keras_mpfp16.runtime.x`
    # and strings: the dotted rewrite covers them.
    return _rewrite_dotted("".join(lines))


# A file that names the old paths on purpose (the modules left at them, the
# tests of the deprecations) carries this marker and is left alone.
SKIP_MARKER = "rewrite_moved_imports: skip"


def rewrite_file(path: Path) -> bool:
    """Rewrites one file in place; True if it changed."""
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return False
    if SKIP_MARKER in text:
        return False
    new = rewrite_python(text) if path.suffix == ".py" else _rewrite_dotted(text)
    if new == text:
        return False
    path.write_text(new)
    return True


def files(paths: list[Path]):
    for root in paths:
        if root.is_file():
            yield root
            continue
        for path in sorted(root.rglob("*")):
            if SKIP_DIRS & set(path.relative_to(root).parts):
                continue
            if path.is_file() and path.suffix in SUFFIXES:
                yield path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="list, write nothing")
    args = parser.parse_args(argv)
    this = Path(__file__).resolve()
    changed = []
    for path in files(args.paths):
        if path.resolve() == this:
            continue  # the table itself
        if args.check:
            text = path.read_text(errors="replace")
            if SKIP_MARKER in text:
                continue
            new = (
                rewrite_python(text) if path.suffix == ".py" else _rewrite_dotted(text)
            )
            if new != text:
                changed.append(path)
        elif rewrite_file(path):
            changed.append(path)
    for path in changed:
        print(path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
