"""The Keras patches, in one process: one installer, pass-through, opt-out.

`training.patches` installs every wrapper keras_mpfp16 puts on Keras; these
tests check the wrappers themselves (the multi-process behaviour they enable
is tested under mpirun elsewhere, `test_mpi_explicit_fit.py` among others).
"""

import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_mpfp16 as kmp
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.training import patches, sessions


@pytest.fixture(autouse=True)
def patched():
    yield
    kmp.install_keras_patches()  # every test leaves them installed


def _model(optimizer=None):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=optimizer or kmp.DistributedOptimizer("sgd"), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 1))


KERAS_ROWS = [r.name for r in patches.PATCHES if r.keras_patch]


def _keras_rows() -> dict[str, bool]:
    return {n: on for n, on in kmp.training.installed().items() if n in KERAS_ROWS}


def test_import_installs_every_patch():
    assert _keras_rows() == {
        "keras.Model.fit": True,
        "keras.Model.evaluate": True,
        "keras.Model.save": True,
        "keras.Model.save_weights": True,
        "model_supports_jit": True,
    }
    # installed() lists every row of the table.
    assert list(kmp.training.installed()) == [r.name for r in patches.PATCHES]


def test_install_is_idempotent():
    before = {name: getattr(keras.Model, name) for name in ("fit", "evaluate", "save")}
    assert kmp.install_keras_patches() is True
    assert kmp.install_keras_patches() is True
    after = {name: getattr(keras.Model, name) for name in before}
    assert after == before
    # One wrapper, not a wrapper of a wrapper.
    assert not getattr(keras.Model.fit.__wrapped__, "_keras_mpfp16_hook", False)


def test_uninstall_restores_keras_own_methods():
    kmp.uninstall_keras_patches()
    removable = [r.name for r in patches.PATCHES if r.uninstall is not None]
    assert not any(kmp.training.installed()[name] for name in removable)
    assert "fit" not in vars(keras.Model)  # Keras defines fit on its trainer
    assert "save" in vars(keras.Model)  # ... and save on Model itself
    assert not getattr(keras.Model.save, "_keras_mpfp16_hook", False)
    assert not keras_internals.model_supports_jit_wrapped()
    kmp.uninstall_keras_patches()  # idempotent
    kmp.install_keras_patches()
    assert all(_keras_rows().values())


