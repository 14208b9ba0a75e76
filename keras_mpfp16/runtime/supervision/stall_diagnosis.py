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


def no_progress(
    stalled: float,
    waiting: dict[int, Wait],
    size: int,
    where,
    rank0: tuple[int, str, str, bool],
    setting: str,
) -> str:
    """Why a job that made no progress for `stalled` seconds is ended.

    Args:
        stalled: Seconds the oldest waiting rank has waited.
        waiting: The ranks waiting in a collective (rank 0's table).
        size: Ranks in the job.
        where: `rank -> 'rank 2 (host node3)'`.
        rank0: Rank 0's own state: `(collectives entered, the last one's
            name, the one before's name, inside a collective now)`.
        setting: `'NAME=value'` of the setting that ended it.
    """
    seq, name = min((e.seq, e.name) for e in waiting.values())
    missing = [r for r in range(size) if r not in waiting]
    ends = (
        f"The job ends now ({setting} seconds; raise it if a step can "
        "legitimately take longer, 0 never ends a hang)."
    )
    if not missing:
        who = ", ".join(where(r) for r in sorted(waiting))
        return (
            f"no progress for {stalled:.0f}s: every rank ({who}) waits in "
            f"collective #{seq} {name!r}, which does not complete: the network "
            f"or the MPI library is stuck. {ends}"
        )
    # Every rank numbers the library's collectives alike: a rank that has
    # not arrived in #seq left #seq-1. Its name is rank 0's, when rank 0 was
    # there.
    r0_seq, r0_name, r0_previous, r0_inside = rank0
    if r0_seq == seq:
        before = r0_previous
    elif r0_seq == seq - 1 and not r0_inside:
        before = r0_name
    else:
        before = ""
    doing = []
    for r in missing:
        last = f"#{seq - 1} {before!r}" if before else f"#{seq - 1}"
        if r == 0 and r0_seq != seq - 1:
            last = f"#{r0_seq} {r0_name!r}"
        # The step whose collective the others wait in is the one it is in.
        step = train_step_of(name)
        after = (
            f"in train step {step}: its computation, or a callback or the "
            "input pipeline before it"
            if step is not None
            else "computing, or stuck in a call outside MPI"
        )
        doing.append(
            f"{where(r)} has not arrived: it left collective {last} and has "
            f"been outside MPI since ({after})"
        )
    waiters = ", ".join(str(r) for r in sorted(waiting))
    return (
        f"no progress for {stalled:.0f}s: {'; '.join(doing)}, while rank"
        f"{'s' if len(waiting) > 1 else ''} {waiters} wait{'' if len(waiting) > 1 else 's'} "
        f"in collective #{seq} {name!r}. {ends}"
    )
