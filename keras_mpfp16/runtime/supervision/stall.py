"""Stall inspector: say which ranks a collective waits for, and end hangs.

Every collective the library issues is numbered and named on each rank
(`collective(name)`). A daemon thread on each rank talks to rank 0 over a
private communicator:

* it reports when its rank has waited in a collective for more than a second,
  and when its rank has finished (at interpreter exit);
* it exchanges heartbeats with rank 0 (every rank with rank 0, both ways), so
  a rank whose node, process or network link is gone is noticed even though
  MPI itself would wait for it forever (a cut TCP link sends no reset).

Rank 0 watches the reports and

* warns, every `timeout` seconds, while some ranks wait for others, naming the
  ranks that have not arrived and what each rank is doing;
* ends the job with a clear error as soon as ranks provably cannot meet: one
  rank has finished while others wait in a collective, or ranks wait in
  *different* collectives. The message says what each rank is doing (the
  collective's name and sequence number) and blames uneven batches only when
  the ranks' train steps show it;
* ends the job when a rank has been silent for `heartbeat` seconds, naming
  the rank and its host; a rank that has not heard from rank 0 for that long
  leaves by itself, naming rank 0 and its host (the launcher may be
  unreachable too, so it does not rely on it);
* ends a job that makes no progress for `hang` seconds (a collective that
  has kept ranks waiting that long), naming the rank that did not arrive,
  its host and what it was last doing (`KERAS_MPFP16_HANG_TIMEOUT`, 30
  minutes by default);
* optionally aborts a stall (or, on rank 0, a wait for the others at exit)
  that lasts `abort_after` seconds.

Configuration (environment, read on rank 0 and used by every rank):
`KERAS_MPFP16_STALL_TIMEOUT` (seconds, default 60; 0 turns the inspector and
the heartbeats off), `KERAS_MPFP16_STALL_ABORT` (seconds, default 0 = never
abort a mere stall) and `KERAS_MPFP16_HEARTBEAT_TIMEOUT` (seconds of silence
after which a rank counts as lost, default 30; 0 turns heartbeats off), or
`configure()`. The thread calls MPI concurrently with the main thread, so it
only runs when MPI provides `MPI_THREAD_MULTIPLE` (mpi4py's default); with a
lower thread level the inspector stays off and rank 0 says so once.

The messages are named types (`stall_messages.py`); the text of the
warnings and errors is built in `stall_diagnosis.py`. The inspector sees the
MPI layer's collectives through its observer hook (`runtime.mpi.observers`).

Nothing here imports Keras.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from contextlib import contextmanager

from keras_mpfp16 import _settings as env
from keras_mpfp16 import _validate
from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.mpi import observers
from keras_mpfp16.runtime.supervision import launcher_daemon
from keras_mpfp16.runtime.supervision.stall_diagnosis import (
    cause_different,
    cause_finished,
    describe,
    no_progress,
    train_step_of,
)
from keras_mpfp16.runtime.supervision.stall_messages import (
    Beat,
    Finished,
    Left,
    Report,
    Suspect,
    Wait,
)

# Registered (with their defaults) in _settings.py.
TIMEOUT_ENV = env.setting("STALL_TIMEOUT").name
ABORT_ENV = env.setting("STALL_ABORT").name
HANG_ENV = env.setting("HANG_TIMEOUT").name
HEARTBEAT_ENV = env.setting("HEARTBEAT_TIMEOUT").name
DEFAULT_TIMEOUT = env.setting("STALL_TIMEOUT").default
DEFAULT_HEARTBEAT = env.setting("HEARTBEAT_TIMEOUT").default
_TAG = 7
_REPORT_AFTER = 1.0  # seconds of waiting before a rank tells rank 0
# A conflict (ranks in different collectives, or finished while others wait)
# must persist this long before the job is ended: reports travel
# asynchronously, so rank 0 may briefly hold a stale "wait" from a rank whose
# "left" message is still in flight.
_CONFLICT_GRACE = 3.0
_POLL = 0.2
# How long a finishing rank waits for its last reports to leave.
_FLUSH_DEADLINE = 10.0
# Seconds between writing a verdict line and calling MPI_Abort.
_VERDICT_FLUSH = 1.0


class _Local:
    """What this rank is doing; written by the main thread, read by the watcher."""

    def __init__(self):
        self.seq = 0  # collectives entered so far
        self.name = ""  # name of the current (or last) collective
        self.previous = ""  # name of the collective before it
        self.since: float | None = None  # monotonic time of entry, None when not inside
        self.reported_seq = 0  # last seq reported to rank 0 as waiting
        self.last_step: int | None = None  # train step of the last train collective


class Inspector:
    """The per-rank watcher. Create with `start()`; one per process.

    Args:
        comm: a private mpi4py communicator (every rank's inspector uses it).
        timeout: seconds between stall warnings.
        abort_after: end a stall after this many seconds (0 = never).
        heartbeat: seconds of silence after which a rank is declared lost
            (0 = no heartbeats).
        hosts: every rank's host name, in rank order (for messages).
        hang: end the job after this many seconds without progress
            (0 = never).
    """

    def __init__(
        self,
        comm,
        timeout: float,
        abort_after: float,
        heartbeat: float = 0.0,
        hosts: list[str] | None = None,
        hang: float = 0.0,
    ):
        self.comm = comm
        self.hang = hang
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        self.abort_after = abort_after
        self.heartbeat = heartbeat
        self.hosts = list(hosts) if hosts else ["?"] * self.size
        self.local = _Local()
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._finished_at: float | None = None
        # Outstanding isend requests; only touched under `_send_lock`.
        self._pending: list = []
        self._send_lock = threading.Lock()
        # rank 0's view: each rank's last Wait or Finished (none: not in a
        # collective).
        self.table: dict[int, Report] = {}
        self._last_warning = 0.0
        # `table` is written by the main thread and the watcher on rank 0.
        self._lock = threading.Lock()
        # `local`, and the order in which its reports are sent.
        self._state_lock = threading.Lock()
        self._conflict: tuple | None = None  # (signature, first seen) of a conflict
        now = time.monotonic()
        # Heartbeats: when we last heard from each peer, when we last beat.
        self._heard = {r: now for r in range(self.size)}
        self._last_beat = 0.0
        self._beat_every = (
            min(1.0, max(_POLL, heartbeat / 10.0)) if heartbeat else float("inf")
        )
        # Seconds the ranks that noticed rank 0's silence wait for each
        # other's word (they notice within a beat and a poll of each other).
        self._agree = 2 * self._beat_every + 1.0 if heartbeat else 0.0
        self._failed = False
        # Rank 0 lost: when this rank noticed, and which other ranks said
        # they noticed too (`Suspect`); the lowest of them speaks.
        self._suspect_since: float | None = None
        self._suspects: set[int] = set()
        # Point-to-point messages this rank's watcher sent and received, by
        # kind ("Beat", "Wait", ...): what the inspector costs (docs/scaling.md).
        self.sent: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self._thread = threading.Thread(
            target=self._run, name="keras_mpfp16-stall", daemon=True
        )

    def where(self, rank: int) -> str:
        """`'rank 2 (host node3)'`."""
        return f"rank {rank} (host {self.hosts[rank]})"

    # -- main thread ----------------------------------------------------------

    @contextmanager
    def collective(self, name: str):
        local = self.local
        with self._state_lock:
            local.seq += 1
            local.previous = local.name
            local.name = name
            local.since = time.monotonic()
            step = train_step_of(name)
            if step is not None:
                local.last_step = step
        try:
            yield
        finally:
            # Under the lock, so a "left" can never be sent before the
            # watcher's "wait" for the same collective.
            with self._state_lock:
                local.since = None
                if local.reported_seq == local.seq:
                    self._send(Left(local.seq))

    def finish(self, how: str = "its script ended") -> None:
        """Called at exit: tell rank 0, and on rank 0 wait for everyone.

        Rank 0 waits while the other ranks are alive (they keep sending
        heartbeats) and not provably stuck; it gives up when a rank falls
        silent for the heartbeat timeout, when ranks cannot meet, or after
        `abort_after` seconds when that is set.
        """
        if self._finished.is_set():
            return
        self._finished.set()
        self._finished_at = time.monotonic()
        with self._state_lock:
            msg = Finished(
                seq=self.local.seq,
                name=self.local.name,
                last_step=self.local.last_step,
                how=how,
            )
            self._send(msg)
        if self.rank != 0:
            deadline = time.monotonic() + _FLUSH_DEADLINE
            while time.monotonic() < deadline:
                with self._send_lock:
                    self._prune()
                    if not self._pending:
                        break
                time.sleep(0.01)
            self._stop.set()
            return
        # Rank 0 leaves only when everyone has finished (MPI_Finalize would
        # wait for them anyway); the watcher aborts if they cannot.
        while self._count_finished() < self.size:
            if not self._thread.is_alive():
                break
            time.sleep(_POLL)
        self._stop.set()

    def _count_finished(self) -> int:
        with self._lock:
            return sum(1 for v in self.table.values() if isinstance(v, Finished))

    # -- messages -------------------------------------------------------------

    def _prune(self) -> None:
        """Drops completed sends. Caller holds `_send_lock`."""
        self._pending = [r for r in self._pending if not r.Test()]

    def _send_to(self, dest: int, msg) -> None:
        with self._send_lock:
            self._prune()
            self._pending.append(self.comm.isend((self.rank, msg), dest=dest, tag=_TAG))
            kind = type(msg).__name__
            self.sent[kind] = self.sent.get(kind, 0) + 1

    def _send(self, msg) -> None:
        """A report to rank 0 (applied directly on rank 0)."""
        if self.rank == 0:
            self._update(0, msg)
            return
        self._send_to(0, msg)

    def _update(self, rank: int, msg) -> None:
        with self._lock:
            self._apply(rank, msg)

    def _apply(self, rank: int, msg) -> None:
        if isinstance(msg, (Wait, Finished)):
            self.table[rank] = msg
        elif isinstance(msg, Left):
            entry = self.table.get(rank)
            if isinstance(entry, Wait) and entry.seq == msg.seq:
                del self.table[rank]

    # -- watcher thread -------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._tick()
                time.sleep(_POLL)
        except Exception as exc:  # the watcher must never die silently
            if not self._stop.is_set():
                sys.stderr.write(
                    f"keras_mpfp16: the stall inspector on rank {self.rank} stopped: "
                    f"{type(exc).__name__}: {exc}\n"
                )

    def _tick(self) -> None:
        local = self.local
        with self._state_lock:
            since = local.since
            if (
                since is not None
                and time.monotonic() - since > _REPORT_AFTER
                and local.reported_seq != local.seq
            ):
                local.reported_seq = local.seq
                started = time.time() - (time.monotonic() - since)
                self._send(Wait(local.seq, local.name, started, local.last_step))
        self._drain()
        if self.heartbeat:
            self._beat()
            self._check_heartbeats()
        if self.rank == 0:
            self._check()

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < self._beat_every:
            return
        self._last_beat = now
        if self.rank != 0:
            self._send_to(0, Beat())
            return
        with self._lock:
            done = {r for r, e in self.table.items() if isinstance(e, Finished)}
        for r in range(1, self.size):
            if r not in done:
                self._send_to(r, Beat())

    def _drain(self) -> None:
        from mpi4py import MPI

        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_TAG, status=status):
            rank, msg = self.comm.recv(source=status.Get_source(), tag=_TAG)
            self._heard[rank] = time.monotonic()
            kind = type(msg).__name__
            self.received[kind] = self.received.get(kind, 0) + 1
            if isinstance(msg, Suspect):
                self._suspects.add(rank)
            elif self.rank == 0 and not isinstance(msg, Beat):
                self._update(rank, msg)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        if self.rank != 0:
            silent = now - self._heard[0]
            if silent >= self.heartbeat and not self._finished.is_set():
                self._rank_0_silent(now, silent)
            return
        with self._lock:
            done = {r for r, e in self.table.items() if isinstance(e, Finished)}
        lost = [
            r
            for r in range(1, self.size)
            if r not in done and now - self._heard[r] >= self.heartbeat
        ]
        if lost:
            who = ", ".join(self.where(r) for r in lost)
            silent = max(now - self._heard[r] for r in lost)
            with self._lock:
                snapshot = dict(self.table)
            self._fail(
                f"{who} {'is' if len(lost) == 1 else 'are'} unreachable: nothing "
                f"heard for {silent:.0f}s ({HEARTBEAT_ENV}={self.heartbeat:g}). "
                "A node, process or network link failed; MPI would wait for "
                f"{'it' if len(lost) == 1 else 'them'} forever.\n  "
                + self._everyone(snapshot),
                lost=[self.hosts[r] for r in lost],
            )

    def _rank_0_silent(self, now: float, silent: float) -> None:
        """Rank 0 has been silent for the heartbeat timeout: tell the other
        ranks, wait `_agree` seconds for theirs, then leave; the lowest rank
        that heard (or is) a suspecting rank names rank 0's host as lost for
        the launch wrapper, the others say who speaks for them. A rank cut
        off alone hears nobody and speaks for itself; its output cannot
        reach a launcher on another node."""
        if self._suspect_since is None:
            self._suspect_since = now
            for r in range(1, self.size):
                if r != self.rank:
                    self._send_to(r, Suspect())
            return
        if now - self._suspect_since < self._agree:
            return
        survivors = sorted({self.rank} | self._suspects)
        speaker = survivors[0]
        lost = (
            f"{self.where(0)} is unreachable from "
            + ", ".join(self.where(r) for r in survivors)
            + f": nothing heard from it for {silent:.0f}s "
            f"({HEARTBEAT_ENV}={self.heartbeat:g}). Its node, process or network "
            "link failed; MPI would wait for it forever."
        )
        if speaker == self.rank:
            others = len(survivors) - 1
            self._fail(
                f"{lost} {'These ranks leave' if others else 'This rank leaves'} "
                f"now; rank {self.rank} speaks for "
                f"{'them' if others else 'itself'}.",
                local_only=True,
                lost=[self.hosts[0]],
            )
        else:
            self._fail(
                f"{lost} This rank leaves now; rank {speaker} speaks for the "
                "ranks that still reach each other.",
                local_only=True,
                lost=[],
            )

    def _describe(self, rank: int, snapshot: dict) -> str:
        silent = time.monotonic() - self._heard[rank]
        lost = self.heartbeat and rank != self.rank and silent >= self.heartbeat
        return describe(self.where(rank), snapshot.get(rank), silent if lost else None)

    def _everyone(self, snapshot: dict) -> str:
        return "\n  ".join(self._describe(r, snapshot) for r in range(self.size))

    def _check(self) -> None:
        with self._lock:
            snapshot = dict(self.table)
        waiting = {r: e for r, e in snapshot.items() if isinstance(e, Wait)}
        finished = {r: e for r, e in snapshot.items() if isinstance(e, Finished)}
        self._check_finish_wait(snapshot, finished)
        if not waiting:
            self._conflict = None
            return
        everyone = self._everyone(snapshot)
        calls = {(e.seq, e.name) for e in waiting.values()}
        conflict = None
        if finished:
            conflict = (
                "ranks cannot meet: some ranks finished while others wait in a "
                f"collective. Cause: {cause_finished(waiting, finished)}"
                f"\n  {everyone}"
            )
        elif len(calls) > 1 and len(waiting) == self.size:
            # Only when no rank is still computing: ranks are legitimately in
            # different collectives while one computes, e.g. a broadcast's
            # root (done as soon as it has sent) is already in the next
            # collective while the others wait for data relayed by a rank
            # that is still busy. That rank's arrival completes theirs.
            conflict = (
                "ranks wait in different collectives, which can never match. "
                f"Cause: {cause_different(waiting)}\n  {everyone}"
            )
        if conflict is None:
            self._conflict = None
        else:
            signature = tuple(sorted((r, e.kind, e.seq) for r, e in snapshot.items()))
            if self._conflict is None or self._conflict[0] != signature:
                self._conflict = (signature, time.monotonic())
            elif time.monotonic() - self._conflict[1] >= _CONFLICT_GRACE:
                self._fail(conflict)
        oldest = min(e.since for e in waiting.values())
        stalled = time.time() - oldest
        if (
            self.timeout
            and stalled >= self.timeout
            and time.time() - self._last_warning >= self.timeout
        ):
            self._last_warning = time.time()
            missing = [r for r in range(self.size) if r not in waiting]
            seq, name = min(calls)
            sys.stderr.write(
                f"keras_mpfp16 stall warning: ranks {sorted(waiting)} have waited "
                f"{stalled:.0f}s in collective #{seq} {name!r}; ranks {missing} "
                f"have not arrived.\n  {everyone}\n"
            )
            sys.stderr.flush()
            recorder = trace.active()
            if recorder is not None:
                recorder.instant(
                    "stall warning",
                    "stall",
                    {
                        "collective": name,
                        "waiting_ranks": sorted(waiting),
                        "missing_ranks": missing,
                        "stalled_s": round(stalled, 1),
                    },
                    scope="g",
                )
                recorder.flush()
        if self.hang and stalled >= self.hang:
            with self._state_lock:
                local = self.local
                own = (local.seq, local.name, local.previous, local.since is not None)
            setting = f"{HANG_ENV}={self.hang:g}"
            self._fail(
                no_progress(stalled, waiting, self.size, self.where, own, setting)
                + f"\n  {everyone}"
            )
        if self.abort_after and stalled >= self.abort_after:
            self._fail(f"stalled for {stalled:.0f}s ({ABORT_ENV}).\n  {everyone}")

    def _check_finish_wait(self, snapshot: dict, finished: dict) -> None:
        """Rank 0 has finished and waits for the others: say so, and bound it."""
        if self._finished_at is None or len(finished) == self.size:
            return
        waited = time.monotonic() - self._finished_at
        others = [r for r in range(self.size) if r not in finished]
        if (
            self.timeout
            and waited >= self.timeout
            and time.time() - self._last_warning >= self.timeout
        ):
            self._last_warning = time.time()
            sys.stderr.write(
                f"keras_mpfp16: rank 0 finished {waited:.0f}s ago and waits for "
                f"ranks {others} to finish.\n  {self._everyone(snapshot)}\n"
            )
            sys.stderr.flush()
        if self.abort_after and waited >= self.abort_after:
            self._fail(
                f"rank 0 finished {waited:.0f}s ago and ranks {others} have not "
                f"({ABORT_ENV}).\n  {self._everyone(snapshot)}"
            )

    def _fail(
        self, message: str, local_only: bool = False, lost: list[str] | None = None
    ) -> None:
        """Ends the job with `message`. `lost`: the job lost a rank (None: it
        did not), with the hosts to name in the launch wrapper's verdict (no
        verdict when empty: another rank speaks); the ranks then exit with
        `NODE_LOST_EXIT_CODE` (69), never 0."""
        from keras_mpfp16.runtime.supervision.failure import abort_job
        from keras_mpfp16.runtime.supervision.launch_wrapper import (
            NODE_LOST_EXIT_CODE,
            report_lost,
        )

        if self._failed:
            return
        self._failed = True
        if local_only:
            head = f"keras_mpfp16 error ({self.where(self.rank)})"
        else:
            head = f"keras_mpfp16 error (rank 0 on host {self.hosts[0]} watching {self.size} ranks)"
        sys.stderr.write(f"{head}: {message}\n")
        recorder = trace.active()
        if recorder is not None:  # the part file keeps why the job ended
            recorder.instant(
                "stall inspector ends the job", "stall", {"message": message}, "g"
            )
            recorder.flush()
        sys.stderr.flush()
        if lost is None:
            abort_job(1)
            return
        if lost:  # the launcher may never end by itself: tell the wrapper
            report_lost(f"{head}: {message}", lost)
            # Let this node's launcher daemon forward the verdict before
            # MPI_Abort makes it end the job.
            time.sleep(_VERDICT_FLUSH)
        else:
            # Another rank speaks (rank 0 lost): give it time to write and
            # forward its verdict before this rank's MPI_Abort ends the job.
            # The ranks decide within a beat and a poll of each other;
            # Hydra's mpiexec kills every rank at once on an MPI_Abort, and
            # a non-speaker that aborted first left no verdict (seen on the
            # emulated cluster, rank 0's node cut: no restart).
            time.sleep(self._agree + _VERDICT_FLUSH)
        # ... and end a plain mpirun waiting for the lost node's daemon.
        launcher_daemon.end_later(env.get("END_LAUNCHER_AFTER"), self.where(self.rank))
        abort_job(NODE_LOST_EXIT_CODE)


# How to get MPI_THREAD_MULTIPLE, per MPI (also in the doctor and docs).
THREAD_LEVEL_FIX = (
    "To get MPI_THREAD_MULTIPLE: do not lower mpi4py's request (mpi4py.rc."
    "thread_level / MPI4PY_RC_THREAD_LEVEL, default 'multiple'); Cray MPICH: "
    "export MPICH_MAX_THREAD_SAFETY=multiple; Open MPI, MPICH, MVAPICH, Intel "
    "MPI: a library built with thread support (Open MPI >= 3.0 is by "
    "default). `python -m keras_mpfp16 doctor` shows the level."
)

_inspector: Inspector | None = None
_thread_level_warned = False


def _thread_level_ok(comm) -> bool:
    """True when every rank's MPI allows calls from two threads at once."""
    global _thread_level_warned
    from mpi4py import MPI

    everyone = comm.allgather(MPI.Query_thread())
    if all(lv >= MPI.THREAD_MULTIPLE for lv in everyone):
        return True
    if comm.Get_rank() == 0 and not _thread_level_warned:
        names = {
            MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
            MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
            MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
            MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE",
        }
        low = sorted({r for r, lv in enumerate(everyone) if lv < MPI.THREAD_MULTIPLE})
        sys.stderr.write(
            "keras_mpfp16 WARNING: the stall inspector and network heartbeats are "
            f"OFF: MPI runs at thread level {names.get(min(everyone), min(everyone))} "
            f"on ranks {low}, and they call MPI from a second thread, which needs "
            "MPI_THREAD_MULTIPLE. For this job:\n"
            "  - a hang is not reported or ended, and a lost node or rank is "
            "never detected: the job waits for it forever;\n"
            "  - `evaluate` called on every rank is not split: every rank "
            "evaluates its own data alone (the evaluate rendezvous is off too).\n"
            f"  {THREAD_LEVEL_FIX}\n"
        )
        sys.stderr.flush()
    _thread_level_warned = True
    return False


