import os
import shutil
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

# -- every test that starts an MPI job is marked `mpi` ------------------------------
# `pytest -m "not mpi"` (CONTRIBUTING.md) must start no job.
# A test without the marker that starts a launcher, directly or through the
# launch wrapper (`kmp-launch mpirun ...`), fails naming the command. Asking a
# launcher its version (`mpirun --version`) starts no job and is allowed, and
# so does a stand-in script named `mpirun` (only real launcher binaries
# count). Not seen: a job started by a child process (a Python script run by
# the test that itself runs mpirun).

MPI_LAUNCHERS = frozenset(
    {"mpirun", "mpiexec", "mpiexec.hydra", "orterun", "prterun", "srun", "sbatch"}
)
_NOT_A_JOB = frozenset({"--version", "-V", "--help", "-h"})


def _real_launcher(word: str) -> bool:
    """Whether `word` names an MPI launcher binary (not a test's stand-in
    script of the same name)."""
    if os.path.basename(word) not in MPI_LAUNCHERS:
        return False
    path = word if os.sep in word else shutil.which(word)
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except (OSError, TypeError):
        return False


def starts_mpi_job(args) -> str | None:
    """The launcher an argv list starts a job with, or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        words = os.fsdecode(args).split()
    else:
        words = [os.fsdecode(a) for a in args]
    for i, word in enumerate(words):
        if _real_launcher(word):
            rest = words[i + 1 :]
            if rest and set(rest) <= _NOT_A_JOB:
                return None
            return os.path.basename(word)
    return None


_current_item: list = []  # the running test, while it runs
_real_execute_child = subprocess.Popen._execute_child


# KERAS_MPFP16_TEST_LAUNCH_LOG=FILE: a line per job a test starts (its node
# id, the launcher), appended to FILE, for counting a run's launches.
_LAUNCH_LOG = os.environ.get("KERAS_MPFP16_TEST_LAUNCH_LOG")


def _checked_execute_child(self, args, *rest, **kwargs):
    if _current_item:
        item = _current_item[-1]
        launcher = starts_mpi_job(args)
        if launcher and _LAUNCH_LOG:
            with open(_LAUNCH_LOG, "a") as f:
                f.write(f"{item.nodeid}\t{launcher}\n")
        if launcher and item.get_closest_marker("mpi") is None:
            pytest.fail(
                f"{item.nodeid} starts an MPI job ({launcher}: {args!r}) but is "
                "not marked @pytest.mark.mpi, so `pytest -m 'not mpi'` would run "
                "it: mark it (tests/conftest.py)",
                pytrace=False,
            )
    return _real_execute_child(self, args, *rest, **kwargs)


subprocess.Popen._execute_child = _checked_execute_child


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current_item.append(item)
    try:
        yield
    finally:
        _current_item.pop()


# -- the quick command: `python -m pytest -m quick` --------------------------------
# The unit tests (no MPI job, not `slow`) but the files in QUICK_LEAVES_OUT, and
# one np=2 job per area (QUICK_JOBS). CONTRIBUTING.md says when to run it and
# when the whole suite; tests/test_mpi_marker.py checks the lists.

QUICK_JOBS = (
    # runtime: the numpy collectives, every rank
    "tests/test_mpi_optimizer.py::test_runtime_collectives[2]",
    # training, callbacks, checkpoints and resume: exact global logs
    "tests/test_mpi_callbacks.py::test_logs_exact_output_on_rank_0_checkpoints_and_resume[2]",
    # data: shard and its cross-rank check
    "tests/test_mpi_shard_check.py::test_shard_checks_the_data_is_the_same_on_every_rank[2]",
    # the wire: in-step reduction paths, 16-bit wires, call counts
    "tests/test_mpi_wire.py::test_in_step_reduction_wires_paths_step_check_and_call_counts[2]",
    # faults: one rank's exception ends the job with its traceback
    "tests/test_mpi_faults.py::test_exception_on_one_rank_ends_the_job_with_its_traceback_once[exception-layer-injected failure inside a layer]",
    # preemption through the launch wrapper (kmp-launch's supervisor)
    "tests/test_mpi_preemption.py::test_sigterm_to_the_launch_wrapper_reaches_the_ranks_as_a_stop",
    # layers: SyncBatchNormalization at two ranks equals one process
    "tests/test_mpi_sync_batch_norm.py::test_guide_model_at_two_ranks_trains_as_one_process_of_the_global_batch",
)

# Files of end-to-end runs in subprocesses (not unit tests) left out of the
# quick run for their time; the whole suite runs them. Measured with
# --durations on 2026-12-06 (2 cores, load average ~20): the examples'
# smoke runs 442 s + 94 s + 69 s, test_launcher 126 s, test_gpus 119 s + 75 s
# + 37 s, test_benchmark_cli 70 s - about 40% of the unit tests' time.
QUICK_LEAVES_OUT = (
    "tests/test_examples.py",
    "tests/test_launcher.py",
    "tests/test_gpus.py",
    "tests/test_benchmark_cli.py",
    # Measured at 0.3.0 (the quick run alone on the machine: 4 min 10 s with
    # them): the doctor's end-to-end runs (`python -m keras_mpfp16 doctor`
    # in fresh interpreters, 3-7 s each) and the launcher watchdog's real
    # processes with their delays (3-6 s each).
    "tests/test_doctor.py",
    "tests/test_launcher_daemon.py",
    # The benchmark scripts' placement checks (scale_guarantees/cluster_bench
    # in subprocesses, ~5 s): benchmark tooling, like test_benchmark_cli.
    "tests/test_bench_placement.py",
)


def quick(item) -> bool:
    """Whether `item` is in the quick run."""
    if item.nodeid in QUICK_JOBS:
        return True
    if item.get_closest_marker("mpi") or item.get_closest_marker("slow"):
        return False
    return item.nodeid.split("::", 1)[0] not in QUICK_LEAVES_OUT


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if quick(item):
            item.add_marker(pytest.mark.quick)
