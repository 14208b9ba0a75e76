"""Reading part files and writing the job's merged trace (rank 0).

Each rank's part file is a JSON array, possibly without its closing bracket
(a crashed rank leaves it so); the merged trace adds the "wait for the
slowest rank" spans, only computable with every rank's arrivals.
"""

from __future__ import annotations

import json
import os


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


__all__ = ["read_events", "wait_spans", "write_merged"]
