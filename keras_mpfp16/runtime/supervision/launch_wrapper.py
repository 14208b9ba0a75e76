"""`python -m keras_mpfp16.runtime.launch mpirun ...` (or the console script
`kmp-launch mpirun ...`): a job that lost a node ends.

When a node's link is cut, the library's heartbeats end every rank within
`KERAS_MPFP16_HEARTBEAT_TIMEOUT` (30 s) naming the lost rank and host, and
rank 0 calls `MPI_Abort` — but Open MPI's `mpirun` then waits for the lost
node's daemon forever (measured: still running 90 s after the cut, with
`MPI_Abort` called 1 s after it), and with TCP keepalive flags it ends with
status 0. A batch job would sit until its time limit, or report success.

This wrapper runs the launcher command it is given and reads its output.
A rank that declares the job lost a rank or node (rank 0 for any rank; for
rank 0, the lowest-numbered rank that still reaches the others) writes one
verdict line to its standard error: a 0x1e byte, `keras_mpfp16-verdict`,
the job's token and a JSON object with the lost hosts and the message. The
launcher forwards it like any output, so it reaches the wrapper wherever
the wrapper runs (a login node, a batch node) with no shared filesystem,
and only from ranks whose node still reaches the launcher (a cut-off node's
output does not get through). The token is a random secret made per launch
and given to the ranks in `KERAS_MPFP16_LAUNCH_VERDICT` (added with `-x VAR`
to an Open MPI `mpirun`/`mpiexec` and with `-genv VAR VALUE` to Hydra's
`mpiexec`/`mpirun` of MPICH / Intel MPI, each found by its `--version`;
`srun` passes the environment on by default): a
line with another token (a forged or stale verdict, another job's output)
is passed on as output and not acted on. Every other byte is passed on
unchanged and at once (`VerdictFilter`); verdict lines are taken out.

After a verdict the wrapper gives the launcher `GRACE` seconds to end,
kills it (its whole process group) if it has not (Open MPI's `mpirun`
waits for a lost node's daemon forever), prints the verdict and exits with
`NODE_LOST_EXIT_CODE` (69, `EX_UNAVAILABLE` of `sysexits.h`), whatever the
launcher's own status (`mpirun` may exit 0 after losing rank 0's node).
Without a verdict it exits with the launcher's status (128+n for a
launcher killed by signal n).

Signals: SIGINT, SIGUSR1 and SIGUSR2 are passed on to the launcher; SIGTERM
is passed on as **SIGUSR1**, because `mpirun` kills its ranks about 0.5 s
after a SIGTERM while it forwards SIGUSR1 and waits — so a Slurm
preemption warning reaches the ranks as a request to stop at a step
(`training.preemption`).

`--max-restarts K` (first argument) relaunches a job that lost a node
(lost hosts dropped from the host list, `-np` lowered) or whose launcher
ended by a signal, up to K times (`run`'s `max_restarts`); a job that lost
a node once more with no restart left ends with 69 and one line saying so.

Start-up watchdog: before the heartbeats run (a node lost before or
during `MPI_Init` leaves the other ranks there forever), each rank reports
`report_start("boot")` as `init` starts MPI and `report_start("up")` once
its services run, on the same token lines. Once a rank has booted,
`KERAS_MPFP16_STARTUP_TIMEOUT` seconds (600) with no new report and not
every rank up end the
launch with a verdict naming the listed hosts none of whose ranks booted
(none named: 69, no relaunch on the same list).

Nothing here imports Keras (the package's `__init__` still does, when run
with `-m`).
"""

from __future__ import annotations

import argparse
import difflib
import hmac
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from keras_mpfp16 import _settings as env

VERDICT_ENV = env.setting("LAUNCH_VERDICT").name
_STARTUP_ENV = env.setting("STARTUP_TIMEOUT").name
_STARTUP_FAILED = "start-up did not complete"  # the start-up watchdog's verdict
NODE_LOST_EXIT_CODE = 69
GRACE = 5.0  # seconds the launcher may take to end by itself after a verdict
_DRAIN = 1.0  # seconds to read the launcher's last output after it ended
_MPI_LAUNCHERS = ("mpirun", "mpiexec", "prterun", "orterun")


