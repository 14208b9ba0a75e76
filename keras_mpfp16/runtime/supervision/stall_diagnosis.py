"""The stall inspector's diagnoses: what each rank does, and why ranks cannot meet.

Pure functions of rank 0's table (`stall_messages.Wait` / `Finished` per
rank): the text of the warnings and errors `runtime/stall.py` prints. The
cause is named from what the ranks reported -- uneven batches are blamed only
when the ranks' train steps show it.

Nothing here imports Keras or MPI.
"""

from __future__ import annotations

import re
import time

from keras_mpfp16.runtime.supervision.stall_messages import Finished, Report, Wait

_STEP_RE = re.compile(r"train step (-?\d+)")


def train_step_of(name: str) -> int | None:
    """The train step a collective's name refers to (`'... train step 12'`), if any."""
    m = _STEP_RE.search(name or "")
    return int(m.group(1)) if m else None


def describe(who: str, entry: Report | None, silent: float | None = None) -> str:
    """One rank's line in a report.

    Args:
        who: The rank and its host (`'rank 2 (host node3)'`).
        entry: Its last report in rank 0's table, None when it is not in a
            collective.
        silent: Seconds since anything was heard from it, when that is past
            the heartbeat timeout (else None).
    """
    if silent is not None:
        last = (
            ""
            if entry is None
            else f"; last report: {entry.kind} #{entry.seq} {entry.name!r}"
        )
        return f"{who}: silent for {silent:.0f}s{last}"
    if entry is None:
        return f"{who}: not in a collective (computing, or stuck outside MPI)"
    if isinstance(entry, Finished):
        step = "" if entry.last_step is None else f", last train step {entry.last_step}"
        return (
            f"{who}: finished ({entry.how}) after {entry.seq} collectives "
            f"(last: #{entry.seq} {entry.name!r}{step})"
        )
    waited = time.time() - entry.since
    return f"{who}: waiting {waited:.0f}s in collective #{entry.seq} {entry.name!r}"


def cause_finished(waiting: dict[int, Wait], finished: dict[int, Finished]) -> str:
    """Why ranks that finished and ranks that wait cannot meet."""
    unknown_exit = [r for r, e in finished.items() if "SystemExit" in str(e.how or "")]
    if unknown_exit:
        return (
            f"rank{'s' if len(unknown_exit) > 1 else ''} "
            f"{', '.join(map(str, sorted(unknown_exit)))} left the script "
            "through an uncaught SystemExit while the others still need "
            "them."
        )
    w_rank, w = min(waiting.items())
    f_rank, f = min(finished.items())
    # The waiting rank's train step: the one its collective belongs to,
    # else the last one it reduced gradients for.
    w_step = train_step_of(w.name)
    if w_step is None:
        w_step = w.last_step
    f_step = f.last_step
    if w_step is not None and f_step is not None and w_step > f_step:
        return (
            f"rank {w_rank} is at train step {w_step} but rank {f_rank} "
            f"finished after train step {f_step}: rank {w_rank} had more "
            f"batches (steps) than rank {f_rank}. Shard data with "
            "keras_mpfp16.shard so every rank runs the same number of steps."
        )
    hint = ""
    if "model signature" in w.name:
        hint = (
            " 'model signature check' runs when a model compiled with "
            "DistributedOptimizer is built or trained; some ranks did that "
            "and others did not (for example load_model, fit or evaluate on "
            "one rank only)."
        )
    return (
        f"rank {w_rank} waits in collective #{w.seq} {w.name!r}, which rank "
        f"{f_rank} never entered before finishing after {f.seq} collectives "
        f"(last: {f.name!r}): the ranks made different keras_mpfp16 calls."
        f"{hint} Every rank must make the same collective calls in the same "
        "order."
    )


def cause_different(waiting: dict[int, Wait]) -> str:
    """Why ranks waiting in different collectives cannot meet."""
    steps = {r: train_step_of(e.name) for r, e in waiting.items()}
    known = {r: s for r, s in steps.items() if s is not None}
    if len(known) == len(waiting) and len(set(known.values())) > 1:
        parts = ", ".join(
            f"rank {r} at train step {s}" for r, s in sorted(known.items())
        )
        return (
            f"the ranks are at different train steps ({parts}): some ranks "
            "ran more batches than others. Shard data with "
            "keras_mpfp16.shard so every rank runs the same number of steps."
        )
    parts = "; ".join(
        f"rank {r} in #{e.seq} {e.name!r}" for r, e in sorted(waiting.items())
    )
    return (
        f"the ranks wait in different collectives ({parts}): they made "
        "different keras_mpfp16 calls (for example evaluate, a barrier or a "
        "callback's collective on some ranks only). Every rank must make the "
        "same collective calls in the same order."
    )
