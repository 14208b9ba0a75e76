"""Real Slurm jobs: srun with PMIx at 2 and 3 tasks, the documented sbatch
script, and the launcher/MPI mismatch refused (`srun --mpi=none`,
`--mpi=pmi2`: Open MPI 5 has no PMI-2).

Runs on the single-node Slurm that `.ci/slurm-up` starts (the `slurm`
fixture); skipped, with the reason, where it cannot (not root, no Slurm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from mpi_launch import SCRIPTS, run_mpi
from slurm_launch import ROOT, run_sbatch, run_srun, slurm  # noqa: F401

pytestmark = pytest.mark.usefixtures("slurm")

SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"


def ok(result):
    assert result.returncode == 0, result.describe()
    return result.records()


@pytest.mark.parametrize("n", [2, 3])
def test_srun_pmix_trains_one_model_like_mpirun(n):
    srun = run_srun(n, "slurm_train.py", timeout=400)
    recs = ok(srun)
    assert [r["rank"] for r in recs] == list(range(n))
    assert all(r["size"] == n for r in recs)
    # srun started the tasks (not a leftover mpirun environment).
    assert sorted(r["slurm_procid"] for r in recs) == [str(i) for i in range(n)]
    assert len({r["digest"] for r in recs}) == 1, recs
    # Keras's output once for the whole job.
    assert srun.stdout.count("Epoch 1/3") == 1, srun.stdout[-3000:]
    # No stray PMIx notice: the library chose PMIx's native security.
    assert "help file" not in srun.stderr, srun.stderr[-3000:]
    # The same job under mpirun: the same model, bit for bit.
    mpirun = ok(run_mpi(n, "slurm_train.py", timeout=400))
    assert {r["digest"] for r in mpirun} == {recs[0]["digest"]}
    assert mpirun[0]["val_loss"] == recs[0]["val_loss"]


@pytest.mark.parametrize("plugin", ["none", "pmi2"])
def test_srun_with_a_plugin_mpi_cannot_join_is_refused(plugin):
    result = run_srun(2, "slurm_train.py", mpi=plugin, timeout=300)
    assert result.returncode != 0, result.describe()
    assert "WorldSizeMismatchError" in result.stderr, result.describe()
    assert "the MPI world has 1 process" in result.stderr
    assert "started 2 processes" in result.stderr
    assert "srun --mpi=pmix" in result.stderr
    # Neither task trained.
    assert "Epoch 1/3" not in result.stdout and not result.records()


def test_documented_sbatch_script_runs(tmp_path):
    # The script of docs/launching.md, adapted to this machine in what it
    # must be: the venv's path, and no GPU request (there is no GPU); the
    # size of the job is set on the command line (which overrides #SBATCH).
    text = SBATCH.read_text()
    venv = str(Path(sys.executable).parent.parent)
    assert "$HOME/kmp-venv" in text and "--gpus-per-task=1" in text
    text = text.replace("$HOME/kmp-venv", venv)
    text = "\n".join(
        line for line in text.splitlines() if "--gpus-per-task" not in line
    )
    job = tmp_path / "train.sbatch"
    job.write_text(text + "\n")
    shutil.copy(SCRIPTS / "slurm_train.py", tmp_path / "train.py")
    start = time.monotonic()
    result = run_sbatch(
        job,
        f"--chdir={tmp_path}",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--export=ALL,PYTHONPATH=" + str(ROOT),
        timeout=400,
    )
    assert result.returncode == 0, result.describe()
    job_id = re.search(r"Submitted batch job (\d+)", result.stdout).group(1)
    outputs = list(tmp_path.glob(f"*-{job_id}.out"))
    assert len(outputs) == 1, (list(tmp_path.iterdir()), result.describe())
    log = outputs[0].read_text()
    lines = [line for line in log.splitlines() if line.startswith("{")]
    assert len(lines) == 2, log[-3000:]
    assert log.count("Epoch 3/3") == 1, log[-3000:]
    assert "help file" not in log, log[-3000:]
    recs = [json.loads(line) for line in lines]
    assert {r["size"] for r in recs} == {2} and len({r["digest"] for r in recs}) == 1
    assert time.monotonic() - start < 400


def test_doctor_under_srun():
    result = run_srun(2, "doctor_main.py", "--json", "--large-mb", "4", timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith('{"info"')]
    assert len(lines) == 1, result.describe()  # rank 0 alone prints
    report = json.loads(lines[0])
    assert report["info"]["launcher"].startswith("srun: 2 processes")
    assert report["info"]["mpi_world_size"] == 2
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert [r["launcher_local_rank"] for r in report["ranks"]] == [0, 1]
    cores = len(os.sched_getaffinity(0))
    assert result.returncode == (0 if cores >= 2 else 1), result.describe()
