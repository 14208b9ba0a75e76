"""The scaling report: per-epoch numbers computed from every rank's step records.

Pure arithmetic on plain Python data (numpy only), so it is unit-tested on
synthetic records and computed identically on every rank.

A *step record* is what one rank measured for one train step (times in
nanoseconds on the job's aligned clock, see `runtime.trace`)::

    (step, epoch, begin_ns, end_ns, calls)

where `calls` lists the step's top-level communication in the order it ran,
each `(kind, name, enter_ns, exit_ns, nbytes, payload_bytes)`: `kind` is
`"bucket"` for a gradient bucket's reduction (`nbytes`: the bytes handed to
MPI, `payload_bytes`: the bucket's gradients as float32, what the bucket
plan counts) or `"collective"` for any other collective inside the step
(the metric reduction). Every rank runs the same calls in the same order in
a step, so call `i` of step `s` is the same collective on every rank.

Definitions (also in docs/timeline.md):

* step time: `end - begin` of the step on a rank (host timestamps of the
  callback); the job's step time is the slowest rank's.
* reduction: the union of the step's call intervals on a rank; wait: for
  each call, how long this rank was in it before the last rank arrived
  (`max_r enter_r - enter`, at most the call's duration); compute: the rest
  of the step. The three shares add up to 1.
* algbw = bytes / transfer time, where the transfer time of a bucket on a
  rank is its exit minus the last rank's arrival; busbw = algbw * 2(N-1)/N
  (the nccl-tests definition for allreduce).
* overlap (an upper bound): the share of the buckets' reduction time spent
  before the last bucket started. The backward pass has produced every
  gradient by then (the last bucket needs the first layers' gradients), so
  reduction time after that point cannot overlap it; time before it may.
  One bucket: 0 by construction.
* hidden (measured, `KERAS_MPFP16_OVERLAP`): the share of the buckets'
  reduction time spent before the step's `"ready"` mark, the moment the
  last bucket was handed to the communication thread (every gradient
  existed then): reduction time under the forward and backward pass.
  None when the steps have no mark (the synchronous path).

A `"ready"` call (`enter == exit`, no bytes) is that mark; it is not a
collective and takes no part in the other numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Call = tuple  # (kind, name, enter_ns, exit_ns, nbytes, payload_bytes)
StepRecord = tuple  # (step, epoch, begin_ns, end_ns, tuple[Call, ...])


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) with linear interpolation between order
    statistics (numpy's default method); NaN for no values."""
    if not len(values):
        return math.nan
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bus_bandwidth(nbytes: float, seconds: float, ranks: int) -> tuple[float, float]:
    """`(algbw, busbw)` in bytes/s of an allreduce of `nbytes` in `seconds`
    on `ranks` ranks (nccl-tests: busbw = algbw * 2(N-1)/N)."""
    if seconds <= 0:
        return math.nan, math.nan
    alg = nbytes / seconds
    return alg, alg * 2.0 * (ranks - 1) / ranks


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by `(start, end)` intervals (overlaps counted once)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def epoch_report(per_rank: Sequence[Sequence[StepRecord]], skips: int = 0) -> dict:
    """The numbers of one epoch from every rank's step records.

    Args:
        per_rank: One list of step records per rank, in rank order.
        skips: Loss-scale skipped steps in the epoch (reported as given).

    Returns:
        A dict (see the module docstring for the definitions): `steps`,
        `step_ms_median`, `step_ms_p95`, `compute_share`, `reduction_share`,
        `wait_share`, `bytes_per_step` (gradient payload, float32 bytes, as
        the bucket plan counts), `wire_bytes_per_step`, `buckets`,
        `algbw_gbps`, `busbw_gbps` (GB/s = 1e9 bytes/s), `slowest_rank`,
        `slowest_late_ms` (how late it arrives at the step's calls, after
        the earliest rank, summed over the calls, per step on average),
        `others_late_ms` (the same, averaged over the other ranks),
        `overlap_max`, `loss_scale_skips`.
    """
    n = len(per_rank)
    by_rank = [{rec[0]: rec for rec in records} for records in per_rank]
    common = sorted(set.intersection(*(set(d) for d in by_rank))) if n else []
    step_ms = []
    total = comm = waited = 0.0
    xfer_bytes = xfer_ns = 0.0
    overlap_ns = bucket_ns = 0.0
    late = np.zeros(n)
    late_calls = 0
    payload = wire_bytes = nbuckets = None
    hidden_ns = marked_ns = 0.0
    for s in common:
        recs = [_without_marks(d[s]) for d in by_rank]
        for r, d in enumerate(by_rank):
            ready = [c[2] for c in d[s][4] if c[0] == "ready"]
            if ready:
                t_ready = max(ready)
                for c in recs[r][4]:
                    if c[0] == "bucket":
                        marked_ns += c[3] - c[2]
                        hidden_ns += max(min(c[3], t_ready) - c[2], 0.0)
        step_ms.append(max(r[3] - r[2] for r in recs) / 1e6)
        ncalls = min(len(r[4]) for r in recs)
        arrivals = np.array(
            [[r[4][i][2] for i in range(ncalls)] for r in recs], dtype=np.float64
        ).reshape(n, ncalls)
        last = arrivals.max(axis=0) if ncalls else arrivals.sum(axis=0)
        if ncalls:
            late += (arrivals - arrivals.min(axis=0)).sum(axis=1)
            late_calls += ncalls
        for r, rec in enumerate(recs):
            begin, end, calls = rec[2], rec[3], rec[4]
            total += end - begin
            comm += union_length([(c[2], c[3]) for c in calls])
            buckets = [c for c in calls[:ncalls] if c[0] == "bucket"]
            for i, c in enumerate(calls[:ncalls]):
                waited += min(max(last[i] - c[2], 0.0), c[3] - c[2])
                if c[0] == "bucket":
                    xfer_bytes += c[4]
                    xfer_ns += max(c[3] - max(last[i], c[2]), 0.0)
            if buckets:
                start_last = max(c[2] for c in buckets)
                for c in buckets:
                    bucket_ns += c[3] - c[2]
                    if c[2] < start_last:
                        overlap_ns += min(c[3], start_last) - c[2]
            if r == 0:
                payload = sum(c[5] for c in buckets)
                wire_bytes = sum(c[4] for c in buckets)
                nbuckets = len(buckets)
    alg, bus = bus_bandwidth(xfer_bytes, xfer_ns / 1e9, n) if n > 1 else (None, None)
    mean_late = late / len(common) / 1e6 if late_calls else np.zeros(n)
    slowest = int(np.argmax(mean_late)) if late_calls else None
    others = [mean_late[r] for r in range(n) if r != slowest]

    def share(x):
        return x / total if total > 0 else math.nan

    def gbps(x):
        return None if x is None or math.isnan(x) else x / 1e9

    return {
        "steps": len(common),
        "step_ms_median": percentile(step_ms, 50),
        "step_ms_p95": percentile(step_ms, 95),
        "compute_share": share(total - comm),
        "reduction_share": share(comm - waited),
        "wait_share": share(waited),
        "bytes_per_step": payload,
        "wire_bytes_per_step": wire_bytes,
        "buckets": nbuckets,
        "algbw_gbps": gbps(alg),
        "busbw_gbps": gbps(bus),
        "slowest_rank": slowest,
        "slowest_late_ms": float(mean_late[slowest]) if slowest is not None else None,
        "others_late_ms": float(np.mean(others)) if others else None,
        "overlap_max": overlap_ns / bucket_ns if bucket_ns > 0 else 0.0,
        "hidden": hidden_ns / marked_ns if marked_ns > 0 else None,
        "loss_scale_skips": int(skips),
    }