# A verdict line: MARK, the job's token, then a JSON object. It starts with
# ASCII's record separator (0x1e), which ordinary output does not contain:
# the wrapper forwards every other byte at once and holds back only what
# follows a 0x1e until its line ends.
MARK = b"\x1ekeras_mpfp16-verdict "
_MAX_LINE = 3800  # below PIPE_BUF (4096): one write reaches the pipe whole
_HELD_MAX = 65536  # a "line" this long after a 0x1e is not a verdict


def report_lost(message: str, hosts: list[str] | tuple[str, ...] = ()) -> None:
    """From a rank: tells the wrapper that the job lost a rank or node.

    Writes one verdict line to this process's standard error (file
    descriptor 2), which every launcher forwards to its own: the wrapper
    reads it there, wherever it runs (a login node, a batch node), with no
    shared filesystem. The line carries the job's token (the wrapper's
    `KERAS_MPFP16_LAUNCH_VERDICT`): the wrapper acts only on lines with its
    own token, and does not pass them on. Does nothing when not run under
    the wrapper.

    Args:
        message: the verdict, for the wrapper's output.
        hosts: the hosts declared lost (dropped from the host list on a
            restart).
    """
    token = env.get("LAUNCH_VERDICT") or ""
    if not token:
        return
    _write_line(verdict_line(token, message, hosts))


def report_start(phase: str) -> None:
    """From a rank, under the wrapper: its start-up reached `phase`
    (`"boot"`: `init` is about to start MPI; `"up"`: MPI and the job's
    services, heartbeats included, are running). One token line on
    standard error, like a verdict, that the wrapper takes out: its
    start-up watchdog names the hosts none of whose ranks booted when the
    ranks are not all up in time. Does nothing when not run under the
    wrapper."""
    token = env.get("LAUNCH_VERDICT") or ""
    if not token:
        return
    body = json.dumps({"start": phase, "host": socket.gethostname()})
    _write_line(MARK + token.encode() + b" " + body.encode() + b"\n")


def _write_line(line: bytes) -> None:
    try:
        sys.stderr.flush()
    except Exception:
        pass
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(2, view) :]
    except OSError:
        pass  # the rank is ending anyway; the launcher's status is the fallback


def verdict_line(token: str, message: str, hosts=()) -> bytes:
    """The bytes of one verdict line (at most `_MAX_LINE`: a long message is
    cut to its first line, then to its start; the hosts are always whole)."""
    hosts = sorted({str(h) for h in hosts})
    for text in (message, message.split("\n", 1)[0]):
        body = json.dumps({"lost": hosts, "message": text}, ensure_ascii=True)
        line = MARK + token.encode() + b" " + body.encode() + b"\n"
        if len(line) <= _MAX_LINE:
            return line
    room = max(0, _MAX_LINE - len(line) + len(text) - 16)
    body = json.dumps({"lost": hosts, "message": text[:room] + " ..."})
    return MARK + token.encode() + b" " + body.encode() + b"\n"


class Verdict(NamedTuple):
    """A verdict read from the ranks' output: its message and lost hosts."""

    message: str
    hosts: list[str]


class Start(NamedTuple):
    """A rank's start-up report (`report_start`): the phase and its host."""

    phase: str
    host: str


