"""The settings registry (`runtime.env`), `kmp.config` and docs/configuration.md.

Every `KERAS_MPFP16_*` name in the package (and in the docs) must be
registered; the reference page must be what the registry generates; each
setting's value must come from `kmp.config.set`, else the environment, else
the default, with a clear error for a bad value.
"""

import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

import keras_mpfp16 as kmp
from keras_mpfp16 import _settings as env
from keras_mpfp16 import rank_output
from keras_mpfp16.backend import tf_sparse
from keras_mpfp16.runtime.mpi import cuda
from keras_mpfp16.runtime.supervision import failure, rendezvous

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"KERAS_MPFP16_[A-Z0-9_]*[A-Z0-9]")
# Variables of the test suite and the benchmark harness, not of the package.
NOT_SETTINGS = {"KERAS_MPFP16_EEG"}


@pytest.fixture(autouse=True)
def clean_settings(monkeypatch):
    for s in env.settings():
        monkeypatch.delenv(s.name, raising=False)
    env.reset()
    yield
    env.reset()


def names_in(paths):
    found = {}
    for path in paths:
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, path.relative_to(ROOT))
    return found


def test_every_name_the_package_mentions_is_registered():
    found = names_in(sorted((ROOT / "keras_mpfp16").rglob("*.py")))
    registered = {s.name for s in env.settings()}
    missing = {n: str(p) for n, p in found.items() if n not in registered}
    assert not missing, f"not registered in keras_mpfp16/runtime/env.py: {missing}"
    # ... and every registered one is read somewhere.
    sources = "".join(
        p.read_text()
        for p in (ROOT / "keras_mpfp16").rglob("*.py")
        if p.name != "env.py"
    )
    unread = [s.key for s in env.settings() if f'"{s.key}"' not in sources]
    assert not unread, f"registered but never read with env.get: {unread}"


def test_every_name_the_docs_mention_is_registered():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    registered = {s.name for s in env.settings()} | NOT_SETTINGS
    missing = {n: str(p) for n, p in names_in(pages).items() if n not in registered}
    assert not missing, f"documented but not a setting: {missing}"


