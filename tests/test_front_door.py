"""One front door: the package's import-time work and who imports the facades.

- No module of the package imports the public facades (`keras_mpfp16`
  itself, `keras_mpfp16.runtime`) except the facades' own modules: library
  code imports the sub-packages it uses (read from the source, imports inside
  functions included).
- `keras_mpfp16._bootstrap.bootstrap()` runs its named steps once, in order,
  and the processes that need no Keras (the launch wrapper) load none of it,
  however Python was started; what `import keras_mpfp16` promised users
  (Keras objects registered for `load_model`, the patches in place, the
  thread defaults before TensorFlow starts) still holds, each checked in a
  fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from package_tree import MODULES, ROOT, heavy_modules, imported_modules

FACADES = {"keras_mpfp16", "keras_mpfp16.runtime"}
# The facades' own modules: the package's `__init__` and its names (`_api`),
# the runtime's `__init__`.
FACADE_MODULES = {"keras_mpfp16", "keras_mpfp16._api", "keras_mpfp16.runtime"}


def facade_imports(module: str, source: str) -> list[str]:
    """`line: statement` for each import of a facade (not of its submodules)."""
    path = MODULES.get(module)
    is_package = path is not None and path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import keras_mpfp16.runtime.mpi.world` names a submodule;
                # `import keras_mpfp16` / `import keras_mpfp16.runtime` a facade.
                if alias.name in FACADES:
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin not in FACADES:
                continue
            for alias in node.names:
                if f"{origin}.{alias.name}" in MODULES:
                    if f"{origin}.{alias.name}" in FACADES:  # `import runtime`
                        found.append(
                            f"{node.lineno}: from {origin} import {alias.name}"
                        )
                    continue  # a submodule: `from keras_mpfp16 import _settings`
                if alias.name == "__version__":
                    continue  # the version, not the API (`--version`, doctor)
                found.append(f"{node.lineno}: from {origin} import {alias.name}")
    return found


def test_no_library_module_imports_a_public_facade():
    offenders = [
        f"{MODULES[m].relative_to(ROOT)}:{line}"
        for m in sorted(MODULES)
        if m not in FACADE_MODULES
        for line in facade_imports(m, MODULES[m].read_text())
    ]
    assert not offenders, (
        "import the sub-package (keras_mpfp16.runtime.mpi.world, ...), "
        "not the facade:\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from keras_mpfp16 import runtime", 1),
        ("from keras_mpfp16 import _validate, runtime", 1),
        ("import keras_mpfp16", 1),
        ("from keras_mpfp16 import shard", 1),
        ("from keras_mpfp16.runtime import allreduce", 1),
        ("def f():\n    from keras_mpfp16 import runtime\n", 1),
        ("from .. import runtime", 1),
        ("from keras_mpfp16.runtime import trace, progress", 0),
        ("from keras_mpfp16.runtime.mpi import world", 0),
        ("import keras_mpfp16.runtime.mpi.world", 0),
        ("from keras_mpfp16 import _settings as env", 0),
        ("from keras_mpfp16 import __version__", 0),
    ],
)
def test_the_facade_check_sees_each_form(source, expected):
    """The check itself: each way of reaching a facade is seen, submodules
    are not (as from a module of `keras_mpfp16.training`)."""
    assert len(facade_imports("keras_mpfp16.training.run", source)) == expected


def run_python(code: str, env: dict | None = None, timeout: int = 300) -> list:
    """Runs `code` in a fresh interpreter; its last stdout line, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_bootstrap_steps_are_named_and_ordered():
    from keras_mpfp16 import _bootstrap

    assert [name for name, _ in _bootstrap.STEPS] == ["root_stdout_only", *AFTER_IMPORT]


# The steps run at the first trigger after `import keras_mpfp16`, in order
# (`root_stdout_only` runs at the import line itself).
AFTER_IMPORT = [
    "thread_defaults",
    "gpu_binding",
    "seam_check",
    "quiet_non_root_ranks",
    "public_api",
    "keras_patches",
]


STEP_RECORDER = """
import json, sys
import keras_mpfp16
from keras_mpfp16 import _bootstrap as b
calls = []
def recorded(name, step):
    def run():
        calls.append((name, 'tensorflow' in sys.modules))
        step()
    return run
b.STEPS = tuple((name, recorded(name, step)) for name, step in b.STEPS)
before = sorted(m for m in ('keras', 'tensorflow', 'mpi4py') if m in sys.modules)
"""


def test_bootstrap_runs_each_step_once_in_order_at_the_first_keras_import():
    """`import keras_mpfp16` loads nothing heavy; `import keras` runs the
    steps in order, the first two before TensorFlow loads; later triggers
    (a public name, `bootstrap()` again, a Keras-facing module) run none."""
    got = run_python(
        STEP_RECORDER
        + "import keras\n"
        + "first = list(calls)\n"
        + "keras_mpfp16.shard; b.bootstrap(); import keras_mpfp16.layers\n"
        + "print(json.dumps([before, first, len(calls), b.completed]))\n"
    )
    before, first, calls, completed = got
    names = [name for name, _ in first]
    assert before == []
    # root_stdout_only ran at `import keras_mpfp16` itself (AT_IMPORT).
    assert names == AFTER_IMPORT
    assert completed == ["root_stdout_only", *names] and calls == len(names)
    tf_loaded = dict(first)
    assert not tf_loaded["thread_defaults"] and not tf_loaded["gpu_binding"]


