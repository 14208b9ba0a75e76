"""`python -m keras_mpfp16.runtime.launch mpirun ...` (or the console script
`kmp-launch mpirun ...`): a job that lost a node ends.

When a node's link is cut, the library's heartbeats end every rank within
`KERAS_MPFP16_HEARTBEAT_TIMEOUT` (30 s) naming the lost rank and host, and
rank 0 calls `MPI_Abort` — but Open MPI's `mpirun` then waits for the lost
node's daemon forever (measured: still running 90 s after the cut, with
`MPI_Abort` called 1 s after it), and with TCP keepalive flags it ends with
status 0. A batch job would sit until its time limit, or report success.

This wrapper runs the launcher command it is given and tells the ranks
(environment variable `KERAS_MPFP16_LAUNCH_VERDICT`, added with `-x VAR` to
an Open MPI `mpirun`/`mpiexec` and with `-genv VAR VALUE` to Hydra's
`mpiexec`/`mpirun` of MPICH / Intel MPI, each found by its `--version`;
`srun` passes the environment on by default) a file to write when a rank
declares another one lost.
The verdict is written by any rank that can see the file (a rank on the
wrapper's node; any rank with a shared filesystem). Once it exists, the
wrapper gives the launcher `GRACE` seconds to end, kills it (its whole
process group) if it has not, prints the verdict and exits with
`NODE_LOST_EXIT_CODE` (69, `EX_UNAVAILABLE` of `sysexits.h`), even if the
launcher itself exited 0. Without a verdict it exits with the launcher's
status (128+n for a launcher killed by signal n).

Signals: SIGINT, SIGUSR1 and SIGUSR2 are passed on to the launcher; SIGTERM
is passed on as **SIGUSR1**, because `mpirun` kills its ranks about 0.5 s
after a SIGTERM while it forwards SIGUSR1 and waits — so a Slurm
preemption warning reaches the ranks as a request to stop at a step
(`training.preemption`).

`--max-restarts K` (first argument) relaunches a job that lost a node
(lost hosts dropped from the host list, `-np` lowered) or whose launcher
ended by a signal, up to K times (`run`'s `max_restarts`).

Nothing here imports Keras (the package's `__init__` still does, when run
with `-m`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from keras_mpfp16 import _settings as env

VERDICT_ENV = env.setting("LAUNCH_VERDICT").name
NODE_LOST_EXIT_CODE = 69
GRACE = 5.0  # seconds the launcher may take to end by itself after a verdict
_MPI_LAUNCHERS = ("mpirun", "mpiexec", "prterun", "orterun")


def report_lost(message: str, replace: bool = True) -> None:
    """From a rank: records that a rank or node is lost, for the wrapper.

    Does nothing when not run under the wrapper or when the wrapper's
    directory is not visible from this node (another machine).

    Args:
        message: the verdict (its first line names the lost hosts).
        replace: whether to replace a verdict already written. Rank 0's
            verdict (which names the lost hosts) replaces any other; a
            cut-off rank's (`rank 0 ... is unreachable from rank 2 ...`,
            written when its node shares the wrapper's filesystem) is
            written only when there is none yet, so the wrapper never drops
            rank 0's naming of the lost host for it.
    """
    path = env.get("LAUNCH_VERDICT") or ""
    if not path or not os.path.isdir(os.path.dirname(path)):
        return
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(message)
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if a verdict exists: keep that one
            finally:
                os.unlink(tmp)
    except OSError:
        pass  # the rank is ending anyway; the launcher's status is the fallback


def launcher_kind(program: str) -> str:
    """ "open-mpi", "hydra" (MPICH, Intel MPI, MVAPICH) or "other", from the
    launcher's `--version` output (10 s at most)."""
    try:
        out = subprocess.run(
            [program, "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return "other"
    if any(name in text for name in ("Open MPI", "OpenRTE", "PRRTE", "prterun")):
        return "open-mpi"
    # MPICH's and MVAPICH's say "HYDRA build details"; Intel MPI's (Hydra
    # too) only "Intel(R) MPI Library ... Version 2021.18".
    if "HYDRA" in text.upper() or "Intel(R) MPI" in text:
        return "hydra"
    return "other"


def pass_settings(argv: list[str], settings: dict[str, str]) -> list[str]:
    """The launcher command with `settings` (environment variables) passed to
    every rank: Open MPI's `-x NAME` (the value from the launcher's own
    environment); Hydra's `-genv NAME VALUE` (`mpiexec` of MPICH, Intel MPI,
    MVAPICH pass the whole environment by default, but not after a user's
    `-genvnone`; they reject `-x`); nothing for Slurm's `srun` (it passes the
    environment) or another command."""
    if os.path.basename(argv[0]) not in _MPI_LAUNCHERS or not settings:
        return list(argv)
    kind = launcher_kind(argv[0])
    if kind == "open-mpi":
        flags = [w for name in settings for w in ("-x", name)]
    elif kind == "hydra":
        flags = [w for name, v in settings.items() for w in ("-genv", name, v)]
    else:
        return list(argv)
    return [argv[0], *flags, *argv[1:]]


def _command(argv: list[str], verdict: str) -> list[str]:
    """The launcher command with the verdict file's variable passed to the ranks."""
    return pass_settings(argv, {VERDICT_ENV: verdict})


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def lost_hosts(verdict: str) -> list[str]:
    """The hosts rank 0's verdict names as lost (`rank 2 (host node3) is
    unreachable`); none for a verdict written by a cut-off rank about rank 0
    (`... is unreachable from ...`: its own node may be the lost one)."""
    first = verdict.splitlines()[0] if verdict else ""
    if "unreachable from" in first:
        return []
    head = re.split(r" (?:is|are) unreachable", first, maxsplit=1)[0]
    return re.findall(r"\(host ([^)\s]+)\)", head)


# Open MPI's and Hydra's (MPICH, Intel MPI) spellings.
_HOST_FLAGS = ("--host", "-H", "-host", "--hosts", "-hosts")
_HOSTFILE_FLAGS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "-f")
_NP_FLAGS = ("-np", "-n", "--np", "-c")
_PPN_FLAGS = ("-ppn", "-perhost")  # Hydra: ranks per host


def _options_end(argv: list[str]) -> int:
    """Where the launcher's options end: the program (`python`, a path, an
    executable on PATH) after them; the program's own arguments (`-f
    config.yaml`, `-n 5`) are never read as the launcher's."""
    for i in range(1, len(argv)):
        arg = argv[i]
        if arg.startswith("-") or argv[i - 1] in (*_NP_FLAGS, *_PPN_FLAGS):
            continue
        if "python" in os.path.basename(arg) or shutil.which(arg):
            return i
    return len(argv)


def without_hosts(argv: list[str], lost: list[str]) -> tuple[list[str], int]:
    """`argv` with the `lost` hosts dropped from host lists (`--host`/`-H`;
    Hydra's `-hosts a,b` or `a:2,b:2`) and host files (`--hostfile`,
    `--machinefile`, Hydra's `-f`: `name slots=N` or `name:N` lines; a new
    file beside the old one), and `-np`/`-n` lowered by their slots (a host
    without a count: Hydra's `-ppn N` if given, else 1). Returns `(argv,
    slots dropped)`; `argv` unchanged when no lost host is listed."""
    out, dropped = list(argv), 0
    end = _options_end(out)
    ppn = next(
        (
            int(out[i + 1])
            for i in range(end - 1)
            if out[i] in _PPN_FLAGS and out[i + 1].isdigit()
        ),
        1,
    )
    for i, arg in enumerate(out[: end - 1]):
        if arg in _HOST_FLAGS:
            kept = []
            for entry in out[i + 1].split(","):
                name, _, slots = entry.partition(":")
                if name in lost:
                    dropped += int(slots) if slots.isdigit() else ppn
                else:
                    kept.append(entry)
            out[i + 1] = ",".join(kept)
        elif arg in _HOSTFILE_FLAGS:
            with open(out[i + 1]) as f:
                lines = f.read().splitlines()
            kept = []
            for line in lines:
                words = line.split()
                name, _, count = words[0].partition(":") if words else ("", "", "")
                if name in lost:
                    slots = re.search(r"slots=(\d+)", line)
                    if slots:
                        dropped += int(slots.group(1))
                    else:
                        dropped += int(count) if count.isdigit() else ppn
                else:
                    kept.append(line)
            path = f"{out[i + 1]}.kmp-survivors"
            with open(path, "w") as f:
                f.write("\n".join(kept) + "\n")
            out[i + 1] = path
    if dropped:
        for i, arg in enumerate(out[: end - 1]):
            if arg in _NP_FLAGS and out[i + 1].isdigit():
                out[i + 1] = str(int(out[i + 1]) - dropped)
                break
    return out, dropped


def _size(argv: list[str]) -> str:
    for i, arg in enumerate(argv[:-1]):
        if arg in _NP_FLAGS:
            return argv[i + 1]
    return "as before"


def run(argv: list[str], grace: float = GRACE, max_restarts: int = 0) -> int:
    """Runs the launcher command `argv`; returns the status to exit with.

    With `max_restarts` > 0 the command is run again, up to that many times,
    when the job lost a node (a verdict: the lost hosts are dropped from the
    host list and `-np` lowered) or ended by a signal (status >= 128: a rank
    or the launcher killed, e.g. by the OOM killer; the same command). Any
    other status - 1 for a Python exception, 75 for a preemption, 0 - ends
    it. One line on stderr per restart: the reason, the lost hosts, the new
    size."""
    if not argv:
        raise SystemExit(
            "usage: kmp-launch [--max-restarts K] mpirun -np N ... python "
            "train.py (or python -m keras_mpfp16.runtime.launch ...)"
        )
    for attempt in range(max_restarts + 1):
        code, verdict = _run_once(argv, grace)
        if attempt == max_restarts or not (verdict or code >= 128):
            return code
        lost = lost_hosts(verdict) if verdict else []
        argv, _ = without_hosts(argv, lost)
        reason = (
            f"the job lost a rank ({verdict.splitlines()[0]})"
            if verdict
            else f"the launcher ended with status {code} (killed by a signal)"
        )
        sys.stderr.write(
            f"keras_mpfp16.runtime.launch: restart {attempt + 1} of "
            f"{max_restarts}: {reason}; lost hosts: {lost or 'none'}; "
            f"size: {_size(argv)}.\n"
        )
        sys.stderr.flush()
    return code


def _run_once(argv: list[str], grace: float) -> tuple[int, str]:
    """One run of the launcher: `(status to exit with, verdict or "")`."""
    directory = tempfile.mkdtemp(prefix="kmp-launch-")
    verdict = os.path.join(directory, "verdict")
    env = {**os.environ, VERDICT_ENV: verdict}
    proc = subprocess.Popen(_command(argv, verdict), env=env, start_new_session=True)

    def forward(signum, frame):
        sent = signal.SIGUSR1 if signum == signal.SIGTERM else signum
        try:
            os.kill(proc.pid, sent)
        except ProcessLookupError:
            pass

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        seen, killed = None, False
        while True:
            code = proc.poll()
            if seen is None and os.path.exists(verdict):
                seen = time.monotonic()
            if code is not None:
                break
            if seen is not None and time.monotonic() - seen >= grace:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed = True
                break
            time.sleep(0.2)
        if seen is None and os.path.exists(verdict):
            seen = time.monotonic()
        if seen is None:
            return _status(proc.returncode), ""
        with open(verdict) as f:
            message = f.read().strip()
        if killed:
            ended = f"did not end within {grace:g}s of it and was killed"
        else:
            ended = f"ended with status {_status(proc.returncode)}"
        sys.stderr.write(
            f"keras_mpfp16.runtime.launch: {message}\n"
            f"keras_mpfp16.runtime.launch: the job lost a rank; the launcher "
            f"{ended}; exiting with status {NODE_LOST_EXIT_CODE}.\n"
        )
        return NODE_LOST_EXIT_CODE, message
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    argv = sys.argv[1:]
    restarts = 0
    if argv and argv[0].startswith("--max-restarts"):
        value = argv[0].partition("=")[2] if "=" in argv[0] else None
        if value is None:
            value = argv[1] if len(argv) > 1 else ""
            argv = argv[2:]
        else:
            argv = argv[1:]
        if not value.isdigit():
            raise SystemExit(
                f"keras_mpfp16.runtime.launch: --max-restarts must be a whole "
                f"number >= 0; received {value!r}."
            )
        restarts = int(value)
    if argv and argv[0] == "--":
        argv = argv[1:]
    sys.exit(run(argv, max_restarts=restarts))


if __name__ == "__main__":
    main()
