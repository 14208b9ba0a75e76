"""`python -m keras_mpfp16.benchmark`: each subcommand's own help, and a
one-process measurement refused once (not per rank) under mpirun."""

import subprocess
import sys

import pytest
from mpi_launch import mpi_env, mpirun_path


def test_each_subcommand_prints_its_own_help():
    def helptext(*args):
        res = subprocess.run(
            [sys.executable, "-m", "keras_mpfp16.benchmark", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=300,
            env=mpi_env(),
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    train = helptext("train")
    assert "--plain" in train and "--units" in train and "--sizes" not in train
    allreduce = helptext("allreduce")
    assert "--sizes" in allreduce and "--units" not in allreduce
    assert "{allreduce,train,overhead}" in helptext()


@pytest.mark.mpi
def test_overhead_under_mpirun_says_once_that_it_is_one_process():
    cmd = [mpirun_path(), "-np", "2", "--oversubscribe", "--bind-to", "none"]
    cmd += [sys.executable, "-m", "keras_mpfp16.benchmark", "overhead"]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=mpi_env()
    )
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert out.count("overhead measures one process") == 1, out
    assert "status Python < 3.12 does not reveal" not in out, out  # status seen
