"""This rank's timeline recorder, in Chrome's trace-event format (Perfetto, chrome://tracing).

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

from keras_mpfp16.runtime.mpi import observers
from keras_mpfp16.runtime.trace.windows import Window

TID_HOST = 0  # the callback's thread: steps, validation, checkpoints, broadcast
TID_REDUCE = 1  # TensorFlow's threads running the host callbacks of a step
TID_BACKWARD = 2  # the step until its last gradient bucket was handed over


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

    def gradients_ready(self) -> None:
        """The step's last gradient bucket was handed to the communication
        thread (`KERAS_MPFP16_OVERLAP`): every gradient exists, the backward
        pass is over. Kept in the step's calls as a `"ready"` mark (the
        scaling report's hidden share) and traced as a span from the step's
        start on its own row."""
        t = self.now_ns()
        with self._lock:
            if self.step is None:
                return
            self._calls.append(("ready", "gradients ready", t, t, 0, 0))
            if self.tracing:
                self._emit(
                    self._span(
                        "forward + backward (until the last bucket is handed over)",
                        "backward",
                        self._step_begin,
                        t,
                        TID_BACKWARD,
                        {"step": self.step},
                    )
                )

    def collective(self, name: str, t0_ns: int, t1_ns: int) -> None:
        """One MPI collective (from this module's observer, `collective`), times from
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


@contextmanager
def collective(name: str):
    """Times the enclosed MPI call as collective `name` for the running
    recorder, if any. Registered with the MPI layer's observers
    (`runtime.mpi.observers`) at import."""
    recorder = _active
    if recorder is None:
        yield
        return
    start_ns = time.perf_counter_ns()
    try:
        yield
    finally:
        recorder.collective(name, start_ns, time.perf_counter_ns())


observers.register(collective)

__all__ = ["TID_HOST", "TID_REDUCE", "Recorder", "activate", "active", "collective"]
