"""The launch wrapper passes the verdict file's variable the way the
launcher takes it: Open MPI's `-x VAR`; nothing added for MPICH / Intel
MPI's Hydra `mpiexec` (it passes the whole environment by default, and
rejects `-x`) or an unknown launcher. Stand-in launchers (shell scripts
named `mpiexec` answering `--version` as the real ones do) record their
arguments; the real Open MPI `mpirun` is checked too."""

from __future__ import annotations

import sys

import pytest

from keras_mpfp16.runtime.supervision import launch_wrapper

VERSIONS = {
    "open-mpi": "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/",
    "hydra": "HYDRA build details:\n    Version:                                 4.1.2\n",
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


@pytest.mark.parametrize("kind", ["open-mpi", "hydra", "other"])
def test_verdict_variable_is_passed_as_the_launcher_takes_it(tmp_path, kind):
    script, record = _stand_in(tmp_path, VERSIONS[kind])
    assert launch_wrapper.launcher_kind(str(script)) == kind
    assert launch_wrapper.run([str(script), "-np", "2", "python", "x.py"]) == 0
    args = record.read_text().split("\n")
    if kind == "open-mpi":
        assert args[:2] == ["-x", launch_wrapper.VERDICT_ENV], args
    else:
        assert "-x" not in args, args
        assert args[:2] == ["-np", "2"], args
    # The launcher's own environment has it either way (Hydra and srun pass
    # their environment on to the ranks).
    assert "env-set" in args


def test_the_real_mpirun_is_open_mpi():
    from mpi_launch import mpirun_path

    assert launch_wrapper.launcher_kind(mpirun_path()) == "open-mpi"
    assert launch_wrapper.launcher_kind(sys.executable) == "other"
    assert launch_wrapper.launcher_kind("/nonexistent/mpiexec") == "other"
