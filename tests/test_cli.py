"""The command lines behave as the ecosystem's do: `-h/--help` prints the
usage and the options and exits 0; a bad option is argparse's one-line error
and status 2; a launcher that cannot be found is one line naming it and
status 127 (126 when it cannot be executed), as a shell says; `python -m
keras_mpfp16 --help` lists every tool of the package. No mpirun is needed:
the launcher is `sh` or a missing name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KMP_LAUNCH = Path(sys.executable).parent / "kmp-launch"


def python_m(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m ARGS`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


def kmp_launch(*args: str) -> subprocess.CompletedProcess:
    assert KMP_LAUNCH.is_file(), f"{KMP_LAUNCH} missing: pip install -e . creates it"
    return subprocess.run(
        [sys.executable, str(KMP_LAUNCH), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_kmp_launch_help_prints_the_options_and_exits_0(flag):
    out = kmp_launch(flag)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr == ""
    text = out.stdout
    assert text.startswith("usage: kmp-launch "), text[:200]
    assert "--max-restarts K" in text
    # What it passes to the job and how it ends are documented.
    assert "KERAS_MPFP16_LAUNCH_VERDICT" in text
    assert "SIGTERM" in text
    for status in ("69", "127", "126"):
        assert re.search(rf"\b{status}\b", text), status


def test_module_form_help_names_itself():
    out = python_m("keras_mpfp16.runtime.launch", "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage: python -m keras_mpfp16.runtime.launch ")


def test_a_launchers_own_help_is_passed_to_the_launcher(tmp_path):
    """Everything from the launcher on is the launcher's, `--help` included."""
    out = kmp_launch("sh", "-c", 'echo "$@"', "sh", "--help", "--max-restarts", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "--help --max-restarts 1"


def test_a_missing_launcher_is_one_line_naming_it_and_exit_127():
    out = kmp_launch("mpirn", "-np", "2", "python", "train.py")
    assert out.returncode == 127, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "launcher 'mpirn' not found on PATH" in lines[0]
    assert "did you mean 'mpirun'?" in lines[0]
    assert lines[0].startswith("kmp-launch: ")

    by_path = kmp_launch("/nonexistent/dir/mpirun", "-np", "2", "true")
    assert by_path.returncode == 127
    assert by_path.stderr.strip() == (
        "kmp-launch: launcher '/nonexistent/dir/mpirun' not found"
    )


def test_a_launcher_that_cannot_be_executed_is_exit_126(tmp_path):
    # Executable bits (root may execute any file with one) but no format the
    # kernel can run, and no bits at all.
    garbage = tmp_path / "mpirun"
    garbage.write_bytes(b"\x00\x01\x02 not a program\n")
    garbage.chmod(0o755)
    plain = tmp_path / "plain"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    for program in (garbage, plain):
        out = kmp_launch(str(program), "-np", "2")
        assert out.returncode == 126, (program, out.returncode, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert repr(str(program)) in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-restarts", "two", "true"], "received 'two'"),
        (["--max-restarts=-1", "true"], "received '-1'"),
        ([], "the launch command is missing"),
        (["--"], "the launch command is missing"),
        (["-np", "2", "python", "x.py"], "unrecognized option '-np'"),
        (["--max", "1", "true"], "unrecognized option '--max'"),  # no abbreviations
    ],
)
def test_kmp_launch_bad_usage_is_argparse_style_exit_2(args, message):
    out = kmp_launch(*args)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("usage: kmp-launch "), out.stderr
    assert "kmp-launch: error: " in out.stderr
    assert message in out.stderr


def test_kmp_launch_runs_the_command_after_its_options():
    out = kmp_launch("--max-restarts=0", "--", "sh", "-c", "exit 5")
    assert out.returncode == 5, out.stderr[-2000:]


def test_python_m_keras_mpfp16_help_lists_every_tool():
    out = python_m("keras_mpfp16", "--help", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    from keras_mpfp16.__main__ import TOOLS

    assert set(TOOLS) >= {"doctor", "benchmark"}
    for name in TOOLS:
        assert re.search(rf"^  {name} ", out.stdout, re.M), (name, out.stdout)
    assert "kmp-launch" in out.stdout


def test_every_command_line_of_the_package_is_a_listed_tool():
    """A module of the package with a command line (`if __name__ ==
    "__main__"`, or a `main(argv)` behind one) is reached from `python -m
    keras_mpfp16`, except the launch wrapper (its own command: it must not
    load Keras)."""
    from keras_mpfp16.__main__ import TOOLS

    listed = {module for _, module in TOOLS.values()}
    own_command = {
        "keras_mpfp16.__main__",
        "keras_mpfp16.runtime.launch",
        "keras_mpfp16.runtime.supervision.launch_wrapper",
    }
    package = ROOT / "keras_mpfp16"
    with_cli = set()
    for path in package.rglob("*.py"):
        if 'if __name__ == "__main__"' in path.read_text():
            with_cli.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    with_cli.add("keras_mpfp16.doctor")  # run as `python -m keras_mpfp16 doctor`
    assert with_cli - own_command == listed


def test_python_m_keras_mpfp16_dispatches_and_rejects_like_argparse(capsys):
    from keras_mpfp16.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--help"])
    assert e.value.code == 0
    assert "{allreduce,train,overhead}" in capsys.readouterr().out

    for argv, message in (
        ([], "a COMMAND is required: one of doctor, benchmark"),
        (["doctr"], "invalid choice: 'doctr'"),
        (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