class VerdictFilter:
    """Passes a launcher's output on, taking out the verdict lines that carry
    `token`.

    `feed(bytes)` returns the bytes to write on at once: everything except
    what follows a 0x1e byte on an unfinished line (held until its newline:
    a verdict line is then dropped, any other passed on as it was);
    `finish()` the bytes still held at the end of the stream. Lines with
    the marker but another token, or that do not parse, are passed on
    unchanged and not acted on; they are counted in `refused`. Found
    verdicts are appended to `verdicts`, the ranks' start-up reports
    (taken out too) to `starts`. Prefixes a launcher adds to each
    line (`--tag-output`'s `[1,2]<stderr>:`, `srun --label`'s `2: `) are
    allowed before the marker.
    """

    def __init__(self, token: str):
        self.token = token.encode()
        self.verdicts: list[Verdict] = []
        self.starts: list[Start] = []
        self.refused = 0
        self._held = b""
        self._open = False  # part of the current line was already passed on

    def feed(self, data: bytes) -> bytes:
        if not self._held and b"\x1e" not in data:  # no verdict: pass it all
            nl = data.rfind(b"\n")
            self._open = (self._open or bool(data)) if nl < 0 else nl < len(data) - 1
            return data
        data = self._held + data
        self._held = b""
        out = []
        while True:
            nl = data.find(b"\n")
            if nl < 0:
                break
            line, data = data[: nl + 1], data[nl + 1 :]
            verdict, at = self._parse(line)
            if verdict is None:
                out.append(line)
            else:  # pass on a launcher's prefix, if any, as a line of its own
                if isinstance(verdict, Start):
                    self.starts.append(verdict)
                else:
                    self.verdicts.append(verdict)
                if self._open or at > 0:
                    out.append(line[:at] + b"\n")
            self._open = False
        cut = data.find(b"\x1e")
        if cut < 0 or len(data) - cut > _HELD_MAX:
            cut = len(data)
        out.append(data[:cut])
        self._open = self._open or cut > 0
        self._held = data[cut:]
        return b"".join(out)

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def _parse(self, line: bytes) -> tuple[Verdict | Start | None, int]:
        """`(the verdict or start-up report, where its marker starts)`;
        `(None, -1)` for any other line."""
        at = line.find(MARK)
        if at < 0:
            return None, -1
        rest = line[at + len(MARK) :].rstrip(b"\r\n")
        token, _, body = rest.partition(b" ")
        if not hmac.compare_digest(token, self.token):
            self.refused += 1
            return None, -1
        try:
            fields = json.loads(body)
            if "start" in fields:
                return Start(str(fields["start"]), str(fields["host"])), at
            hosts = [str(h) for h in fields["lost"]]
            message = str(fields["message"])
        except (ValueError, KeyError, TypeError):
            self.refused += 1
            return None, -1
        return Verdict(message, hosts), at


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


def _command(argv: list[str], token: str) -> list[str]:
    """The launcher command with the verdict token's variable passed to the ranks."""
    return pass_settings(argv, {VERDICT_ENV: token})


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


# Open MPI's and Hydra's (MPICH, Intel MPI) spellings.
_HOST_FLAGS = ("--host", "-H", "-host", "--hosts", "-hosts")
_HOSTFILE_FLAGS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "-f")
_NP_FLAGS = ("-np", "-n", "--np", "-c")
_PPN_FLAGS = ("-ppn", "-perhost")  # Hydra: ranks per host


# Launcher options whose values may be an executable (an ssh stand-in, a
# launch agent) or anything else that is not the program: their values are
# skipped when looking for where the options end. One value: Hydra's
# `-launcher ssh`, `-launcher-exec`/`-bootstrap-exec PATH` and others,
# Open MPI's `--launch-agent PATH`.
# Two: `--mca`/`--prtemca NAME VALUE` (`--prtemca plm_ssh_agent PATH`),
# Hydra's `-genv`/`-env NAME VALUE`.
_ONE_VALUE = (
    *_NP_FLAGS,
    *_PPN_FLAGS,
    "-launcher",  # `-launcher ssh`: ssh is on PATH
    "-bootstrap",
    "-launcher-exec",
    "-bootstrap-exec",
    "-rmk",
    "-iface",
    "-localhost",
    "-demux",
    "-wdir",
    "--launch-agent",
    "-launch-agent",
)
_TWO_VALUES = (
    "--mca",
    "-mca",
    "--gmca",
    "-gmca",
    "--prtemca",
    "-prtemca",
    "--pmixmca",
    "-pmixmca",
    "-genv",
    "-env",
)


