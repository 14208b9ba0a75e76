"""The seam: every private Keras and TensorFlow access of keras_mpfp16.

Keras 3 and TensorFlow export no public API for a few things this package
needs (the backend's fused RNN loop, reading a variable without autocast,
the XLA decision of `compile`, whether a trace is XLA-compiled, ...). Every
such access lives here, behind a named accessor, so that:

- a maintainer sees the whole list in two files: `internals/keras.py`
  (`keras.src.*` and private attributes of Keras objects) and
  `internals/tensorflow.py` (`tensorflow.python.*`);
- a Keras or TensorFlow release that moves one of them fails loudly, with a
  `KerasInternalsError` naming the installed versions, the internal and the
  keras_mpfp16 feature that needs it: internals that exist at module level
  are resolved when the seam is imported (all of them, one error listing
  every one that is missing); attributes that only exist on instances are
  checked at first use, i.e. when a model is compiled or a callback is set
  on it. Nothing silently falls back to a no-op;
- `check()` probes every accessor, instance attributes included, so a test
  (run at both ends of the tested range in CI) proves they all resolve.

Only code above the seam imports it; the seam imports nothing of
keras_mpfp16 but this module, so it cannot create an import circle.
`internals/tensorflow.py` imports TensorFlow and is imported only by the
TensorFlow bridge (`keras_mpfp16/backend/tensorflow.py`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# The ends of the range `.ci/run` tests (pyproject.toml's pins follow them).
TESTED_KERAS = ("3.10.0", "3.15.1")
TESTED_TENSORFLOW = ("2.18.0", "2.21.0")


def installed_versions() -> str:
    """The installed Keras (and TensorFlow, if imported) versions, for messages."""
    parts = []
    keras = sys.modules.get("keras")
    parts.append(f"Keras {getattr(keras, '__version__', 'unknown')}")
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        parts.append(f"TensorFlow {getattr(tf, '__version__', 'unknown')}")
    return " with ".join(parts)


@dataclass(frozen=True)
class Internal:
    """One private Keras/TensorFlow access, as listed in the seam.

    Attributes:
        accessor: The seam's name for it (a function or constant of the
            seam module).
        internal: What it reaches, e.g. `"keras.src.backend.rnn"`.
        feature: The keras_mpfp16 feature that needs it, for error messages.
    """

    accessor: str
    internal: str
    feature: str


class KerasInternalsError(RuntimeError):
    """A Keras/TensorFlow internal that keras_mpfp16 needs is missing or changed.

    The message names the installed versions, each missing internal and the
    feature that needs it, and the tested range.
    """

    def __init__(self, problems: list[tuple[Internal, str]]):
        self.problems = list(problems)
        lines = [
            f"- {p.feature} needs `{p.internal}` (accessor "
            f"keras_mpfp16.internals.{p.accessor}): {detail}"
            for p, detail in self.problems
        ]
        super().__init__(
            f"keras_mpfp16 cannot run on {installed_versions()}: "
            + (
                "an internal it needs is"
                if len(lines) == 1
                else "internals it needs are"
            )
            + " missing or changed.\n"
            + "\n".join(lines)
            + f"\nkeras_mpfp16 is tested with Keras {TESTED_KERAS[0]} to "
            f"{TESTED_KERAS[1]} and TensorFlow {TESTED_TENSORFLOW[0]} to "
            f"{TESTED_TENSORFLOW[1]}; install versions in that range."
        )


__all__ = [
    "TESTED_KERAS",
    "TESTED_TENSORFLOW",
    "Internal",
    "KerasInternalsError",
    "installed_versions",
]