def start(comm) -> Inspector | None:
    """Starts the inspector on `comm` (every rank must call it). None when off."""
    global _inspector
    if comm.Get_size() == 1:
        return None
    # Rank 0's settings for everyone: an inspector on some ranks only would
    # leave rank 0 waiting at exit for reports that never come.
    timeout, abort_after, heartbeat, hang = comm.bcast(
        (
            env.get("STALL_TIMEOUT"),
            env.get("STALL_ABORT"),
            env.get("HEARTBEAT_TIMEOUT"),
            env.get("HANG_TIMEOUT"),
        ),
        root=0,
    )
    if timeout == 0:
        return None
    if not _thread_level_ok(comm):
        return None
    from mpi4py import MPI

    hosts = comm.allgather(MPI.Get_processor_name())
    if _inspector is not None:
        _inspector.finish()
    _inspector = Inspector(comm.Dup(), timeout, abort_after, heartbeat, hosts, hang)
    _inspector._thread.start()
    atexit.register(_finish_at_exit, _inspector)
    return _inspector


def _finish_at_exit(inspector: Inspector) -> None:
    from keras_mpfp16.runtime.supervision.failure import exit_description

    inspector.finish(exit_description())


def configure(
    timeout: float | None = None,
    abort_after: float | None = None,
    heartbeat: float | None = None,
) -> None:
    """Changes the inspector's settings (seconds) at run time, on this rank.

    Args:
        timeout: warn after this many seconds of waiting (> 0).
        abort_after: abort the job after a stall this long (0 = never).
        heartbeat: declare a rank lost after this many seconds of silence
            (> 0; call it with the same value on every rank). Heartbeats
            switched off at start cannot be switched on here.
    """
    seconds = "a number of seconds"
    _validate.number(
        "timeout",
        timeout,
        minimum=0,
        min_inclusive=False,
        allow_none=True,
        finite=False,
        expected=f"{seconds} > 0",
    )
    _validate.number(
        "abort_after",
        abort_after,
        minimum=0,
        allow_none=True,
        finite=False,
        expected=f"{seconds} >= 0",
    )
    _validate.number(
        "heartbeat",
        heartbeat,
        minimum=0,
        min_inclusive=False,
        allow_none=True,
        finite=False,
        expected=f"{seconds} > 0",
    )
    if _inspector is not None:
        if timeout is not None:
            _inspector.timeout = timeout
        if abort_after is not None:
            _inspector.abort_after = abort_after
        if heartbeat is not None and _inspector.heartbeat:
            _inspector.heartbeat = heartbeat
            _inspector._beat_every = min(1.0, max(_POLL, heartbeat / 10.0))
            _inspector._agree = 2 * _inspector._beat_every + 1.0


def inspector() -> Inspector | None:
    """The running inspector of this process, or None."""
    return _inspector


@contextmanager
def collective(name: str):
    """Marks the enclosed MPI call as collective `name` for the inspector.

    Registered with the MPI layer's observers (`runtime.mpi.observers`) at
    import: every collective the library issues runs inside it.
    """
    if _inspector is None:
        yield
    else:
        with _inspector.collective(name):
            yield


observers.register(collective)


# `configure` is the API (docs/api.md); the rest serves the runtime.
__all__ = ["Inspector", "collective", "configure", "inspector", "start"]
