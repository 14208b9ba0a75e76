"""kmp.bind_gpus(): one GPU per local rank, from simulated launcher variables
(no GPU here), and the error when TensorFlow has already set up its devices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from keras_mpfp16.backend import devices
from keras_mpfp16.runtime.process import gpus


@pytest.mark.parametrize(
    "local_rank, local_size, visible, in_node, per_rank, expected",
    [
        (1, 4, None, 4, 1, ["1"]),  # unset: the node's GPUs by index
        (1, 2, ["2", "3", "5", "7"], 8, 1, ["3"]),  # a subset: its entries
        (1, 2, ["GPU-aa", "GPU-bb"], 2, 1, ["GPU-bb"]),  # UUIDs
        (1, 2, ["0", "1", "2", "3"], 4, 2, ["2", "3"]),
        (3, 4, ["6"], 8, 1, ["6"]),  # srun --gpus-per-task=1 bound it already
        (0, 2, None, 0, 1, []),  # no GPU: nothing to do
        (0, 1, None, 4, 1, ["0"]),  # a process alone takes the first
    ],
)
def test_select_devices(local_rank, local_size, visible, in_node, per_rank, expected):
    assert (
        gpus.select_devices(local_rank, local_size, visible, in_node, per_rank)
        == expected
    )


def test_select_devices_too_few_gpus_says_what_is_there():
    with pytest.raises(ValueError, match=r"4 ranks .* need 4 GPUs, but 2 are visible"):
        gpus.select_devices(0, 4, ["0", "1"], 2)


_LAUNCHERS = {
    "mpirun": {
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    },
    "srun": {
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    },
    "hydra": {
        "PMI_SIZE": "4",
        "PMI_RANK": "3",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
    },
}


def _clean(monkeypatch, extra):
    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI", "SLURM_", "MV2_", "JSM_", "MPI_LOCAL")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test
    for key, value in extra.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("name", sorted(_LAUNCHERS))
def test_bind_gpus_from_each_launchers_local_rank(monkeypatch, name):
    _clean(monkeypatch, _LAUNCHERS[name])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    # In this test process TensorFlow may already be up (other tests): the
    # too-late check is tested in a fresh process below.
    monkeypatch.setattr(devices, "framework_initialized", lambda: None)
    assert devices.bind_gpus() == ["5"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    # Again: already bound, nothing changes.
    assert devices.bind_gpus() == ["5"]


def test_bind_gpus_leaves_a_cpu_machine_alone(monkeypatch):
    _clean(monkeypatch, _LAUNCHERS["mpirun"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(gpus, "node_gpus", lambda: 0)
    assert devices.bind_gpus() == []
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with pytest.raises(ValueError, match="gpus_per_rank"):
        devices.bind_gpus(0)


_SCRIPT = """
import os, sys
import keras_mpfp16 as kmp
import keras  # the bootstrap (KERAS_MPFP16_BIND_GPUS=1) runs before Keras loads
print("after import", os.environ.get("CUDA_VISIBLE_DEVICES"))
if sys.argv[1] == "late":
    import tensorflow as tf
    tf.config.list_physical_devices("GPU")
try:
    print("bound", kmp.bind_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
except RuntimeError as exc:
    print("refused", exc)
"""


def _run(mode: str, env: dict) -> str:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_", "JSM_", "MPI_LOCAL"))
    }
    clean.update({"TF_CPP_MIN_LOG_LEVEL": "3", **env})
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        capture_output=True,
        text=True,
        env=clean,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_bind_gpus_in_time_and_too_late():
    # Real TensorFlow in fresh processes: after `import keras_mpfp16` (which
    # imports Keras and TensorFlow) the binding is in time; after a device
    # query it is refused, with what to do.
    env = {**_LAUNCHERS["srun"], "CUDA_VISIBLE_DEVICES": "0,1"}
    early = _run("early", env)
    assert "after import 0,1" in early and "bound ['1'] 1" in early
    late = _run("late", env)
    assert "refused keras_mpfp16.bind_gpus() came too late: TensorFlow" in late
    assert "wanted '1' for local rank 1" in late


def test_bind_gpus_at_import_when_asked():
    env = {
        **_LAUNCHERS["mpirun"],
        "CUDA_VISIBLE_DEVICES": "2,3",
        gpus.ENV_VAR: "1",
    }
    out = _run("early", env)
    assert "after import 3" in out and "bound ['3'] 3" in out


def test_bind_gpus_at_import_after_tensorflow_started_is_refused():
    env = {
        **_LAUNCHERS["hydra"],
        "CUDA_VISIBLE_DEVICES": "0,1",
        gpus.ENV_VAR: "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_", "JSM_", "MPI_LOCAL"))
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tensorflow as tf; tf.constant(1.0); import keras_mpfp16",
        ],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=240,
    )
    assert proc.returncode != 0
    assert "bind_gpus() came too late: TensorFlow" in proc.stderr, proc.stderr[-3000:]
