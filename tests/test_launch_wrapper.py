"""The launch wrapper passes the verdict file's variable the way the
launcher takes it: Open MPI's `-x VAR`; `-genv VAR VALUE` for MPICH / Intel
MPI's Hydra `mpiexec` (it rejects `-x`); nothing added for an unknown
launcher. Stand-in launchers (shell scripts named `mpiexec` answering
`--version` as the real ones do) record their arguments; the real launcher
beside this Python (Open MPI's, or Hydra's in the `mpich` end) is checked
too. Host lists are rewritten in Open MPI's and Hydra's forms."""

from __future__ import annotations

import sys

import pytest

from keras_mpfp16.runtime.supervision import launch_wrapper

VERSIONS = {
    "open-mpi": "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/",
    "hydra": "HYDRA build details:\n    Version:                                 4.1.2\n",
    "intel": "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 "
    "(id: b44796a)\nCopyright 2003-2026, Intel Corporation.\n",
    "other": "some launcher 1.0\n",
}


def _stand_in(tmp_path, version: str):
    record = tmp_path / "argv"
    script = tmp_path / "mpiexec"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then cat <<"EOF"\n'
        f"{version.rstrip()}\nEOF\nexit 0; fi\n"
        f'printf "%s\\n" "$@" > {record}\n'
        f'[ -n "${launch_wrapper.VERDICT_ENV}" ] && echo env-set >> {record}\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return script, record


@pytest.mark.parametrize("kind", ["open-mpi", "hydra", "intel", "other"])
def test_verdict_variable_is_passed_as_the_launcher_takes_it(tmp_path, kind):
    script, record = _stand_in(tmp_path, VERSIONS[kind])
    expected = "hydra" if kind == "intel" else kind
    assert launch_wrapper.launcher_kind(str(script)) == expected
    assert launch_wrapper.run([str(script), "-np", "2", "python", "x.py"]) == 0
    args = record.read_text().split("\n")
    if kind == "open-mpi":
        assert args[:2] == ["-x", launch_wrapper.VERDICT_ENV], args
    elif expected == "hydra":
        assert args[:2] == ["-genv", launch_wrapper.VERDICT_ENV], args
        assert args[2].endswith("/verdict") and args[3:5] == ["-np", "2"], args
        assert "-x" not in args, args
    else:
        assert "-x" not in args and "-genv" not in args, args
        assert args[:2] == ["-np", "2"], args
    # The launcher's own environment has it either way (Hydra and srun pass
    # their environment on to the ranks).
    assert "env-set" in args


def test_the_real_mpirun_is_known():
    from mpi_launch import mpi_kind, mpirun_path

    kind = mpi_kind()  # the test helper's own reading
    assert kind in ("open-mpi", "hydra")
    assert launch_wrapper.launcher_kind(mpirun_path()) == kind
    assert launch_wrapper.launcher_kind(sys.executable) == "other"
    assert launch_wrapper.launcher_kind("/nonexistent/mpiexec") == "other"


def test_restarts_on_a_signal_or_a_lost_node_never_on_an_exception(tmp_path):
    """`run(..., max_restarts=K)` with stand-in launchers (sh): status 1 (a
    Python exception) is not retried; a launcher killed by a signal is run
    again as it was; a lost node's verdict drops the host and lowers -np."""
    count = tmp_path / "count"

    def runs():
        return len(count.read_text().splitlines()) if count.exists() else 0

    failing = f"echo run >> {count}; exit 1"
    assert launch_wrapper.run(["sh", "-c", failing], max_restarts=2) == 1
    assert runs() == 1
    count.unlink()
    marker = tmp_path / "marker"
    killed_once = (
        f"echo run >> {count}; [ -e {marker} ] && exit 0; touch {marker}; kill -KILL $$"
    )
    assert launch_wrapper.run(["sh", "-c", killed_once], max_restarts=1) == 0
    assert runs() == 2
    count.unlink()
    always_killed = f"echo run >> {count}; kill -KILL $$"
    assert launch_wrapper.run(["sh", "-c", always_killed], max_restarts=2) == 137
    assert runs() == 3