def test_models_without_a_distributed_optimizer_pass_through(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the collective path ran for a plain model")

    monkeypatch.setattr(sessions, "fit_arguments", refuse)
    monkeypatch.setattr(sessions, "evaluate_arguments", refuse)
    x, y = _data()
    model = _model("sgd")
    patched = model.fit(x, y, epochs=2, verbose=0, shuffle=False).history
    logs = model.evaluate(x, y, verbose=0, return_dict=True)
    kmp.uninstall_keras_patches()
    model = _model("sgd")
    plain = model.fit(x, y, epochs=2, verbose=0, shuffle=False).history
    assert patched == plain
    assert model.evaluate(x, y, verbose=0, return_dict=True) == logs


def test_one_process_fit_is_keras_fit_for_every_entry_point():
    x, y = _data()
    ref = _model().fit(x, y, epochs=2, verbose=0, shuffle=False).history

    class Super(keras.Model):
        def fit(self, *args, **kwargs):
            with kmp.distributed_fit(self, *args, **kwargs) as fit_kwargs:
                return super().fit(**fit_kwargs)

    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    model = Super(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    assert model.fit(x, y, epochs=2, verbose=0, shuffle=False).history == ref

    model = _model()
    callbacks = keras.callbacks.CallbackList(add_history=True, model=model)
    assert (
        model.fit(x, y, epochs=2, verbose=0, shuffle=False, callbacks=callbacks).history
        == ref
    )


def test_distributed_fit_binds_to_keras_signature():
    x, y = _data()
    model = _model()
    with kmp.distributed_fit(model, x, y, epochs=3) as kwargs:
        assert kwargs["x"] is x and kwargs["y"] is y and kwargs["epochs"] == 3
        assert kwargs["batch_size"] is None  # Keras's defaults, applied
        assert "self" not in kwargs
        assert sessions.in_session(model)
    assert not sessions.in_session(model)
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'"):
        with kmp.distributed_fit(model, x, y, epoch=3):
            pass


def test_keras_patch_opt_out_at_import():
    code = (
        "import keras, keras_mpfp16 as kmp\n"
        "from keras_mpfp16.training.patches import ROWS\n"
        "print([on for n, on in kmp.training.installed().items()"
        " if ROWS[n].keras_patch])\n"
        "print('fit' in vars(keras.Model))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "KERAS_MPFP16_PATCH_KERAS": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert "True" not in lines[-2], lines
    assert lines[-1] == "False"


def test_patch_table_lists_every_patch():
    # The module docstring is the reference of what is patched.
    for name, _ in patches._METHODS:
        assert (
            f"`keras.Model.{name}`" in patches.__doc__ or f"`{name}`" in patches.__doc__
        )
    assert "model_supports_jit" in patches.__doc__
    # ... and names every row of the table.
    for row in patches.PATCHES:
        assert f"`{row.name}`" in patches.__doc__ or row.name.startswith(
            "keras.Model.save"
        ), row.name


# What `import keras_mpfp16` changes, seen from outside: run in a fresh
# interpreter, the state of Keras, TensorFlow and the process before and after
# the import (Keras imported first, so the bootstrap runs at the import).
IMPORT_CHANGES = r"""
import atexit, json, logging, os, signal, sys, threading, types, warnings
import keras
import tensorflow as tf

def loggers():
    out = {}
    for name, lg in [("", logging.getLogger())] + sorted(
        logging.Logger.manager.loggerDict.items()
    ):
        if isinstance(lg, logging.Logger):
            out[f"logging {name or 'root'}"] = repr(
                (lg.level, [id(h) for h in lg.handlers], lg.propagate, lg.disabled)
            )
    return out

def snapshot(modules):
    state = {}
    for name in modules:
        module = sys.modules.get(name)
        if not isinstance(module, types.ModuleType):
            continue
        for attr, value in list(vars(module).items()):
            state[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                prefix = "keras.Model" if value is keras.Model else (
                    f"{name}.{value.__qualname__}")
                for key, member in list(vars(value).items()):
                    state[f"{prefix}.{key}"] = id(member)
    for key in dir(keras.Model):  # inherited too: a wrapper set on the class
        state[f"keras.Model.{key}"] = id(vars(keras.Model).get(key, None))
    state["keras.config.is_interactive_logging_enabled()"] = (
        keras.config.is_interactive_logging_enabled())
    for key, value in os.environ.items():
        state[f"os.environ[{key}]"] = value
    stat = os.fstat(1)
    state["fd 1"] = repr((stat.st_dev, stat.st_ino))
    state["sys.stdout"] = id(sys.stdout)
    state["sys.stderr"] = id(sys.stderr)
    state["sys.excepthook"] = id(sys.excepthook)
    state["threading.excepthook"] = id(threading.excepthook)
    state["sys.exit"] = id(sys.exit)
    state["atexit"] = atexit._ncallbacks()
    state["sys.meta_path"] = repr([id(f) for f in sys.meta_path])
    state["sys.path_hooks"] = repr([id(f) for f in sys.path_hooks])
    state["warnings.filters"] = repr(warnings.filters)
    for sig in ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP"):
        state[f"signal {sig}"] = id(signal.getsignal(getattr(signal, sig)))
    state.update(loggers())
    return state

modules = sorted(
    n for n in sys.modules if n.split(".")[0] in ("keras", "tensorflow")
)
before = snapshot(modules)
import keras_mpfp16
from keras_mpfp16.training import patches
after = snapshot(modules)
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
with open(sys.argv[1], "w") as f:
    json.dump({"changed": changed, "installed": patches.installed(),
               "targets": {r.name: list(r.targets) for r in patches.PATCHES}}, f)
"""

NON_ROOT = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def _import_changes(tmp_path, env):
    out_path = tmp_path / "changes.json"
    base = {
        k: v
        for k, v in __import__("os").environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "KERAS_MPFP16_"))
        and k
        not in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
    }
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_CHANGES, str(out_path)],
        env={**base, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return __import__("json").loads(out_path.read_text())


@pytest.mark.parametrize(
    "env",
    [
        {},
        NON_ROOT,
        {**NON_ROOT, "KERAS_MPFP16_ROOT_STDOUT_ONLY": "1"},
        {**NON_ROOT, "KERAS_MPFP16_PATCH_KERAS": "0"},
    ],
    ids=["one process", "rank 1 of 2", "rank 1, root stdout only", "rank 1, no patch"],
)
def test_the_patch_table_names_everything_import_changes(tmp_path, env):
    """Every change `import keras_mpfp16` makes (Keras's and TensorFlow's
    module and class attributes, keras.Model, Keras's logging flag, logging,
    stdout, the environment, hooks, signals) is a target of a row installed
    now; every row installed at import shows among the changes."""
    got = _import_changes(tmp_path, env)
    owner = {t: name for name, targets in got["targets"].items() for t in targets}
    # The package's own loggers (`logging.getLogger("keras_mpfp16...")`) are
    # its own objects; any other logger's level or handlers would count.
    changed = [c for c in got["changed"] if not c.startswith("logging keras_mpfp16")]
    unlisted = [c for c in changed if c not in owner]
    assert not unlisted, f"changed by import, in no row of PATCHES: {unlisted}"
    not_installed = sorted(
        {owner[c] for c in changed} - {n for n, on in got["installed"].items() if on}
    )
    assert not not_installed, f"changed, but installed() says no: {not_installed}"
    unseen = [
        name
        for name, on in got["installed"].items()
        if on and not set(got["targets"][name]) & set(changed)
    ]
    assert not unseen, f"installed() says yes, but nothing changed: {unseen}"
    on = {name for name, value in got["installed"].items() if value}
    keras_rows = {r.name for r in patches.PATCHES if r.keras_patch}
    if env.get("KERAS_MPFP16_PATCH_KERAS") == "0":
        assert not on & keras_rows
    else:
        assert keras_rows <= on
    assert ("keras.interactive_logging_gate" in on) == (env != {})
    assert ("environment.thread_defaults" in on) == (env != {})
    assert ("sys.stdout" in on) == ("KERAS_MPFP16_ROOT_STDOUT_ONLY" in env)


def test_a_bare_import_then_keras_installs_the_same_rows():
    """`import keras_mpfp16` before Keras (the bootstrap at `import keras`):
    the same rows as Keras first, plus the audit hook that waited for it."""
    code = (
        "import keras_mpfp16, keras\n"
        "from keras_mpfp16.training import patches\n"
        "print(sorted(n for n, on in patches.installed().items() if on))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3", **NON_ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == str(
        sorted(
            [
                "environment.thread_defaults",
                "import_audit_hook",
                "keras.interactive_logging_gate",
                *(r.name for r in patches.PATCHES if r.keras_patch),
            ]
        )
    )


def test_every_row_says_why_and_how_it_ends():
    assert len({r.name for r in patches.PATCHES}) == len(patches.PATCHES)
    for row in patches.PATCHES:
        assert row.targets and row.reason and row.when and row.left_out_by, row
        # A row that cannot be removed says why it stays.
        assert (row.uninstall is not None) or row.reason_kept, row.name
        assert (row.install is not None) == (row.uninstall is not None) or (
            row.name == "keras.interactive_logging_gate"
        )
    # What KERAS_MPFP16_PATCH_KERAS=0 leaves out: the Keras-wide patches.
    assert [r.name for r in patches.PATCHES if r.keras_patch] == [
        "keras.Model.fit",
        "keras.Model.evaluate",
        "keras.Model.save",
        "keras.Model.save_weights",
        "model_supports_jit",
    ]
