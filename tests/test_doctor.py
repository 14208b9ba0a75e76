"""`python -m keras_mpfp16 doctor`: alone, under mpirun at 2 and 3 ranks (srun
in tests/test_slurm.py), and what makes it fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mpi_launch import run_mpi

from keras_mpfp16 import doctor


def report_of(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith('{"info"')]
    assert len(lines) == 1, stdout[-3000:]  # printed once, by rank 0
    return json.loads(lines[0])


def _alone(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_", "JSM_"))
    }
    clean.update({"TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "keras_mpfp16", "doctor", *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=240,
    )


def test_doctor_alone_reports_versions_and_ok():
    proc = _alone("--json", "--large-mb", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = report_of(proc.stdout)
    info = report["info"]
    assert report["ok"] and not report["problems"]
    for key in ("keras_mpfp16", "keras", "tensorflow", "mpi4py", "mpi_library"):
        assert info[key] and info[key] != "not installed", (key, info)
    assert info["thread_level"] == "MULTIPLE"
    assert info["mpi_world_size"] == 1
    assert info["allreduce_large_bytes"] == 1 << 20
    assert len(report["ranks"]) == 1
    assert report["ranks"][0]["cpus"] == sorted(os.sched_getaffinity(0))
    # The text form says the same, with a verdict line.
    text = _alone("--large-mb", "1")
    assert text.returncode == 0 and "verdict: OK" in text.stdout, text.stdout


def test_doctor_flags_a_thread_level_below_multiple():
    proc = _alone(
        "--json", "--large-mb", "1", env={"MPI4PY_RC_THREAD_LEVEL": "serialized"}
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (problem,) = report_of(proc.stdout)["problems"]
    assert "SERIALIZED, below MULTIPLE" in problem["what"]


def test_doctor_flags_a_launcher_mismatch():
    proc = _alone("--large-mb", "1", env={"SLURM_STEP_NUM_TASKS": "2"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the MPI world has 1 process, but srun started 2" in proc.stdout
    assert "srun --mpi=pmix" in proc.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3])
def test_doctor_under_mpirun(np_):
    result = run_mpi(np_, "doctor_main.py", "--json", "--large-mb", "4", timeout=300)
    report = report_of(result.stdout)
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == list(range(np_))
    assert {r["local_size"] for r in ranks} == {np_}
    assert report["info"]["mpi_world_size"] == np_
    assert "Open MPI's mpirun" in report["info"]["launcher"]
    # Unbound ranks (--bind-to none) share every core: each gets
    # cores // np_ intra-op threads, at least 1 -- oversubscribed only when
    # there are fewer cores than ranks.
    cores = len(os.sched_getaffinity(0))
    assert {r["threads"]["TF_NUM_INTRAOP_THREADS"] for r in ranks} == {
        str(max(1, cores // np_))
    }
    oversubscribed = cores < np_
    assert report["ok"] is (not oversubscribed), report["problems"]
    assert result.returncode == (1 if oversubscribed else 0), result.describe()
    if oversubscribed:
        assert "oversubscribed" in report["problems"][0]["what"]


@pytest.mark.mpi
def test_doctor_flags_oversubscribed_threads_under_mpirun():
    result = run_mpi(
        2,
        "doctor_main.py",
        "--large-mb",
        "1",
        env={"KERAS_MPFP16_THREADS": "256,2"},
        timeout=300,
    )
    assert result.returncode == 1, result.describe()
    assert result.stdout.count("verdict:") == 1
    assert "run 512 compute threads (256+256): oversubscribed" in result.stdout
    assert "KERAS_MPFP16_THREADS" in result.stdout


def test_check_sharing_rules():
    def row(rank, host, cpus, intra, gpus=0, visible=None):
        return {
            "rank": rank,
            "host": host,
            "cpus": cpus,
            "gpus": gpus,
            "cuda_visible_devices": visible,
            "threads": {"TF_NUM_INTRAOP_THREADS": str(intra)},
        }

    ok = doctor.Report()
    # Disjoint masks, or one rank per host: fine.
    doctor.check_sharing(
        [row(0, "a", [0, 1], 2), row(1, "a", [2, 3], 2), row(2, "b", [0, 1], 2)], ok
    )
    assert not ok.problems
    bad = doctor.Report()
    doctor.check_sharing(
        [
            row(0, "a", [0, 1, 2, 3], 4, gpus=2),
            row(1, "a", [0, 1, 2, 3], 4, gpus=2),
        ],
        bad,
    )
    assert len(bad.problems) == 2
    assert "ranks 0, 1 share cores 0-3 (4 cores) and run 8" in bad.problems[0][0]
    assert "see GPUs all" in bad.problems[1][0]
    assert "kmp.bind_gpus()" in bad.problems[1][1]
    assert doctor.cpu_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def _device_row(rank, gpus, visible, seen, cuda_build=True, host="a"):
    return {
        "rank": rank,
        "host": host,
        "gpus": gpus,
        "cuda_visible_devices": visible,
        "framework_gpus": seen,
        "framework_cuda_build": cuda_build,
    }


@pytest.mark.parametrize(
    "gpus_in_node, visible, seen, cuda_build, expected",
    [
        (0, None, [], False, None),  # a CPU node: nothing to judge
        (4, None, ["GPU:0", "GPU:1", "GPU:2", "GPU:3"], True, None),
        (4, "2", ["GPU:0"], True, None),  # bound to one, sees one
        (4, "", [], True, None),  # CUDA_VISIBLE_DEVICES="": CPU by choice
        (4, None, None, None, None),  # no TensorFlow: not judged
        (4, None, [], False, "built without CUDA"),  # tensorflow-cpu on a GPU node
        (4, "1", [], True, "CUDA/cuDNN libraries"),  # CUDA build, no usable GPU
        (4, "0,1", ["GPU:0"], True, "bound to 2 GPU(s)"),  # bound but invisible
    ],
)
def test_check_devices_rules(gpus_in_node, visible, seen, cuda_build, expected):
    report = doctor.Report()
    doctor.check_devices(
        [_device_row(0, gpus_in_node, visible, seen, cuda_build)], report
    )
    if expected is None:
        assert not report.problems, report.problems
    else:
        (problem,) = report.problems
        assert expected in " ".join(problem), problem
        if "sees none" in problem[0]:
            assert "would train on the CPU" in problem[0]


def test_check_devices_names_every_rank_on_the_cpu():
    report = doctor.Report()
    doctor.check_devices(
        [
            _device_row(0, 2, "0", ["GPU:0"]),
            _device_row(1, 2, "1", []),
            _device_row(2, 2, None, [], cuda_build=False, host="b"),
        ],
        report,
    )
    (problem,) = report.problems
    assert (
        "ranks 1, 2 on a, b: the node has GPUs but TensorFlow sees none" in (problem[0])
    )
    assert "tensorflow-gpu" in problem[1]


def _doctor_with_seamed_devices(node_gpus: int, framework_gpus, cuda_build: bool):
    """The doctor in a subprocess whose GPU queries are seamed: the driver's
    count and TensorFlow's device list are what the test says."""
    script = f"""
import sys
from keras_mpfp16.backend import devices
from keras_mpfp16.runtime.process import gpus
gpus.node_gpus = lambda: {node_gpus}
devices.gpu_query = lambda: {framework_gpus!r}
devices.cuda_build_query = lambda: {cuda_build!r}
from keras_mpfp16 import doctor
sys.exit(doctor.main(["--large-mb", "1"]))
"""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_", "JSM_"))
    }
    clean.update({"TF_CPP_MIN_LOG_LEVEL": "3"})
    clean.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=clean,
        timeout=240,
    )