def _without_marks(rec: StepRecord) -> StepRecord:
    """`rec` without its `"ready"` marks (not collectives)."""
    if not any(c[0] == "ready" for c in rec[4]):
        return rec
    return (*rec[:4], tuple(c for c in rec[4] if c[0] != "ready"))


def _pct(x) -> str:
    return "  n/a" if x is None or math.isnan(x) else f"{100 * x:4.0f}%"


def _num(x, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt % x


def epoch_line(epoch: int, e: dict) -> str:
    """One line of the report, for printing at the end of an epoch."""
    slow = (
        "slowest rank n/a"
        if e["slowest_rank"] is None
        else f"slowest rank {e['slowest_rank']} (+{e['slowest_late_ms']:.2f} ms/step"
        f", others +{e['others_late_ms']:.2f})"
    )
    return (
        f"keras_mpfp16 timeline: epoch {epoch + 1}: {e['steps']} steps, step "
        f"{_num(e['step_ms_median'], '%.1f')} ms median / "
        f"{_num(e['step_ms_p95'], '%.1f')} ms p95 | compute "
        f"{_pct(e['compute_share']).strip()} reduction "
        f"{_pct(e['reduction_share']).strip()} wait {_pct(e['wait_share']).strip()}"
        f" | {_num((e['bytes_per_step'] or 0) / 1e6, '%.2f')} MB/step in "
        f"{e['buckets'] or 0} bucket(s), busbw {_num(e['busbw_gbps'], '%.2f')} GB/s"
        f" | {slow} | overlap <= {_pct(e['overlap_max']).strip()}"
        + (
            ""
            if e.get("hidden") is None
            else f" | hidden under backprop {_pct(e['hidden']).strip()}"
        )
        + f" | {e['loss_scale_skips']} loss-scale skip(s)"
    )


def table(epochs: Sequence[dict]) -> str:
    """The report as a table, one row per epoch (for the end of `fit`)."""
    head = (
        f"{'epoch':>5} {'steps':>5} {'med ms':>8} {'p95 ms':>8} {'comp':>5} "
        f"{'red':>5} {'wait':>5} {'MB/step':>8} {'busbw GB/s':>10} "
        f"{'slowest':>7} {'+ms':>7} {'overlap<=':>9} {'skips':>5}"
    )
    hidden = any(e.get("hidden") is not None for e in epochs)
    if hidden:
        head += f" {'hidden':>6}"
    rows = [head]
    for e in epochs:
        rows.append(
            f"{e['epoch'] + 1:>5} {e['steps']:>5} "
            f"{_num(e['step_ms_median'], '%.1f'):>8} "
            f"{_num(e['step_ms_p95'], '%.1f'):>8} {_pct(e['compute_share']):>5} "
            f"{_pct(e['reduction_share']):>5} {_pct(e['wait_share']):>5} "
            f"{_num((e['bytes_per_step'] or 0) / 1e6, '%.3f'):>8} "
            f"{_num(e['busbw_gbps'], '%.2f'):>10} "
            f"{_num(e['slowest_rank'], '%d'):>7} "
            f"{_num(e['slowest_late_ms'], '%.2f'):>7} "
            f"{_pct(e['overlap_max']):>9} {e['loss_scale_skips']:>5}"
            + (f" {_pct(e.get('hidden')):>6}" if hidden else "")
        )
    return "\n".join(rows)
