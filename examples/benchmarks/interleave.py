"""Interleaved rounds, the measuring discipline of every benchmark here.

TensorFlow's speed on a shared machine drifts in streaks (docs/benchmarks.md),
so configurations are never measured one after another in blocks: each round
measures every configuration once (A B C, A B C, ...), and comparisons are
medians of per-round ratios.
"""

import statistics
from collections.abc import Callable, Sequence


def run_rounds(
    names: Sequence[str],
    measure: Callable[[str], float],
    rounds: int,
    label: str = "",
    fmt: Callable[[float], str] = "{:.0f}".format,
) -> dict[str, list[float]]:
    """Calls `measure(name)` for every name, `rounds` times over, interleaved.

    Prints each round's figures (formatted with `fmt`) as it ends; returns
    {name: [one per round]}.
    """
    raw = {n: [] for n in names}
    for r in range(rounds):
        for n in names:
            raw[n].append(measure(n))
        figures = "  ".join(f"{n}={fmt(raw[n][-1])}" for n in names)
        print(f"{label}round {r + 1}: {figures}", flush=True)
    return raw


def median_ratios(raw: dict[str, list[float]], baseline: str) -> dict[str, float]:
    """Each configuration relative to `baseline`: median of per-round ratios."""
    return {
        n: statistics.median(a / b for a, b in zip(xs, raw[baseline]))
        for n, xs in raw.items()
    }