def _options_end(argv: list[str]) -> int:
    """Where the launcher's options end: the program (`python`, a path, an
    executable on PATH) after them; the program's own arguments (`-f
    config.yaml`, `-n 5`) are never read as the launcher's, and the values
    of options that take a path or two words (`-launcher-exec
    /path/agent`, `--prtemca plm_ssh_agent /path/agent`) are not the
    program."""
    skip = 0
    for i in range(1, len(argv)):
        arg = argv[i]
        if skip:
            skip -= 1
            continue
        if arg in _ONE_VALUE:
            skip = 1
            continue
        if arg in _TWO_VALUES:
            skip = 2
            continue
        if arg.startswith("-"):
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


def listed_hosts(argv: list[str]) -> list[str]:
    """The host names of `argv`'s host lists (`--host`/`-H`/`-hosts`) and
    host files, in order; empty when it names none."""
    names = []
    end = _options_end(argv)
    for i, arg in enumerate(argv[: end - 1]):
        if arg in _HOST_FLAGS:
            names += [e.partition(":")[0] for e in argv[i + 1].split(",") if e]
        elif arg in _HOSTFILE_FLAGS:
            try:
                with open(argv[i + 1]) as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                words = line.split("#", 1)[0].split()
                if words:
                    names.append(words[0].partition(":")[0])
    return list(dict.fromkeys(names))