def test_configuration_page_is_generated_from_the_registry(tmp_path):
    tool = ROOT / "tools" / "configuration_doc.py"
    run = [sys.executable, str(tool)]
    ok = subprocess.run([*run, "--check"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    page = tmp_path / "configuration.md"
    text = (ROOT / "docs" / "configuration.md").read_text()
    page.write_text(text.replace("`60`", "`600`", 1))
    stale = subprocess.run(
        [*run, "--check", "--page", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stale.returncode == 1 and "out of date" in stale.stderr
    subprocess.run(
        [*run, "--page", str(page)], check=True, capture_output=True, timeout=300
    )
    assert page.read_text() == text


def test_values_come_from_python_then_environment_then_default(monkeypatch):
    assert kmp.config.get("evaluate_wait") == 5.0
    monkeypatch.setenv("KERAS_MPFP16_EVALUATE_WAIT", "12.5")
    assert kmp.config.get("EVALUATE_WAIT") == 12.5
    assert env.source("evaluate_wait") == "KERAS_MPFP16_EVALUATE_WAIT=12.5"
    kmp.config.set("evaluate_wait", 30)
    assert kmp.config.get("KERAS_MPFP16_EVALUATE_WAIT") == 30.0
    assert rendezvous._wait_seconds() == 30.0  # what init() reads
    assert kmp.config.settings()["evaluate_wait"] == 30.0
    kmp.config.reset("evaluate_wait")
    assert kmp.config.get("evaluate_wait") == 12.5
    kmp.config.set("evaluate_wait", "7")  # the variable's text works too
    assert kmp.config.get("evaluate_wait") == 7.0
    kmp.config.set("evaluate_wait", None)
    assert kmp.config.get("evaluate_wait") == 12.5


@pytest.mark.parametrize("word", ["1", "true", "YES", " on "])
def test_one_truthy_parser_for_every_bool(monkeypatch, word):
    for s in env.settings():
        if s.type == "bool":
            monkeypatch.setenv(s.name, word)
            assert env.get(s.key) is True, s.name
            monkeypatch.setenv(
                s.name,
                word.replace("1", "0")
                .replace("true", "false")
                .replace("YES", "no")
                .replace("on", "off"),
            )
            assert env.get(s.key) is False, s.name
            monkeypatch.setenv(s.name, "")
            assert env.get(s.key) == s.default, s.name  # empty = unset


def test_readers_follow_the_registry(monkeypatch):
    assert failure.enabled_by_env() is True
    monkeypatch.setenv("KERAS_MPFP16_ABORT_ON_EXCEPTION", "off")
    assert failure.enabled_by_env() is False
    assert rank_output._all_ranks_requested() is False
    kmp.config.set("all_ranks_output", True)
    assert rank_output._all_ranks_requested() is True
    assert tf_sparse.sparse_mode() == "auto"
    kmp.config.set("sparse_gradients", "Dense")
    assert tf_sparse.sparse_mode() == "dense"
    assert tf_sparse.sparse_mode("sparse") == "sparse"  # the argument wins
    kmp.config.set("cuda_aware", False)
    aware, why = cuda.detection()
    assert aware is False and why.startswith(cuda.ENV_OVERRIDE)


def test_all_ranks_output_set_from_python_undoes_the_import_time_silence(
    monkeypatch,
):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    try:
        assert rank_output.quiet_non_root_ranks_early() is True
        kmp.config.set("all_ranks_output", True)
        assert rank_output.quiet_non_root_ranks() is False
        assert keras.config.is_interactive_logging_enabled()
    finally:
        keras.config.enable_interactive_logging()
        rank_output._silenced_by_us = False


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "ALL_RANKS_OUTPUT",
            "2",
            r"KERAS_MPFP16_ALL_RANKS_OUTPUT='2' is not understood; use 1 or 0",
        ),
        ("STALL_TIMEOUT", "soon", r"KERAS_MPFP16_STALL_TIMEOUT='soon' is not a number"),
        (
            "STALL_ABORT",
            "-1",
            r"KERAS_MPFP16_STALL_ABORT must be >= 0 seconds; received '-1'",
        ),
        ("SPARSE_GRADIENTS", "some", r"allowed values are auto, dense, sparse"),
        ("THREADS", "many", r"KERAS_MPFP16_THREADS='many' is not understood"),
    ],
)
def test_bad_environment_values_name_the_variable(monkeypatch, name, text, message):
    monkeypatch.setenv(env.PREFIX + name, text)
    with pytest.raises(ValueError, match=message):
        env.get(name)


def test_bad_python_values_and_names_are_refused():
    with pytest.raises(
        ValueError, match="Unknown keras_mpfp16 setting 'evaluate_wiat'"
    ):
        kmp.config.get("evaluate_wiat")
    with pytest.raises(ValueError, match=r"1.5 \(float\). Expected True or False"):
        kmp.config.set("abort_on_exception", 1.5)
    with pytest.raises(
        ValueError, match="Invalid value for KERAS_MPFP16_EVALUATE_WAIT"
    ):
        kmp.config.set("evaluate_wait", True)
    with pytest.raises(ValueError, match=r"must be >= 0 seconds; received -2"):
        kmp.config.set("stall_timeout", -2)
    with pytest.raises(ValueError, match="read at import, before Python code"):
        kmp.config.set("threads", "off")
    assert kmp.config.settings()["stall_timeout"] == 60.0  # nothing was set


def test_registering_a_setting_is_one_call(monkeypatch):
    s = env.register("TEST_ONLY_FLAG", "bool", False, read="per call", doc="A test.")
    try:
        assert (
            s.name == "KERAS_MPFP16_TEST_ONLY_FLAG"
            and env.get("test_only_flag") is False
        )
        monkeypatch.setenv(s.name, "1")
        assert env.get("TEST_ONLY_FLAG") is True
        assert "`KERAS_MPFP16_TEST_ONLY_FLAG`" in env.markdown()
        with pytest.raises(ValueError, match="registered twice"):
            env.register("TEST_ONLY_FLAG", "bool", False, read="per call", doc="")
        with pytest.raises(ValueError, match="Allowed: bool, float"):
            env.register("TEST_ONLY_BAD", "list", (), read="per call", doc="")
    finally:
        env._registry.pop("TEST_ONLY_FLAG")
