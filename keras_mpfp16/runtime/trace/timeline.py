"""A per-rank timeline in Chrome's trace-event format (Perfetto, chrome://tracing).

One `Recorder` per process while a `keras_mpfp16.callbacks.Timeline` runs
(`active()` is None otherwise, and every hook in the library is a single
`if recorder is None` branch: nothing is added to the train step's graph).

What is recorded, on the rank's clock aligned to rank 0's (`align_clocks`):

* spans (`"ph": "X"`, `ts`/`dur` in microseconds) on thread 0 ("host"):
  train steps (from the callback), validation, checkpoint writes, the initial
  broadcast; on thread 1 ("reduction"): each gradient bucket's reduction
  (args: bytes, payload bytes, wire dtype, path, bucket index) with its MPI
  calls nested inside, and the other collectives of a step;
* instant events (`"ph": "i"`): loss-scale skips and changes, stall warnings.

Steps outside the window (`Window`) write no trace events; every step still
leaves one small record in memory (`(step, epoch, begin, end, calls)`) for
the scaling report (`runtime.scaling`), gathered and dropped at each epoch's
end.

Each rank writes its events to its own part file (`<path>.rank<r>`) as a
JSON array, one event per line, flushed after every recorded step, and
never closed until the end: Chrome's trace-event format accepts an array
without its closing bracket, so a job that crashed leaves a readable trace
of every step before the crash (`read_events` reads one too). At the end of
`fit` rank 0 gathers every rank's events over MPI, adds the "wait for the
slowest rank" spans (only computable with every rank's arrivals) and
writes `<path>` as one JSON object; the part files are then removed.

MPI and numpy only; nothing here imports Keras.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager

from keras_mpfp16 import _settings as env

# Registered in _settings.py.
PATH_ENV = env.setting("TIMELINE").name
STEPS_ENV = env.setting("TIMELINE_STEPS").name
REPORT_ENV = env.setting("TIMELINE_REPORT").name
DEFAULT_STEPS = "0-19"
REPORT_STYLES = ("epoch", "table")

TID_HOST = 0  # the callback's thread: steps, validation, checkpoints, broadcast
TID_REDUCE = 1  # TensorFlow's threads running the host callbacks of a step
_TAG = 23
_CLOCK_ROUNDS = 10


def env_settings() -> dict | None:
    """The timeline's environment variables, read in one place.

    `KERAS_MPFP16_TIMELINE=path` turns the timeline on; `..._STEPS` sets the
    window (`"100-200"`, `"every:50"`); `..._REPORT` (`1`/`epoch`, `table`,
    `0`) prints the scaling report. The report alone (no path) is allowed.

    Returns:
        `{"path": str | None, "steps": str | None, "report": bool | str}`,
        or None when neither the path nor the report is asked for.
    """
    path = (env.get("TIMELINE") or "").strip() or None
    steps = (env.get("TIMELINE_STEPS") or "").strip() or None
    report = env.get("TIMELINE_REPORT")
    if path is None and not report:
        return None
    return {"path": path, "steps": steps, "report": report}


class Window:
    """Which train steps (0-based, counted over the whole `fit`) are traced.

    Args:
        steps: `"first-last"` (inclusive), `(first, last)`, one step number,
            `"every:K"`, or None for the default window (`"0-19"`).
        every: Trace every `every`-th step instead (0, K, 2K, ...).
    """

    def __init__(self, steps=None, every: int | None = None):
        if every is not None and steps is not None:
            raise ValueError(
                "Pass either `steps` or `every` to the timeline, not both; "
                f"received steps={steps!r}, every={every!r}."
            )
        self.every = None
        self.first = self.last = None
        if isinstance(steps, str) and steps.strip().startswith("every:"):
            every, steps = steps.strip()[6:], None
            try:
                every = int(every)
            except ValueError:
                raise ValueError(
                    f"Invalid timeline window 'every:{every}': expected 'every:K' "
                    "with an integer K >= 1."
                ) from None
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ValueError(
                    "Invalid value for argument `every`: expected an integer >= 1. "
                    f"Received: every={every!r}"
                )
            self.every = every
            return
        first, last = self._parse(DEFAULT_STEPS if steps is None else steps)
        self.first, self.last = first, last

    @staticmethod
    def _parse(steps):
        bad = ValueError(
            "Invalid value for argument `steps`: expected 'first-last' (e.g. "
            "'100-200', inclusive, 0 <= first <= last), a pair (first, last), "
            f"a step number or 'every:K'. Received: steps={steps!r}"
        )
        try:
            if isinstance(steps, str):
                parts = steps.strip().split("-")
                if len(parts) == 1:
                    first = last = int(parts[0])
                elif len(parts) == 2:
                    first, last = int(parts[0]), int(parts[1])
                else:
                    raise bad
            elif isinstance(steps, (tuple, list)) and len(steps) == 2:
                first, last = (int(s) for s in steps)
            elif isinstance(steps, int) and not isinstance(steps, bool):
                first = last = steps
            else:
                raise bad
        except (TypeError, ValueError):
            raise bad from None
        if not 0 <= first <= last:
            raise bad
        return first, last

    def __contains__(self, step: int) -> bool:
        if self.every is not None:
            return step % self.every == 0
        return self.first <= step <= self.last

    def __repr__(self) -> str:
        if self.every is not None:
            return f"every:{self.every}"
        return f"{self.first}-{self.last}"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def align_clocks(comm) -> dict:
    """Each rank's offset to rank 0's clock (every rank calls it).

    Ranks on the same running kernel as rank 0 (same boot id) share its
    clock (`time.perf_counter_ns` is CLOCK_MONOTONIC on Linux): offset 0,
    exactly. Others exchange `_CLOCK_ROUNDS` ping-pongs with rank 0 and keep
    the one with the shortest round trip (Cristian's method): offset =
    rank 0's time - the midpoint of the round trip, accurate to half of that
    round trip (`bound_us`).

    Returns:
        `{"offset_ns": int, "bound_us": float, "same_clock": bool}` for this
        rank, plus `"ranks"`: the same for every rank, in rank order.
    """
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    boots = comm.allgather(_boot_id())
    mine = {"offset_ns": 0, "bound_us": 0.0, "same_clock": True}
    buf = np.zeros(1, np.int64)
    for peer in range(1, size):
        if boots[peer] and boots[peer] == boots[0]:
            continue
        if rank == 0:
            for _ in range(_CLOCK_ROUNDS):
                comm.Recv(buf, source=peer, tag=_TAG)
                buf[0] = time.perf_counter_ns()
                comm.Send(buf, dest=peer, tag=_TAG)
        elif rank == peer:
            best = None
            for _ in range(_CLOCK_ROUNDS):
                t0 = time.perf_counter_ns()
                comm.Send(buf, dest=0, tag=_TAG)
                comm.Recv(buf, source=0, tag=_TAG)
                t1 = time.perf_counter_ns()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, int(buf[0]) - (t0 + t1) // 2)
            mine = {
                "offset_ns": best[1],
                "bound_us": best[0] / 2e3,
                "same_clock": False,
            }
    everyone = comm.allgather(mine)
    return {**mine, "ranks": everyone}


class Recorder:
    """This rank's events. Created by the Timeline callback; see module doc.

    Args:
        rank: This rank; size: the number of ranks; host: this host's name.
        window: Which steps are traced.
        part_path: This rank's part file, or None to keep events in memory
            only (the report alone).
        offset_ns: Added to `time.perf_counter_ns()` (rank 0's clock).
    """

    def __init__(
        self,
        rank: int,
        size: int,
        host: str,
        window: Window,
        part_path: str | None,
        offset_ns: int = 0,
    ):
        self.rank, self.size, self.host = rank, size, host
        self.window = window
        self.part_path = part_path
        self.offset_ns = offset_ns
        self.events: list[dict] = []  # traced events, kept for the merge
        self.records: list[tuple] = []  # step records since the last take_records
        self.step: int | None = None  # the step running now (None between steps)
        self.epoch = 0
        self.tracing = False  # the running step is in the window
        self.in_validation = False
        self._calls: list = []
        self._step_begin = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._file = None
        if part_path:
            os.makedirs(os.path.dirname(os.path.abspath(part_path)), exist_ok=True)
            self._file = open(part_path, "w", encoding="utf-8")  # noqa: SIM115
            self._file.write("[\n")
        for ev in self.metadata():
            self._emit(ev)
        self.flush()

    # -- clock and output ---------------------------------------------------------

    def now_ns(self) -> int:
        return time.perf_counter_ns() + self.offset_ns

    def _us(self, ns: int) -> float:
        return ns / 1e3

    def metadata(self) -> list[dict]:
        pid = self.rank
        return [
            {
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "name": "process_name",
                "args": {"name": f"rank {self.rank} ({self.host})"},
            },
            {
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "name": "process_sort_index",
                "args": {"sort_index": self.rank},
            },
            {
                "ph": "M",
                "pid": pid,
                "tid": TID_HOST,
                "name": "thread_name",
                "args": {"name": "host (steps, validation, checkpoints)"},
            },
            {
                "ph": "M",
                "pid": pid,
                "tid": TID_REDUCE,
                "name": "thread_name",
                "args": {"name": "reduction (gradient buckets, collectives)"},
            },
        ]

    def _emit(self, ev: dict) -> None:
        """Appends one event (call under `_lock`, or before threads exist)."""
        self.events.append(ev)
        if self._file is not None:
            self._file.write(json.dumps(ev, separators=(",", ":")) + ",\n")

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self, remove: bool = False) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        if remove and self.part_path and os.path.exists(self.part_path):
            os.remove(self.part_path)

    def _span(self, name, cat, t0, t1, tid, args=None) -> dict:
        ev = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "pid": self.rank,
            "tid": tid,
            "ts": self._us(t0),
            "dur": max(self._us(t1 - t0), 0.001),
        }
        if args:
            ev["args"] = args
        return ev

    # -- events from the callback and the library --------------------------------

    def begin_step(self, step: int, epoch: int) -> None:
        t = self.now_ns()
        with self._lock:
            self.step, self.epoch = step, epoch
            self.tracing = step in self.window
            self._calls = []
            self._step_begin = t

    def end_step(self) -> None:
        t = self.now_ns()
        with self._lock:
            if self.step is None:
                return
            self.records.append(
                (self.step, self.epoch, self._step_begin, t, tuple(self._calls))
            )
            tracing = self.tracing
            if tracing:
                self._emit(
                    self._span(
                        f"train step {self.step}",
                        "step",
                        self._step_begin,
                        t,
                        TID_HOST,
                        {"step": self.step, "epoch": self.epoch + 1},
                    )
                )
            self.step, self.tracing, self._calls = None, False, []
            if tracing and self._file is not None:
                self._file.flush()

    def take_records(self) -> list[tuple]:
        with self._lock:
            out, self.records = self.records, []
        return out

    def span_event(self, name: str, cat: str, t0_ns: int, t1_ns: int, args=None):
        """A span on the host thread (validation, checkpoint, broadcast)."""
        with self._lock:
            self._emit(self._span(name, cat, t0_ns, t1_ns, TID_HOST, args))
            if self._file is not None:
                self._file.flush()

    @contextmanager
    def span(self, name: str, cat: str, args=None):
        t0 = self.now_ns()
        try:
            yield
        finally:
            self.span_event(name, cat, t0, self.now_ns(), args)

    def instant(self, name: str, cat: str, args=None, scope: str = "p") -> None:
        ev = {
            "name": name,
            "cat": cat,
            "ph": "i",
            "s": scope,
            "pid": self.rank,
            "tid": TID_HOST,
            "ts": self._us(self.now_ns()),
        }
        if args:
            ev["args"] = args
        with self._lock:
            self._emit(ev)

    @contextmanager
    def reduction(
        self,
        name: str,
        *,
        bucket: int,
        nbytes: int,
        payload_bytes: int,
        wire: str,
        path: str,
    ):
        """Around one gradient bucket's host-side reduction (its MPI calls
        are recorded nested inside it)."""
        local = self._local
        local.in_bucket = True
        t0 = self.now_ns()
        try:
            yield
        finally:
            local.in_bucket = False
        t1 = self.now_ns()
        with self._lock:
            if self.step is None:  # outside fit's steps (a custom loop)
                return
            call = len(self._calls)
            self._calls.append(("bucket", name, t0, t1, nbytes, payload_bytes))
            if self.tracing:
                args = {
                    "step": self.step,
                    "call": call,
                    "bucket": bucket,
                    "bytes": nbytes,
                    "payload_bytes": payload_bytes,
                    "wire_dtype": wire,
                    "path": path,
                }
                self._emit(
                    self._span(
                        f"bucket {bucket} reduction",
                        "reduction",
                        t0,
                        t1,
                        TID_REDUCE,
                        args,
                    )
                )

    def collective(self, name: str, t0_ns: int, t1_ns: int) -> None:
        """One MPI collective (called by `stall.collective`), times from
        `time.perf_counter_ns()`."""
        t0, t1 = t0_ns + self.offset_ns, t1_ns + self.offset_ns
        nested = getattr(self._local, "in_bucket", False)
        with self._lock:
            if nested:
                if self.tracing:
                    self._emit(
                        self._span(name, "mpi", t0, t1, TID_REDUCE, {"step": self.step})
                    )
                return
            if self.step is not None:
                call = len(self._calls)
                self._calls.append(("collective", name, t0, t1, 0, 0))
                if self.tracing:
                    self._emit(
                        self._span(
                            name,
                            "collective",
                            t0,
                            t1,
                            TID_REDUCE,
                            {"step": self.step, "call": call},
                        )
                    )
                return
            if not self.in_validation:
                self._emit(self._span(name, "collective", t0, t1, TID_HOST))


# -- the process's recorder ----------------------------------------------------------

_active: Recorder | None = None


def active() -> Recorder | None:
    """The recorder of the running timeline, or None (the usual case)."""
    return _active


def activate(recorder: Recorder | None) -> None:
    global _active
    _active = recorder


# -- reading and merging ---------------------------------------------------------------


def read_events(path: str) -> list[dict]:
    """The events of a trace file: a merged `{"traceEvents": [...]}` file or a
    part file (a JSON array, possibly without its closing bracket, as a
    crashed rank leaves it; a last line cut mid-write is dropped)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.strip()
    if stripped.startswith("{"):
        return json.loads(stripped)["traceEvents"]
    events = []
    for line in stripped.splitlines()[1:]:
        line = line.strip().rstrip(",")
        if not line or line == "]":
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the write the crash interrupted
    return events


def wait_spans(events: list[dict]) -> list[dict]:
    """ "wait for the slowest rank" spans, from every rank's step calls.

    For call `i` of step `s` (the same collective on every rank), rank r
    waited from its arrival until the last rank's arrival (at most the
    call's duration); the span is nested in the call's span.
    """
    calls: dict[tuple, list[dict]] = {}
    for ev in events:
        args = ev.get("args") or {}
        if ev.get("ph") == "X" and "call" in args:
            calls.setdefault((args["step"], args["call"]), []).append(ev)
    out = []
    for (step, _), evs in calls.items():
        if len(evs) < 2:
            continue
        slowest = max(evs, key=lambda e: e["ts"])
        for ev in evs:
            waited = min(slowest["ts"] - ev["ts"], ev["dur"])
            if ev is slowest or waited <= 0:
                continue
            out.append(
                {
                    "name": "wait for slowest rank",
                    "cat": "wait",
                    "ph": "X",
                    "pid": ev["pid"],
                    "tid": ev["tid"],
                    "ts": ev["ts"],
                    "dur": waited,
                    "args": {"step": step, "slowest_rank": slowest["pid"]},
                }
            )
    return out


def write_merged(path: str, per_rank: list[list[dict]], other: dict) -> int:
    """Writes the job's trace (`{"traceEvents": ..., "otherData": ...}`)
    atomically; returns the number of events."""
    events = [ev for evs in per_rank for ev in evs]
    events += wait_spans(events)
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
    return len(events)


# -- one recording (a `fit`), across ranks ------------------------------------------------


class Session:
    """One `fit`'s recording on this rank: starts the recorder (clock
    alignment is collective: every rank constructs a Session together),
    turns each epoch's step records into the epoch's report, and merges the
    trace at the end.

    Args:
        path: The merged trace's file, or None (the report only).
        window: Which steps are traced.
    """

    def __init__(self, path: str | None, window: Window):
        import socket

        from keras_mpfp16.runtime.mpi import world

        world.init()
        self.path = os.fspath(path) if path is not None else None
        self.window = window
        self.rank, self.size = world.rank(), world.size()
        self.comm = world.world().comm.Dup() if self.size > 1 else None
        if self.comm is not None:
            self.clock = align_clocks(self.comm)
        else:
            self.clock = {"offset_ns": 0, "bound_us": 0.0, "same_clock": True}
            self.clock["ranks"] = [dict(self.clock)]
        host = socket.gethostname()
        part = f"{self.path}.rank{self.rank}" if self.path else None
        self.recorder = Recorder(
            self.rank, self.size, host, window, part, self.clock["offset_ns"]
        )
        self.epochs: list[dict] = []
        activate(self.recorder)

    def end_epoch(self, epoch: int, skips: int = 0) -> dict:
        """The epoch's report from every rank's records (collective)."""
        from keras_mpfp16.runtime.trace import scaling

        mine = self.recorder.take_records()
        everyone = self.comm.allgather(mine) if self.comm is not None else [mine]
        entry = {"epoch": epoch, **scaling.epoch_report(everyone, skips)}
        self.epochs.append(entry)
        return entry

    def report(self) -> dict:
        ranks = self.clock["ranks"]
        return {
            "ranks": self.size,
            "window": repr(self.window),
            "clock_bound_us": max(r["bound_us"] for r in ranks),
            "epochs": list(self.epochs),
        }

    def finish(self) -> str | None:
        """Gathers every rank's events to rank 0, which writes `path`
        (collective); removes the part files once it is written. Returns the
        path written (rank 0), else None."""
        recorder = self.recorder
        activate(None)
        recorder.flush()
        written = None
        if self.path is not None:
            if self.comm is not None:
                per_rank = self.comm.gather(recorder.events, root=0)
            else:
                per_rank = [recorder.events]
            ok = True
            if self.rank == 0:
                try:
                    other = {
                        "keras_mpfp16": {
                            "report": self.report(),
                            "clock": self.clock["ranks"],
                            "window": repr(self.window),
                        }
                    }
                    write_merged(self.path, per_rank, other)
                    written = self.path
                except OSError:
                    ok = False
                    raise
                finally:
                    if self.comm is not None:
                        self.comm.bcast(ok, root=0)
            elif self.comm is not None:
                ok = self.comm.bcast(None, root=0)
            recorder.close(remove=ok)
        else:
            recorder.close()
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
        return written
