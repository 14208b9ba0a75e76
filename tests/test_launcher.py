"""The MPI world checked against what the launcher announced.

Pure tests of the detection for each launcher's variables, and real
processes: a one-process MPI world started with each launcher's variables
(what `srun --mpi=none`, or another MPI's `mpiexec`, gives every task) must
stop at `init` with the launcher, both sizes and the fix named. Real `srun`
jobs are in tests/test_slurm.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from keras_mpfp16.runtime.process import launcher_env as launcher

# -- detection ------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, name, size, rank, local_rank, local_size",
    [
        (
            {
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            "Open MPI's mpirun",
            4,
            3,
            1,
            2,
        ),
        (
            {
                "MV2_COMM_WORLD_SIZE": "3",
                "MV2_COMM_WORLD_RANK": "2",
                "MV2_COMM_WORLD_LOCAL_RANK": "2",
                "MV2_COMM_WORLD_LOCAL_SIZE": "3",
            },
            "MVAPICH's launcher",
            3,
            2,
            2,
            3,
        ),
        (
            {
                "JSM_NAMESPACE_SIZE": "6",
                "JSM_NAMESPACE_RANK": "5",
                "JSM_NAMESPACE_LOCAL_RANK": "2",
                "JSM_NAMESPACE_LOCAL_SIZE": "3",
            },
            "LSF's jsrun",
            6,
            5,
            2,
            3,
        ),
        # MPICH / Intel MPI (Hydra).
        (
            {
                "PMI_SIZE": "4",
                "PMI_RANK": "1",
                "MPI_LOCALRANKID": "1",
                "MPI_LOCALNRANKS": "2",
            },
            "Hydra",
            4,
            1,
            1,
            2,
        ),
        # Hydra's mpiexec inside an srun step that started its proxies (one per
        # node): the proxies' step is not the job.
        (
            {
                "PMI_SIZE": "4",
                "PMI_RANK": "3",
                "MPI_LOCALRANKID": "1",
                "MPI_LOCALNRANKS": "2",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_PROCID": "1",
            },
            "Hydra",
            4,
            3,
            1,
            2,
        ),
        # srun --mpi=pmi2: Slurm's PMI-2 server sets PMI_SIZE = the step's size.
        (
            {
                "PMI_SIZE": "3",
                "PMI_RANK": "2",
                "SLURM_STEP_NUM_TASKS": "3",
                "SLURM_PROCID": "2",
                "SLURM_LOCALID": "0",
                "SLURM_NODEID": "1",
                "SLURM_STEP_TASKS_PER_NODE": "2,1",
                "SLURM_MPI_TYPE": "pmi2",
            },
            "srun --mpi=pmi2",
            3,
            2,
            0,
            1,
        ),
        (
            {
                "SLURM_STEP_NUM_TASKS": "8",
                "SLURM_PROCID": "5",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "1",
                "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                "SLURM_NTASKS": "8",
            },
            "srun",
            8,
            5,
            1,
            4,
        ),
        # mpirun inside a batch script (job-level SLURM_NTASKS), and mpirun
        # whose daemons srun started (a step of one task per node): Open MPI's
        # own variables win.
        (
            {
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_RANK": "0",
                "SLURM_NTASKS": "4",
                "SLURM_STEP_NUM_TASKS": "1",
                "SLURM_PROCID": "0",
            },
            "Open MPI's mpirun",
            2,
            0,
            None,
            None,
        ),
    ],
)
def test_detect_names_the_launcher_closest_to_the_process(
    env, name, size, rank, local_rank, local_size
):
    found = launcher.detect(env)
    assert found is not None
    assert name in found.launcher
    assert (found.size, found.rank, found.local_rank, found.local_size) == (
        size,
        rank,
        local_rank,
        local_size,
    )


def test_batch_script_and_plain_python_announce_nothing():
    # In the batch script itself (no srun step) SLURM_NTASKS is the job's
    # size, but `python train.py` there is one process: not evidence.
    assert launcher.detect({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None
    assert launcher.detect({}) is None
    assert launcher.detect({"OMPI_COMM_WORLD_SIZE": "", "PMI_SIZE": "x"}) is None


@pytest.mark.parametrize(
    "text, node, expected",
    [
        ("2", 0, 2),
        ("4(x3)", 2, 4),
        ("2(x2),1", 2, 1),
        ("2(x2),1", 1, 2),
        ("3,1(x2)", 0, 3),
        ("2", 1, None),
        ("two", 0, None),
    ],
)
def test_slurm_tasks_per_node_list(text, node, expected):
    assert launcher.slurm_tasks_on_node(text, node) == expected


def test_check_world_size_raises_naming_launcher_sizes_and_fix():
    env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}
    with pytest.raises(launcher.WorldSizeMismatchError) as info:
        launcher.check_world_size(1, "Open MPI v5.0.11", env)
    text = str(info.value)
    for part in (
        "has 1 process",
        "srun started 2 processes",
        "SLURM_STEP_NUM_TASKS=2",
        "Open MPI v5.0.11",
        "srun --mpi=pmix",
        "KERAS_MPFP16_ALLOW_SIZE_MISMATCH=1",
    ):
        assert part in text, (part, text)
    launcher.check_world_size(2, "", env)  # sizes agree
    launcher.check_world_size(1, "", {**env, "KERAS_MPFP16_ALLOW_SIZE_MISMATCH": "1"})
    with pytest.raises(ValueError, match="KERAS_MPFP16_ALLOW_SIZE_MISMATCH='maybe'"):
        launcher.check_world_size(
            1, "", {**env, "KERAS_MPFP16_ALLOW_SIZE_MISMATCH": "maybe"}
        )


def test_check_world_size_for_mpi_launchers_names_the_same_mpi_fix():
    with pytest.raises(launcher.WorldSizeMismatchError) as info:
        launcher.check_world_size(1, "", {"PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"})
    assert "Hydra) started 3 processes" in str(info.value)
    assert "python -m mpi4py --mpi-lib-version" in str(info.value)


# -- real one-process MPI worlds with each launcher's variables -----------------

_INIT = "import keras_mpfp16 as kmp; kmp.init(); print('world', kmp.size())"

_LAUNCHERS = {
    "srun --mpi=none": {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"},
    "srun --mpi=pmi2": {
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_PROCID": "0",
        "PMI_SIZE": "2",
        "PMI_RANK": "0",
        "SLURM_MPI_TYPE": "pmi2",
    },
    "Open MPI's mpirun": {"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "1"},
}

_SIZES = ("_SIZE", "_NUM_TASKS")

_STRIP = (
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MV2_",
    "JSM_",
    "SLURM_",
    "MPI_LOCAL",
    "KERAS_MPFP16_ALLOW",
)


def _clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIP)}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def _start(extra: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _INIT],
        env=_clean_env(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_one_process_world_under_launchers_is_refused():
    # Started together: each process imports Keras, which takes seconds. The
    # other launchers' variables are covered by the detection tests above.
    procs = {name: _start(env) for name, env in _LAUNCHERS.items()}
    allowed = _start(
        {**_LAUNCHERS["srun --mpi=none"], launcher.ALLOW_MISMATCH_ENV: "1"}
    )
    batch = _start({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"})
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode != 0, (name, out, err)
        assert "WorldSizeMismatchError" in err, (name, err[-3000:])
        assert "the MPI world has 1 process" in err, (name, err[-3000:])
        size = next(v for k, v in _LAUNCHERS[name].items() if k.endswith(_SIZES))
        assert f"started {size} processes" in err, (name, err[-3000:])
        assert "world" not in out
    out, err = allowed.communicate(timeout=180)
    assert allowed.returncode == 0 and "world 1" in out, err[-3000:]
    # A plain `python train.py` in a batch script is one process, not an error.
    out, err = batch.communicate(timeout=180)
    assert batch.returncode == 0 and "world 1" in out, err[-3000:]


def test_docs_show_the_tested_batch_script():
    # tests/test_slurm.py submits examples/slurm/train.sbatch; the page must
    # show that very script.
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "launching.md").read_text()
    for name in ("train.sbatch", "train_restart.sbatch"):  # restart recipe too
        script = (root / "examples" / "slurm" / name).read_text()
        assert f"```bash\n{script}```" in page, name


def test_pmix_security_mode_chosen_before_mpi_starts():
    env = {"PMIX_SECURITY_MODE": "munge,native"}
    assert launcher.prepare_mpi_environment(env) == {"PMIX_MCA_psec": "native"}
    assert env["PMIX_MCA_psec"] == "native"
    mine = {"PMIX_SECURITY_MODE": "munge,native", "PMIX_MCA_psec": "munge"}
    assert launcher.prepare_mpi_environment(mine) == {}
    assert mine["PMIX_MCA_psec"] == "munge"  # the user's choice stays
    assert launcher.prepare_mpi_environment({"PMIX_SECURITY_MODE": "munge"}) == {}
    assert launcher.prepare_mpi_environment({}) == {}


# -- Hydra's PMI_SIZE, for real (the `mpich` end of .ci/run) --------------------

_HYDRA_PROBE = (
    "import json, keras_mpfp16 as kmp\n"
    "from keras_mpfp16.runtime.process import launcher_env as le\n"
    "found = le.detect()\n"
    "kmp.init()\n"
    "print(json.dumps({'rank': kmp.rank(), 'world': kmp.size(), 'launcher': "
    "found.launcher, 'size': found.size, 'local': [found.local_rank, "
    "found.local_size]}))\n"
)


@pytest.mark.mpi
def test_world_size_check_reads_hydras_pmi_size_for_real():
    """Under Hydra's `mpiexec -n 2` (MPICH or Intel MPI beside this Python):
    the launcher is read from `PMI_SIZE`/`PMI_RANK`/`MPI_LOCALRANKID` and
    agrees with MPI's world; a rank whose MPI cannot reach Hydra's PMI (its
    `PMI_FD` dropped before MPI starts: the rank's MPI starts a world of one,
    as another MPI's library would) is refused, naming Hydra's 2 processes."""
    from mpi_launch import json_records, launch_command, mpi_env, mpi_kind

    if mpi_kind() != "hydra":
        pytest.skip("needs Hydra's mpiexec beside this Python (.ci/run's mpich end)")
    run = [sys.executable, "-c", _HYDRA_PROBE]
    good = subprocess.run(
        launch_command(2) + run,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert good.returncode == 0, good.stderr[-3000:]
    rows = sorted(json_records(good.stdout), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["size"]) for r in rows] == [(0, 2, 2), (1, 2, 2)]
    assert all("Hydra" in r["launcher"] for r in rows), rows
    assert sorted(tuple(r["local"]) for r in rows) == [(0, 2), (1, 2)]
    cut = launch_command(2) + ["env", "-u", "PMI_FD", "-u", "PMI_PORT", *run]
    bad = subprocess.run(
        cut, env=mpi_env(), capture_output=True, text=True, timeout=300
    )
    assert bad.returncode != 0, bad.stdout + bad.stderr[-3000:]
    assert "WorldSizeMismatchError" in bad.stderr, bad.stderr[-3000:]
    assert "Hydra) started 2 processes" in bad.stderr, bad.stderr[-3000:]
    assert "the MPI world has 1 process" in bad.stderr
    assert "'world'" not in bad.stdout
