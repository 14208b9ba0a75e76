"""Which train steps a timeline traces (`Window`).

Steps outside the window write no trace events (every step still leaves a
small record for the scaling report).
"""

from __future__ import annotations

DEFAULT_STEPS = "0-19"


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


__all__ = ["DEFAULT_STEPS", "Window"]
