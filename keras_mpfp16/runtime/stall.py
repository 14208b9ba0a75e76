"""Stall inspector: say which ranks a collective is waiting for, and end hangs.

Every collective the library issues is numbered and named on each rank
(`collective(name)`). A daemon thread on each rank reports to rank 0, over a
private communicator, when its rank has been waiting in a collective for more
than a second, and when its rank has finished (at interpreter exit). Rank 0
watches the reports and

* warns, every `timeout` seconds, while some ranks wait for others, naming
  the ranks that have not arrived and what each rank is doing;
* ends the job with a clear error as soon as ranks provably cannot meet: one
  rank has finished while others wait in a collective (e.g. one rank had more
  batches than another), or ranks wait in *different* collectives;
* optionally aborts a stall that lasts `abort_after` seconds.

Configuration: `KERAS_MPFP16_STALL_TIMEOUT` (seconds, default 60; 0 turns the
inspector off) and `KERAS_MPFP16_STALL_ABORT` (seconds, default 0 = never
abort a mere stall), or `configure()`. Nothing here imports Keras.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from contextlib import contextmanager

TIMEOUT_ENV = "KERAS_MPFP16_STALL_TIMEOUT"
ABORT_ENV = "KERAS_MPFP16_STALL_ABORT"
DEFAULT_TIMEOUT = 60.0
_TAG = 7
_REPORT_AFTER = 1.0  # seconds of waiting before a rank tells rank 0
# A conflict (ranks in different collectives, or finished while others wait)
# must persist this long before the job is ended: reports travel
# asynchronously, so rank 0 may briefly hold a stale "wait" from a rank whose
# "left" message is still in flight.
_CONFLICT_GRACE = 3.0
_POLL = 0.2


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds.") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0 seconds; received {raw!r}.")
    return value


class _Local:
    """What this rank is doing; written by the main thread, read by the watcher."""

    def __init__(self):
        self.seq = 0  # collectives entered so far
        self.name = ""  # name of the current (or last) collective
        self.since: float | None = None  # monotonic time of entry, None when not inside
        self.reported_seq = 0  # last seq reported to rank 0 as waiting


class Inspector:
    """The per-rank watcher. Create with `start()`; one per process."""

    def __init__(self, comm, timeout: float, abort_after: float):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        self.abort_after = abort_after
        self.local = _Local()
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._pending = []
        # rank 0's view: rank -> ("wait", seq, name, waited_since) | ("finished", seq, name)
        self.table: dict[int, tuple] = {}
        self._last_warning = 0.0
        # `table` is written by the main thread and the watcher on rank 0.
        self._lock = threading.Lock()
        # `local`, and the order in which its reports are sent.
        self._state_lock = threading.Lock()
        self._conflict: tuple | None = None  # (signature, first seen) of a conflict
        self._thread = threading.Thread(
            target=self._run, name="keras_mpfp16-stall", daemon=True
        )

    # -- main thread ----------------------------------------------------------

    @contextmanager
    def collective(self, name: str):
        local = self.local
        with self._state_lock:
            local.seq += 1
            local.name = name
            local.since = time.monotonic()
        try:
            yield
        finally:
            # Under the lock, so a "left" can never be sent before the
            # watcher's "wait" for the same collective.
            with self._state_lock:
                local.since = None
                if local.reported_seq == local.seq:
                    self._send(("left", local.seq))

    def finish(self) -> None:
        """Called at exit: tell rank 0, and on rank 0 wait for everyone."""
        if self._finished.is_set():
            return
        self._finished.set()
        if self.rank != 0:
            self._send(("finished", self.local.seq, self.local.name))
            deadline = time.monotonic() + 10.0
            while self._pending and time.monotonic() < deadline:
                self._pending = [r for r in self._pending if not r.Test()]
                time.sleep(0.01)
            self._stop.set()
            return
        self._update(0, ("finished", self.local.seq, self.local.name))
        # Rank 0 leaves only when everyone has finished (MPI_Finalize would
        # wait for them anyway); the watcher aborts if they cannot.
        while self._count_finished() < self.size:
            if not self._thread.is_alive():
                break
            time.sleep(_POLL)
        self._stop.set()

    def _count_finished(self) -> int:
        with self._lock:
            return sum(1 for v in self.table.values() if v[0] == "finished")

    # -- watcher thread ---------------------------------------------------------

    def _send(self, msg) -> None:
        if self.rank == 0:
            self._update(0, msg)
            return
        self._pending = [r for r in self._pending if not r.Test()]
        self._pending.append(self.comm.isend((self.rank, msg), dest=0, tag=_TAG))

    def _update(self, rank: int, msg) -> None:
        with self._lock:
            self._apply(rank, msg)

    def _apply(self, rank: int, msg) -> None:
        kind = msg[0]
        if kind == "wait":
            self.table[rank] = msg
        elif kind == "left":
            if (
                self.table.get(rank, (None, -1))[0] == "wait"
                and self.table[rank][1] == msg[1]
            ):
                del self.table[rank]
        elif kind == "finished":
            self.table[rank] = msg

    def _run(self) -> None:
        while not self._stop.is_set():
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
                    self._send(("wait", local.seq, local.name, started))
            if self.rank == 0:
                self._drain()
                self._check()
            time.sleep(_POLL)

    def _drain(self) -> None:
        from mpi4py import MPI

        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_TAG):
            rank, msg = self.comm.recv(source=MPI.ANY_SOURCE, tag=_TAG)
            self._update(rank, msg)

    def _describe(self, rank: int, snapshot: dict) -> str:
        entry = snapshot.get(rank)
        if entry is None:
            return f"rank {rank}: not in a collective (computing, or stuck outside MPI)"
        if entry[0] == "finished":
            return f"rank {rank}: finished after {entry[1]} collectives (last: {entry[2]!r})"
        waited = time.time() - entry[3]
        return (
            f"rank {rank}: waiting {waited:.0f}s in collective #{entry[1]} {entry[2]!r}"
        )

    def _check(self) -> None:
        with self._lock:
            snapshot = dict(self.table)
        waiting = {r: e for r, e in snapshot.items() if e[0] == "wait"}
        finished = {r: e for r, e in snapshot.items() if e[0] == "finished"}
        if not waiting:
            return
        everyone = "\n  ".join(self._describe(r, snapshot) for r in range(self.size))
        calls = {(e[1], e[2]) for e in waiting.values()}
        conflict = None
        if finished:
            conflict = (
                "ranks cannot meet: some ranks finished while others wait in a "
                "collective. Usually one rank had more batches (steps) than "
                "another; shard data with keras_mpfp16.shard so every rank runs "
                f"the same number of steps.\n  {everyone}"
            )
        elif len(calls) > 1:
            conflict = (
                "ranks wait in different collectives, which can never match "
                f"(their sequences of steps diverged).\n  {everyone}"
            )
        if conflict is None:
            self._conflict = None
        else:
            signature = tuple(sorted((r, e[0], e[1]) for r, e in snapshot.items()))
            if self._conflict is None or self._conflict[0] != signature:
                self._conflict = (signature, time.monotonic())
            elif time.monotonic() - self._conflict[1] >= _CONFLICT_GRACE:
                self._fail(conflict)
        oldest = min(e[3] for e in waiting.values())
        stalled = time.time() - oldest
        if (
            self.timeout
            and stalled >= self.timeout
            and time.time() - self._last_warning >= self.timeout
        ):
            self._last_warning = time.time()
            missing = [r for r in range(self.size) if r not in waiting]
            sys.stderr.write(
                f"keras_mpfp16 stall warning: ranks {sorted(waiting)} have waited "
                f"{stalled:.0f}s in collective #{next(iter(calls))[0]} "
                f"{next(iter(calls))[1]!r}; ranks {missing} have not arrived.\n  {everyone}\n"
            )
            sys.stderr.flush()
        if self.abort_after and stalled >= self.abort_after:
            self._fail(
                f"stalled for {stalled:.0f}s (KERAS_MPFP16_STALL_ABORT).\n  {everyone}"
            )

    def _fail(self, message: str) -> None:
        from keras_mpfp16.runtime.failure import abort_job

        sys.stderr.write(
            f"keras_mpfp16 error (rank 0 watching {self.size} ranks): {message}\n"
        )
        abort_job(1)


_inspector: Inspector | None = None


def start(comm) -> Inspector | None:
    """Starts the inspector on `comm` (every rank must call it). None when off."""
    global _inspector
    if comm.Get_size() == 1:
        return None
    # Rank 0's settings for everyone: an inspector on some ranks only would
    # leave rank 0 waiting at exit for reports that never come.
    timeout, abort_after = comm.bcast(
        (_env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT), _env_seconds(ABORT_ENV, 0.0)),
        root=0,
    )
    if timeout == 0:
        return None
    if _inspector is not None:
        _inspector.finish()
    _inspector = Inspector(comm.Dup(), timeout, abort_after)
    _inspector._thread.start()
    atexit.register(_inspector.finish)
    return _inspector


def configure(timeout: float | None = None, abort_after: float | None = None) -> None:
    """Changes the warning interval and the abort threshold (seconds) at run time.

    Args:
        timeout: warn after this many seconds of waiting (> 0).
        abort_after: abort the job after a stall this long (0 = never).
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds; received {timeout!r}.")
    if abort_after is not None and abort_after < 0:
        raise ValueError(f"abort_after must be >= 0 seconds; received {abort_after!r}.")
    if _inspector is not None:
        if timeout is not None:
            _inspector.timeout = timeout
        if abort_after is not None:
            _inspector.abort_after = abort_after


@contextmanager
def collective(name: str):
    """Marks the enclosed MPI call as collective `name` for the inspector."""
    if _inspector is None:
        yield
        return
    with _inspector.collective(name):
        yield