@pytest.mark.parametrize(
    "trigger",
    [
        "keras_mpfp16.shard",  # a public name
        "import keras_mpfp16.layers",  # a Keras-facing module
        "import tensorflow",
        "from keras_mpfp16 import *",
    ],
)
def test_every_trigger_runs_the_whole_bootstrap(trigger):
    got = run_python(
        STEP_RECORDER
        + f"{trigger}\n"
        + "print(json.dumps([before, [n for n, _ in calls], b.done()]))\n"
    )
    assert got[0] == [] and got[2] is True
    assert got[1] == [name for name, _ in _steps()][1:]  # after AT_IMPORT


def test_import_after_keras_runs_the_bootstrap_at_once():
    got = run_python(
        "import json, keras, keras_mpfp16\n"
        "from keras_mpfp16 import _bootstrap as b\n"
        "print(json.dumps([b.completed, keras_mpfp16.installed_keras_patches()"
        "['keras.Model.fit']]))\n"
    )
    assert got == [[name for name, _ in _steps()], True]


def _steps():
    from keras_mpfp16 import _bootstrap

    return _bootstrap.STEPS


def test_light_imports_load_nothing_heavy_and_run_only_the_import_step():
    got = run_python(
        "import json, sys\n"
        "import keras_mpfp16 as kmp\n"
        "import keras_mpfp16.runtime.launch, keras_mpfp16.config\n"
        "from keras_mpfp16.runtime.supervision import launch_wrapper\n"
        "from keras_mpfp16 import _settings, runtime\n"
        "from keras_mpfp16._bootstrap import completed\n"
        "print(json.dumps([sorted(m for m in ('keras', 'tensorflow', 'mpi4py')"
        " if m in sys.modules), completed, kmp.__version__]))\n"
    )
    assert got[:2] == [[], ["root_stdout_only"]] and got[2]


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "keras_mpfp16.runtime.launch", "--help"],
        [str(Path(sys.executable).parent / "kmp-launch"), "-h"],
        ["-m", "keras_mpfp16", "--help"],
    ],
    ids=[
        "python -m keras_mpfp16.runtime.launch",
        "kmp-launch",
        "python -m keras_mpfp16",
    ],
)
def test_command_line_help_imports_no_keras_tensorflow_or_mpi4py(command):
    """Seen with -X importtime: every module the process imported."""
    if command[0].endswith("kmp-launch") and not Path(command[0]).is_file():
        pytest.fail(f"{command[0]} missing: pip install -e . creates it")
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage:"), out.stdout[:200]
    imported = imported_modules(out.stderr)
    assert "keras_mpfp16" in imported
    assert not heavy_modules(imported), heavy_modules(imported)


SAVE_MODEL = """
import sys
import numpy as np
import keras
import keras_mpfp16 as kmp

model = keras.Sequential([keras.Input((4, 3)), kmp.layers.LSTM(5), keras.layers.Dense(1)])
model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss="mse")
model.fit(np.zeros((8, 4, 3)), np.zeros((8, 1)), epochs=1, verbose=0)
model.save(sys.argv[1])
"""


def test_bare_import_then_keras_loads_a_file_naming_the_packages_objects(tmp_path):
    """`import keras_mpfp16` and nothing else of it, then Keras: the file's
    `DistributedOptimizer` and kmp LSTM load (registered, as in 0.2)."""
    path = tmp_path / "m.keras"
    saved = subprocess.run(
        [sys.executable, "-c", SAVE_MODEL, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    got = run_python(
        "import json\n"
        "import keras_mpfp16\n"
        "import keras\n"
        f"model = keras.saving.load_model({str(path)!r})\n"
        "print(json.dumps([type(model.optimizer).__name__,"
        " type(model.layers[0]).__module__]))\n"
    )
    assert got == ["DistributedOptimizer", "keras_mpfp16.layers.lstm"]


@pytest.mark.parametrize("patch, expected", [("1", True), ("0", False)])
def test_bare_import_then_keras_has_the_patches_unless_opted_out(patch, expected):
    got = run_python(
        "import json\n"
        "import keras_mpfp16\n"
        "import keras\n"
        "from keras_mpfp16.training import model_hooks\n"
        "print(json.dumps(getattr(keras.Model.fit, model_hooks.MARK, False)))\n",
        env={"KERAS_MPFP16_PATCH_KERAS": patch},
    )
    assert got is expected


def test_root_stdout_only_applies_at_the_import_line_itself():
    """`KERAS_MPFP16_ROOT_STDOUT_ONLY=1` on a rank other than 0: a `print`
    right after `import keras_mpfp16` is already gone (as in 0.2), and the
    import loaded nothing heavy for it."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "import keras_mpfp16\n"
            "print('HIDDEN', flush=True)\n"
            "sys.stderr.write(repr(sorted(m for m in ('keras', 'tensorflow', "
            "'mpi4py') if m in sys.modules)))\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "2",
            "KERAS_MPFP16_ROOT_STDOUT_ONLY": "1",
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == ""
    assert out.stderr.strip().endswith("[]"), out.stderr[-2000:]
