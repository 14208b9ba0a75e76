"""Per-rank thread-pool defaults for ranks that share a node.

A deep-learning backend sizes its thread pools from the cores it can see. When
several ranks share a node without core binding, each would start one
compute thread per core and they would fight over the cores. The defaults
here give each rank its share. They are applied through environment variables
that the backends read when their thread pools start, so they must be set
before the first tensor operation: `import keras_mpfp16` does it.

User control: set `KERAS_MPFP16_THREADS` to `"off"` to leave everything as it
is, or to `"INTRA,INTER"` (e.g. `"4,2"`) to choose. Variables the user already
set (`TF_NUM_INTRAOP_THREADS`, `TF_NUM_INTEROP_THREADS`, `OMP_NUM_THREADS`) are
never overwritten.
"""

from __future__ import annotations

import os

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.process.launcher_env import launcher_local_size

ENV_VAR = env.setting("THREADS").name

# With more than one core per rank, a second inter-op thread runs the gradient
# allreduce while the first keeps executing the graph, so communication
# can overlap computation. With one core per rank there is no spare core to
# overlap on, and the second thread only competes with the compute thread:
# measured on 2 cores at np=2 (examples/benchmarks/threads.py), one core per
# rank ran 5-8% faster with 1 inter-op thread than with 2.
DEFAULT_INTER_OP = 2
SINGLE_CORE_INTER_OP = 1

applied: dict[str, str] = {}


def visible_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def node_cores() -> int:
    """Cores this job may use on this node.

    The machine's count, or under Slurm the CPUs the job was given here
    (`SLURM_CPUS_ON_NODE`) when that is fewer: a job step's tasks that srun
    did not bind each to their own cores all get the whole allocation as
    their mask, and it is the allocation, not the machine, they share.
    """
    total = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_ON_NODE", "").strip()
    if slurm.isdigit() and 0 < int(slurm) < total:
        return int(slurm)
    return total


def default_thread_counts(
    cores: int, total_cores: int, local_size: int
) -> tuple[int, int]:
    """(intra-op, inter-op) threads for one rank.

    Args:
        cores: cores this process may run on (its affinity mask).
        total_cores: cores the job may use on the node (`node_cores()`).
        local_size: ranks on this node.

    Returns:
        The thread counts. A rank whose mask may be its own (smaller than
        the node, and `local_size` such masks fit in the node) uses all of
        it. Otherwise the masks must overlap -- every rank unbound, or
        several ranks given one mask (`srun` without per-task binding,
        `mpirun --bind-to none` inside an allocation) -- and each rank gets
        `min(cores, total_cores) // local_size` (at least 1). The inter-op
        count is 2 (so the allreduce can overlap the backward pass) unless
        the rank has a single core, where it is 1.
    """
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1; received {local_size}.")
    exclusive = cores < total_cores and cores * local_size <= total_cores
    if exclusive:
        intra = cores
    else:
        intra = min(cores, total_cores) // local_size
    intra = max(1, intra)
    return intra, SINGLE_CORE_INTER_OP if intra == 1 else DEFAULT_INTER_OP


# The parser lives with the setting's registration (env imports nothing of ours).
parse_override = env.parse_threads


def apply_thread_defaults() -> dict[str, str]:
    """Sets the thread environment variables for this rank (see module docstring).

    Returns:
        The variables that were set (empty when nothing was changed).
    """
    if env.raw("THREADS") is not None:
        counts = env.get("THREADS")
    else:
        local = launcher_local_size()
        if local is None or local <= 1:
            return {}  # a lone process: the backend's own defaults are right
        counts = default_thread_counts(visible_cores(), node_cores(), local)
    if counts is None:
        return {}
    intra, inter = counts
    wanted = {
        "TF_NUM_INTRAOP_THREADS": str(intra),
        "TF_NUM_INTEROP_THREADS": str(inter),
        "OMP_NUM_THREADS": str(intra),
    }
    for key, val in wanted.items():
        if key not in os.environ:
            os.environ[key] = val
            applied[key] = val
    return dict(applied)