def test_lost_hosts_are_dropped_from_the_host_list_and_the_size(tmp_path):
    verdict = (
        "keras_mpfp16 error (rank 0 on host n1 watching 3 ranks): rank 2 (host n3) "
        "is unreachable: nothing heard for 30s\n  rank 0 (host n1): waiting"
    )
    assert launch_wrapper.lost_hosts(verdict) == ["n3"]
    assert (
        launch_wrapper.lost_hosts(
            "keras_mpfp16 error (rank 2 on host n3): rank 0 (host n1) is unreachable "
            "from rank 2 (host n3)"
        )
        == []
    )
    argv = ["mpirun", "-np", "6", "--host", "n1:2,n2:2,n3:2", "python", "t.py"]
    out, dropped = launch_wrapper.without_hosts(argv, ["n3"])
    assert out == ["mpirun", "-np", "4", "--host", "n1:2,n2:2", "python", "t.py"]
    assert dropped == 2
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    out, dropped = launch_wrapper.without_hosts(
        ["mpirun", "-n", "6", "--hostfile", str(hostfile), "python", "t.py"], ["n2"]
    )
    assert dropped == 2 and out[2] == "4"
    assert open(out[4]).read() == "n1 slots=2\nn3 slots=2\n"
    assert launch_wrapper.without_hosts(argv, ["elsewhere"]) == (argv, 0)


def test_hydra_host_lists_are_rewritten_too(tmp_path):
    """Hydra's (MPICH, Intel MPI) forms: `-hosts a,b` / `a:2,b:2`, `-ppn N`
    for hosts without a count, `-f hostfile` with `name:N` or bare names,
    `-n`/`-np`; the program's own arguments are left alone."""
    drop = launch_wrapper.without_hosts
    program = ["python", "t.py", "-n", "9", "-f", "config.yaml"]
    out, dropped = drop(
        ["mpiexec", "-n", "6", "-hosts", "n1:2,n2:2,n3:2", *program], ["n2"]
    )
    assert out == ["mpiexec", "-n", "4", "-hosts", "n1:2,n3:2", *program]
    assert dropped == 2
    out, dropped = drop(
        ["mpiexec", "-np", "8", "-ppn", "4", "-hosts", "n1,n2", *program], ["n1"]
    )
    assert out == ["mpiexec", "-np", "4", "-ppn", "4", "-hosts", "n2", *program]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1:2\nn2:2\nn3\n")
    out, dropped = drop(
        ["mpiexec", "-f", str(hostfile), "-n", "5", *program], ["n1", "n3"]
    )
    assert dropped == 3 and out[4] == "2", out
    assert open(out[2]).read() == "n2:2\n"
    assert out[5:] == program
    # `-f`, `-n` after the program are the program's: nothing to rewrite.
    argv = ["mpiexec", "-n", "2", "python", "t.py", "-f", "n3"]
    assert drop(argv, ["n3"]) == (argv, 0)


def test_settings_reach_the_ranks_through_the_real_launcher(tmp_path):
    """`pass_settings` with the launcher beside this Python (Open MPI's
    `-x`, Hydra's `-genv`): a variable the launcher's own environment lacks
    reaches every rank with the value given (Hydra) or the launcher's
    (Open MPI takes it from its environment, which the wrapper sets)."""
    import os
    import subprocess

    from mpi_launch import launch_command, mpi_env, mpi_kind

    name, value = "KERAS_MPFP16_TEST_PASSED", "through the launcher"
    argv = launch_command(2, *(["-genvnone"] if mpi_kind() == "hydra" else []))
    cmd = launch_wrapper.pass_settings(argv, {name: value}) + [
        sys.executable,
        "-c",
        f"import os; print(os.environ.get({name!r}))",
    ]
    env = mpi_env()
    if mpi_kind() == "open-mpi":
        env[name] = value  # -x NAME passes the launcher's own value
    else:
        env.pop(name, None)  # -genvnone: only what -genv passes arrives
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines().count(value) == 2, (out.stdout, out.stderr[-2000:])
    assert os.environ.get(name) is None


