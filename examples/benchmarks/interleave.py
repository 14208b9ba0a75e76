"""Interleaved rounds, the measuring discipline of every benchmark here.

TensorFlow's speed on a shared machine drifts in streaks (docs/benchmarks.md),
so configurations are never measured one after another in blocks: each round
measures every configuration once (A B C, A B C, ...), and comparisons are
medians of per-round ratios.

On a machine shared with other jobs, `run_rounds` can also measure how much
CPU time *other* processes took during each measurement (`OthersCPU`) and
repeat a round in which they took too much.
"""

import os
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def _busy_and_total_seconds() -> tuple[float, float]:
    """Machine-wide busy and total CPU seconds so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user)
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq + steal
    return busy / tick, (busy + idle + iowait) / tick


def _own_seconds() -> float:
    """CPU seconds of this process and of its children that have ended."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class OthersCPU:
    """Share of the machine's CPU that other processes used during a `with` block.

    Busy CPU time of the whole machine (hypervisor steal included) minus the
    CPU time of this process and of the child processes it started and waited
    for, divided by the block's wall time times the number of CPUs: 0 on a
    quiet machine, 0.5 when others kept one of two cores busy. Linux only
    (`share` stays None elsewhere).
    """

    def __init__(self):
        self.share = None

    def __enter__(self):
        try:
            self._start = (
                _busy_and_total_seconds()[0],
                _own_seconds(),
                time.monotonic(),
            )
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc):
        if self._start is None:
            return False
        busy0, own0, t0 = self._start
        busy1, own1, t1 = _busy_and_total_seconds()[0], _own_seconds(), time.monotonic()
        wall = max(t1 - t0, 1e-9)
        others = max(0.0, (busy1 - busy0) - (own1 - own0))
        self.share = min(1.0, others / (wall * (os.cpu_count() or 1)))
        return False


def run_rounds(
    names: Sequence[str],
    measure: Callable[[str], float],
    rounds: int,
    label: str = "",
    fmt: Callable[[float], str] = "{:.0f}".format,
    max_others: float | None = None,
    retries: int = 3,
    contention: dict | None = None,
) -> dict[str, list[float]]:
    """Calls `measure(name)` for every name, `rounds` times over, interleaved.

    Prints each round's figures (formatted with `fmt`) as it ends; returns
    {name: [one per round]}.

    With `max_others`, a round in which other processes used more than that
    share of the machine's CPU during any of its measurements (`OthersCPU`)
    is measured again, up to `retries` times; after that the last attempt is
    kept. `contention`, when given, receives {name: [others' share per kept
    round]} and "repeated_rounds": how many rounds were measured again.
    """
    raw = {n: [] for n in names}
    shares = {n: [] for n in names}
    repeated = 0
    for r in range(rounds):
        for attempt in range(retries + 1):
            figures, seen = {}, {}
            for n in names:
                with OthersCPU() as probe:
                    figures[n] = measure(n)
                seen[n] = probe.share
            busiest = max((s for s in seen.values() if s is not None), default=None)
            noisy = (
                max_others is not None and busiest is not None and busiest > max_others
            )
            if noisy and attempt < retries:
                repeated += 1
                print(
                    f"{label}round {r + 1}: other processes used {busiest:.0%} of the "
                    f"CPU during a measurement (limit {max_others:.0%}); measuring the "
                    "round again",
                    flush=True,
                )
                continue
            break
        for n in names:
            raw[n].append(figures[n])
            shares[n].append(seen[n])
        text = "  ".join(f"{n}={fmt(raw[n][-1])}" for n in names)
        if busiest is not None:
            text += f"  (others' CPU share, max: {busiest:.0%})"
        print(f"{label}round {r + 1}: {text}", flush=True)
    if contention is not None:
        contention.update(shares)
        contention["repeated_rounds"] = repeated
    return raw


def median_ratios(raw: dict[str, list[float]], baseline: str) -> dict[str, float]:
    """Each configuration relative to `baseline`: median of per-round ratios."""
    return {
        n: statistics.median(a / b for a, b in zip(xs, raw[baseline]))
        for n, xs in raw.items()
    }


def export_commit(commit: str, dest: Path) -> None:
    """Writes the package as it was at `commit` into `dest` (for PYTHONPATH).

    Used by the before/after benchmarks to run an earlier version of
    `keras_mpfp16` next to the working tree.
    """
    root = Path(__file__).resolve().parents[2]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", commit, "keras_mpfp16"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