def _startup_timeout() -> float:
    """Seconds a start-up may go without a rank's report (`report_start`)
    before the wrapper gives up on it, once the first rank started MPI
    (`KERAS_MPFP16_STARTUP_TIMEOUT`; 0: no watchdog)."""
    return float(env.get("STARTUP_TIMEOUT"))


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
    size; and one line when a job that lost a node has no restart left
    (status 69, whatever the launcher's own status was)."""
    if not argv:
        raise SystemExit(
            "usage: kmp-launch [--max-restarts K] mpirun -np N ... python "
            "train.py (or python -m keras_mpfp16.runtime.launch ...)"
        )
    for attempt in range(max_restarts + 1):
        code, verdicts, ended = _run_once(argv, grace)
        lost = sorted({h for v in verdicts for h in v.hosts})
        if verdicts:
            for message in dict.fromkeys(v.message for v in verdicts):
                _say(message)
            code = NODE_LOST_EXIT_CODE
        if not (verdicts or code >= 128):
            return code
        last = attempt == max_restarts
        if verdicts:
            if not last:
                end = "."
            elif max_restarts:
                end = (
                    f"; no restart left (--max-restarts {max_restarts}); exiting "
                    f"with status {NODE_LOST_EXIT_CODE}."
                )
            else:
                end = f"; exiting with status {NODE_LOST_EXIT_CODE}."
            _say(
                f"the job lost a rank (lost hosts: {', '.join(lost) or 'none named'}); "
                f"the launcher {ended}{end}"
            )
        if last:
            return code
        if not lost and any(v.message.startswith(_STARTUP_FAILED) for v in verdicts):
            # Every listed host's ranks started, yet the start-up stopped
            # (a node lost inside MPI_Init): the same host list would wait
            # for the lost node's daemon before any rank starts, unseen.
            _say(
                "no lost host can be named in a start-up that stopped; not "
                f"restarting on the same hosts; exiting with status {NODE_LOST_EXIT_CODE}."
            )
            return NODE_LOST_EXIT_CODE
        survivors, _ = without_hosts(argv, lost)
        size = _size(survivors)
        if (size.lstrip("-").isdigit() and int(size) <= 0) or any(
            a in _HOST_FLAGS and not b for a, b in zip(survivors, survivors[1:])
        ):
            _say(
                f"no host is left to restart on without {', '.join(lost)}; "
                f"exiting with status {NODE_LOST_EXIT_CODE}."
            )
            return NODE_LOST_EXIT_CODE
        argv = survivors
        reason = (
            f"the job lost a rank ({verdicts[0].message.splitlines()[0]})"
            if verdicts
            else f"the launcher ended with status {code} (killed by a signal)"
        )
        _say(
            f"restart {attempt + 1} of {max_restarts}: {reason}; lost hosts: "
            f"{lost or 'none'}; size: {_size(argv)}."
        )
    return code


def _say(line: str) -> None:
    sys.stderr.write(f"keras_mpfp16.runtime.launch: {line}\n")
    sys.stderr.flush()


def _pump(source: int, sink: int, filt: VerdictFilter, found: threading.Event) -> None:
    """Copies the launcher's output (`source`) to ours (`sink`) as it comes,
    taking the verdicts out; sets `found` at a verdict. Ends at EOF."""
    writable = True

    def write(data: bytes) -> None:
        nonlocal writable
        view = memoryview(data)
        while view and writable:
            try:
                view = view[os.write(sink, view) :]
            except InterruptedError:
                continue
            except OSError:  # our output is gone: keep reading (verdicts)
                writable = False

    try:
        while True:
            try:
                data = os.read(source, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            write(filt.feed(data))
            if filt.verdicts:
                found.set()
        write(filt.finish())
    finally:
        os.close(source)


def _run_once(argv: list[str], grace: float) -> tuple[int, list[Verdict], str]:
    """One run of the launcher: `(its status, the verdicts read from its
    output, how it ended)`. A launcher still running `grace` seconds after
    the first verdict is killed (its whole process group)."""
    token = secrets.token_hex(16)
    env = {**os.environ, VERDICT_ENV: token}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    proc = subprocess.Popen(
        _command(argv, token),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    found = threading.Event()
    filters = [VerdictFilter(token), VerdictFilter(token)]
    pumps = []
    for pipe, sink, filt in zip((proc.stdout, proc.stderr), (1, 2), filters):
        fd = os.dup(pipe.fileno())
        pipe.close()
        pump = threading.Thread(target=_pump, args=(fd, sink, filt, found), daemon=True)
        pump.start()
        pumps.append(pump)

    def forward(signum, frame):
        sent = signal.SIGUSR1 if signum == signal.SIGTERM else signum
        try:
            os.kill(proc.pid, sent)
        except ProcessLookupError:
            pass

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    # The start-up watchdog: a node lost before the ranks are up (during
    # MPI_Init or before the heartbeats run) leaves the others waiting in
    # MPI_Init forever, with no heartbeat to notice.
    startup = _startup_timeout()
    ranks = _size(argv)
    ranks = int(ranks) if ranks.isdigit() else 0
    hosts = listed_hosts(argv)
    reports, last_report, own = 0, 0.0, []
    try:
        seen, killed = None, False
        while proc.poll() is None:
            if seen is None and found.is_set():
                seen = time.monotonic()
            if seen is None and startup and ranks:
                starts = [x for f in filters for x in f.starts]
                up = sum(x.phase == "up" for x in starts)
                if len(starts) > reports:  # start-up moves: a new report
                    reports, last_report = len(starts), time.monotonic()
                if up >= ranks:
                    startup = 0.0  # every rank is up: the heartbeats take over
                elif reports and time.monotonic() - last_report >= startup:
                    booted = {x.host for x in starts if x.phase == "boot"}
                    missing = [h for h in hosts if h not in booted]
                    where = (
                        f"no rank on {', '.join(missing)} started"
                        if missing
                        else "every listed host's ranks started"
                    )
                    own.append(
                        Verdict(
                            f"{_STARTUP_FAILED}: {up} of {ranks} ranks "
                            f"up, no rank's start-up moved on for {startup:g}s "
                            f"({_STARTUP_ENV}); "
                            f"{where}.",
                            missing,
                        )
                    )
                    seen = time.monotonic() - grace  # the ranks wait: end it now
                    continue
            if seen is not None and time.monotonic() - seen >= grace:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                killed = True
                break
            if seen is None:
                found.wait(0.2)  # wakes at once at a verdict
            else:
                time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # The last output (a verdict written just before the ranks aborted) may
    # still be in the pipes; a process left holding them (a daemon out of
    # the launcher's process group) must not keep the wrapper waiting.
    deadline = time.monotonic() + _DRAIN
    for pump in pumps:
        pump.join(max(0.0, deadline - time.monotonic()))
    verdicts = own + [v for f in filters for v in f.verdicts]
    if killed and own:
        ended = "was killed"
    elif killed:
        ended = f"did not end within {grace:g}s of the verdict and was killed"
    else:
        ended = f"ended with status {_status(proc.returncode)}"
    return _status(proc.returncode), verdicts, ended


def _restarts(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(
            f"--max-restarts must be a whole number >= 0; received {value!r}."
        )
    return int(value)


_HELP_EPILOG = f"""\
what it passes to the job:
  {VERDICT_ENV}
      a secret token made per launch: a rank whose heartbeats declare another
      rank or node lost writes one token-marked verdict line on its stderr,
      which the launcher forwards to this wrapper (added as `-x {VERDICT_ENV}`
      to Open MPI's mpirun/mpiexec, as `-genv {VERDICT_ENV} TOKEN` to Hydra's
      mpiexec of MPICH / Intel MPI; Slurm's srun passes the environment on by
      itself). Set by the wrapper, not by users.
  signals: SIGINT, SIGUSR1, SIGUSR2 are passed on to the launcher; SIGTERM
      is passed on as SIGUSR1 (the ranks stop at a step and save).

exit status:
  the launcher's (128+n if it was killed by signal n); {NODE_LOST_EXIT_CODE} when the job
  lost a node (the verdict is printed); 127 when the launcher is not found;
  126 when it is not executable; 2 for a bad option.

examples:
  kmp-launch mpirun -np 4 --hostfile hosts python train.py
  kmp-launch --max-restarts 2 srun --mpi=pmix -n 8 python train.py
"""


def _parser(prog: str) -> argparse.ArgumentParser:
    """`kmp-launch`'s options: they come before the launcher; everything from
    the launcher on is run as given."""
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [-h] [--max-restarts K] [--] LAUNCHER [ARG ...]",
        description="Runs a launcher command (mpirun, mpiexec, srun) and ends the "
        "job when a node is lost: the ranks' heartbeats name the lost rank, the "
        "wrapper kills the launcher (which would wait forever) and exits "
        f"{NODE_LOST_EXIT_CODE}. Everything from LAUNCHER on is passed as given.",
        epilog=_HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--max-restarts",
        metavar="K",
        type=_restarts,
        default=0,
        help="relaunch a job that lost a node (lost hosts dropped from --host/"
        "--hostfile, -np lowered) or whose launcher was killed by a signal, up "
        "to K times (default 0: never)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="LAUNCHER [ARG ...]",
        help="the launch command, e.g. mpirun -np 4 python train.py",
    )
    return parser


def _launcher_problem(program: str) -> tuple[int, str] | None:
    """`(status, message)` when `program` cannot be run, as a shell says it
    (127: not found, 126: not executable); None when it can."""
    if shutil.which(program) is not None:
        return None
    if os.sep in program and os.path.exists(program):
        return 126, f"launcher {program!r} is not an executable file"
    known = (*_MPI_LAUNCHERS, "srun", "mpiexec.hydra")
    name = os.path.basename(program)
    close = [] if name in known else difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = "" if os.sep in program else " on PATH"
    return 127, f"launcher {program!r} not found{where}{hint}"


def main(argv: list[str] | None = None) -> None:
    """`kmp-launch [--max-restarts K] LAUNCHER ARG...`; `-h` for the options."""
    argv = sys.argv[1:] if argv is None else argv
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    prog = "python -m keras_mpfp16.runtime.launch"
    if script == "kmp-launch":
        prog = "kmp-launch"
    parser = _parser(prog)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(
            f"unrecognized option {unknown[0]!r}; {prog}'s options come before "
            f"the launcher: {prog} [--max-restarts K] mpirun -np N python train.py"
        )
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the launch command is missing, e.g. mpirun -np 2 python train.py")
    problem = _launcher_problem(command[0])
    if problem is None:
        try:
            sys.exit(run(command, max_restarts=args.max_restarts))
        except OSError as e:  # found but could not be started (exec format)
            if e.filename != command[0]:
                raise  # another file (a hostfile, the temporary directory)
            problem = (
                127 if isinstance(e, FileNotFoundError) else 126,
                f"cannot run launcher {command[0]!r}: {e.strerror or e}",
            )
    status, message = problem
    sys.stderr.write(f"{prog}: {message}\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