def test_rank_0s_verdict_wins_over_a_cut_off_ranks(tmp_path, monkeypatch):
    """Both sides of a cut link declare the other lost at about the same time;
    on the emulated cluster (or a shared filesystem) both can write the
    verdict. Rank 0's names the lost host and must be the one read, whichever
    comes first; a cut-off rank's is kept only when rank 0 wrote none."""
    path = tmp_path / "verdict"
    monkeypatch.setenv(launch_wrapper.VERDICT_ENV, str(path))
    from_rank_0 = "rank 2 (host n3) is unreachable: nothing heard"
    from_rank_2 = "rank 0 (host n1) is unreachable from rank 2 (host n3)"
    launch_wrapper.report_lost(from_rank_2, replace=False)
    launch_wrapper.report_lost(from_rank_0)
    assert path.read_text() == from_rank_0
    launch_wrapper.report_lost(from_rank_2, replace=False)
    assert path.read_text() == from_rank_0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdict"]
    path.unlink()
    launch_wrapper.report_lost(from_rank_2, replace=False)
    assert path.read_text() == from_rank_2
    assert launch_wrapper.lost_hosts(from_rank_0) == ["n3"]


def test_kmp_launch_console_script_runs_the_wrapper(tmp_path):
    """`kmp-launch` (pyproject's `[project.scripts]`) is the wrapper's
    `main`: the script pip installed beside the interpreter passes the
    launcher's status, parses `--max-restarts` and restarts a killed launcher,
    and like `python -m keras_mpfp16.runtime.launch` imports neither Keras
    nor TensorFlow nor mpi4py (seen with -X importtime)."""
    import subprocess
    import tomllib
    from importlib.metadata import entry_points
    from pathlib import Path

    from keras_mpfp16.runtime import launch

    root = Path(__file__).resolve().parent.parent
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"kmp-launch": "keras_mpfp16.runtime.launch:main"}
    installed = entry_points(group="console_scripts", name="kmp-launch")
    assert len(installed) == 1, "not installed: pip install -e . (re)creates it"
    assert next(iter(installed)).load() is launch.main
    script = Path(sys.executable).parent / "kmp-launch"
    assert script.is_file(), f"{script} missing: pip install -e . (re)creates it"

    def kmp_launch(*args, python_flags=()):
        return subprocess.run(
            [sys.executable, *python_flags, str(script), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    out = kmp_launch(
        sys.executable, "-c", "raise SystemExit(3)", python_flags=("-X", "importtime")
    )
    assert out.returncode == 3, out.stderr[-2000:]  # the launcher's status
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "keras_mpfp16.runtime.supervision.launch_wrapper" in imported
    heavy = sorted(
        m for m in imported if m.split(".")[0] in {"keras", "tensorflow", "mpi4py"}
    )
    assert not heavy, heavy

    bad = kmp_launch("--max-restarts", "two", "true")
    assert bad.returncode != 0
    assert "--max-restarts must be a whole number >= 0; received 'two'" in bad.stderr

    marker = tmp_path / "marker"
    killed_once = f"[ -e {marker} ] && exit 0; touch {marker}; kill -KILL $$"
    again = kmp_launch("--max-restarts", "1", "sh", "-c", killed_once)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "restart 1 of 1: the launcher ended with status 137" in again.stderr
    # Run directly (its own #! line), as a user types it.
    direct = subprocess.run(
        [str(script), "sh", "-c", "exit 4"], capture_output=True, timeout=120
    )
    assert direct.returncode == 4
