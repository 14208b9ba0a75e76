"""Real `srun` / `sbatch` jobs from pytest, on the single-node Slurm of .ci/slurm-up.

The `slurm` fixture (session-wide) brings the cluster up with
`.ci/slurm-up` (idempotent: a running one is reused) and, if it started it,
stops it with `.ci/slurm-down` at the end. Where it cannot run (not root, the
Slurm packages missing, the daemons not starting) the tests are skipped with
the reason. Use: `from slurm_launch import run_srun, slurm  # noqa: F401`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mpi_launch import SCRIPTS, MPIResult, run_job

ROOT = Path(__file__).resolve().parent.parent
UP, DOWN = ROOT / ".ci" / "slurm-up", ROOT / ".ci" / "slurm-down"

EXAMPLES = ROOT / "examples" / "slurm"


def adapted_sbatch(
    name: str,
    work: Path,
    script: str,
    train_args: str = "",
    must_have: tuple[str, ...] = (),
) -> Path:
    """The documented batch script `examples/slurm/NAME`, adapted to this
    machine in what it must be (the venv's path, no GPU request; the job's
    size is set on the command line, which overrides `#SBATCH`), written to
    `work` with `tests/mpi_scripts/SCRIPT` beside it as `train.py` (and the
    scripts' shared module), `python train.py` given `train_args`.

    Fails the test where the script no longer has the lines adapted, or one
    of `must_have`, exactly once."""
    text = (EXAMPLES / name).read_text()
    for part in ("$HOME/kmp-venv", "--gpus-per-task=1", "python train.py", *must_have):
        assert text.count(part) == 1, part
    text = text.replace("$HOME/kmp-venv", str(Path(sys.executable).parent.parent))
    if train_args:
        text = text.replace("python train.py", f"python train.py {train_args}")
    text = "\n".join(
        line for line in text.splitlines() if "--gpus-per-task" not in line
    )
    job = work / name
    job.write_text(text + "\n")
    shutil.copy(SCRIPTS / script, work / "train.py")
    shutil.copy(SCRIPTS / "_common.py", work)  # the scripts' shared module
    return job


# Extra environment for srun's tasks: none. (The wheel's PMIx notice under
# srun is avoided by the library itself: runtime.launcher.prepare_mpi_environment.)
SRUN_ENV: dict[str, str] = {}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (.ci/slurm-up starts munged, slurmctld, slurmd)"
    missing = [
        c
        for c in ("srun", "sbatch", "sinfo", "slurmd", "munged")
        if not shutil.which(c)
    ]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install slurm-wlm munge libpmix-dev"
    return None


def _is_up() -> bool:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(s.startswith(("idle", "alloc", "mix")) for s in out.split())


def node_cpus() -> int:
    out = subprocess.run(
        ["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, timeout=20
    ).stdout.split()
    return int(out[0].rstrip("+")) if out and out[0].rstrip("+").isdigit() else 1


@pytest.fixture(scope="session")
def slurm():
    """A running single-node Slurm (skips the test where there can be none)."""
    reason = _why_not()
    if reason:
        pytest.skip(f"Slurm tests: {reason}")
    started = not _is_up()
    if started:
        proc = subprocess.run([str(UP)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            pytest.skip(f"Slurm tests: .ci/slurm-up failed: {proc.stderr[-2000:]}")
    yield node_cpus()
    if started:
        subprocess.run([str(DOWN)], capture_output=True, timeout=120)


def _run(cmd: list[str], name: str, timeout: float, env: dict | None) -> MPIResult:
    return run_job(
        cmd,
        timeout=timeout,
        env={**SRUN_ENV, **(env or {})},
        what="Slurm job",
        on_timeout=lambda: subprocess.run(["scancel", f"--name={name}"], timeout=30),
    )


def run_srun(
    n: int,
    script: str,
    *args: str,
    mpi: str = "pmix",
    timeout: float = 300,
    env: dict | None = None,
    srun_args: tuple[str, ...] = (),
) -> MPIResult:
    """`srun --mpi=MPI -n N python tests/mpi_scripts/SCRIPT ARGS`, killed after `timeout`.

    More tasks than the node has CPUs are allowed (`--overcommit`), as
    `mpirun --oversubscribe` is in tests/mpi_launch.py.
    """
    name = f"kmp-test-{uuid.uuid4().hex[:8]}"
    cmd = [
        "srun",
        f"--job-name={name}",
        f"--mpi={mpi}",
        "-n",
        str(n),
        "--overcommit",
        "--kill-on-bad-exit=1",
        *srun_args,
        sys.executable,
        str(SCRIPTS / script),
        *args,
    ]
    return _run(cmd, name, timeout, env)


def run_sbatch(script: Path, *options: str, timeout: float = 300) -> MPIResult:
    """`sbatch --wait OPTIONS SCRIPT`: returns when the job has ended."""
    name = f"kmp-test-{uuid.uuid4().hex[:8]}"
    return _run(
        ["sbatch", "--wait", f"--job-name={name}", *options, str(script)],
        name,
        timeout,
        None,
    )