def test_doctor_fails_when_the_node_has_gpus_tensorflow_does_not_use():
    proc = _doctor_with_seamed_devices(2, [], False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the node has GPUs but TensorFlow sees none" in proc.stdout
    assert "tensorflow[and-cuda]" in proc.stdout
    assert "CPU" in proc.stdout  # the "TF computes on" column


def test_doctor_ok_when_tensorflow_sees_the_gpus():
    proc = _doctor_with_seamed_devices(
        2, ["/physical_device:GPU:0", "/physical_device:GPU:1"], True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdict: OK" in proc.stdout and "2 GPU(s)" in proc.stdout


# -- which physical GPU each rank computes on (issue 39, item 5) ----------------


def test_gpu_identities_are_asked_of_the_cuda_driver(monkeypatch):
    from fake_cuda import FakeCudaDriver, uuid_bytes

    from keras_mpfp16.runtime.process import gpus

    two = [(uuid_bytes(1), "00000000:3B:00.0"), (uuid_bytes(2), "00000000:5E:00.0")]
    monkeypatch.setattr(gpus, "cuda_driver", lambda: FakeCudaDriver(two))
    found = gpus.gpu_identities()
    assert found == [
        {
            "uuid": "GPU-5a010001-0203-0405-0607-08090a0b0c0d",
            "pci_bus_id": "00000000:3B:00.0",
        },
        {
            "uuid": "GPU-5a020001-0203-0405-0607-08090a0b0c0d",
            "pci_bus_id": "00000000:5E:00.0",
        },
    ]
    # A driver without the UUID call: the PCI bus id alone.
    monkeypatch.setattr(
        gpus, "cuda_driver", lambda: FakeCudaDriver(two[:1], with_uuid=False)
    )
    assert gpus.gpu_identities() == [{"pci_bus_id": "00000000:3B:00.0"}]
    # Every GPU hidden (CUDA_VISIBLE_DEVICES=""): none; no driver: unknown.
    monkeypatch.setattr(
        gpus, "cuda_driver", lambda: FakeCudaDriver([], init_status=100)
    )
    assert gpus.gpu_identities() == []

    def no_driver():
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(gpus, "cuda_driver", no_driver)
    assert gpus.gpu_identities() is None


def test_the_real_driver_query_on_this_machine():
    """No NVIDIA driver here: unknown (None), never an error. On a GPU
    machine: one identity per visible GPU."""
    from keras_mpfp16.runtime.process import gpus

    found = gpus.gpu_identities()
    if gpus.node_gpus() == 0:
        assert found is None or found == [], found
    else:
        assert found and all("uuid" in g or "pci_bus_id" in g for g in found), found


def _gpu_row(rank, host, visible, uuid=None):
    identity = (
        None
        if uuid is None
        else (
            []
            if uuid == ""
            else [{"uuid": uuid, "pci_bus_id": f"0000:{uuid[-2:]}:00.0"}]
        )
    )
    return {
        "rank": rank,
        "host": host,
        "cpus": [rank],
        "gpus": 4,
        "cuda_visible_devices": visible,
        "gpu_identity": identity,
        "threads": {"TF_NUM_INTRAOP_THREADS": "1"},
    }


@pytest.mark.parametrize(
    "rows, shared",
    [
        # srun --gpus-per-task=1: "0" on every task of one node, a GPU each.
        ([_gpu_row(0, "a", "0", "GPU-a0"), _gpu_row(1, "a", "0", "GPU-a1")], None),
        # "0" on every task of different nodes: different GPUs.
        ([_gpu_row(0, "a", "0", "GPU-a0"), _gpu_row(1, "b", "0", "GPU-b0")], None),
        # bind_gpus(): "0" and "1" of one node.
        ([_gpu_row(0, "a", "0", "GPU-a0"), _gpu_row(1, "a", "1", "GPU-a1")], None),
        # One GPU hidden from rank 1 (CUDA_VISIBLE_DEVICES=""): the CPU, by choice.
        ([_gpu_row(0, "a", "0", "GPU-a0"), _gpu_row(1, "a", "", "")], None),
        # True sharing: one UUID on one host, whatever the strings say.
        (
            [_gpu_row(0, "a", None, "GPU-a0"), _gpu_row(1, "a", None, "GPU-a0")],
            "[0, 1]",
        ),
        (
            [
                _gpu_row(0, "a", "0", "GPU-a0"),
                _gpu_row(1, "a", "2", "GPU-a0"),
                _gpu_row(2, "a", "1", "GPU-a1"),
            ],
            "[0, 1]",
        ),
        # No identity (no driver to ask): the strings, as before.
        ([_gpu_row(0, "a", "0"), _gpu_row(1, "a", "0")], "see GPUs 0"),
    ],
)
def test_gpu_sharing_is_judged_by_identity_not_by_cuda_visible_devices(rows, shared):
    report = doctor.Report()
    doctor.check_sharing(rows, report)
    if shared is None:
        assert not report.problems, report.problems
        return
    (problem,) = report.problems
    assert shared in problem[0] and "would all compute on one GPU" in problem[0], (
        problem
    )
    if "GPU-a0" in repr(rows):
        assert "compute on GPU GPU-a0 (PCI 0000:a0:00.0)" in problem[0], problem


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["bound", "shared"])
def test_doctor_under_mpirun_with_per_task_gpus_is_ok_and_sharing_fails(mode):
    """A real 2-rank doctor, each rank with CUDA_VISIBLE_DEVICES=0 and a
    stand-in CUDA driver: per-task binding (a GPU each) passes, one GPU
    for both fails naming its UUID."""
    result = run_mpi(2, "doctor_gpu_binding.py", mode, timeout=300)
    out = result.stdout
    if mode == "bound":
        assert result.returncode == 0, result.describe()
        assert "verdict: OK" in out, result.describe()
    else:
        assert result.returncode == 1, result.describe()
        assert (
            "host " in out
            and "ranks [0, 1] compute on GPU GPU-5a000001-0203-0405-0607-08090a0b0c0d "
            "(PCI 00000000:18:00.0): they would all compute on one GPU"
            in out
        ), result.describe()
