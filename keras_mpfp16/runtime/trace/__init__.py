"""Tracing: a per-rank timeline of `fit` in Chrome's trace-event format, and
the scaling report. One concept per module:

- `windows`: which steps are traced (`Window`);
- `clocks`: each rank's clock aligned to rank 0's (`align_clocks`);
- `recorder`: this rank's `Recorder`, the running one (`active()`), and its
  observer of the MPI layer's collectives;
- `merge`: reading part files, the merged trace (`read_events`,
  `write_merged`);
- `session`: one recording across ranks (`Session`) and the timeline's
  settings (`env_settings`);
- `scaling`: the scaling report's arithmetic (pure).

The names below are the trace layer's face for the rest of the library
(`from keras_mpfp16.runtime import trace; trace.active()`).

Imports `mpi` and `process` below it, nothing above.
"""

from keras_mpfp16.runtime.trace.clocks import align_clocks
from keras_mpfp16.runtime.trace.merge import read_events, wait_spans, write_merged
from keras_mpfp16.runtime.trace.recorder import (
    TID_HOST,
    TID_REDUCE,
    Recorder,
    activate,
    active,
)
from keras_mpfp16.runtime.trace.session import (
    PATH_ENV,
    REPORT_ENV,
    REPORT_STYLES,
    STEPS_ENV,
    Session,
    env_settings,
)
from keras_mpfp16.runtime.trace.windows import DEFAULT_STEPS, Window

__all__ = [
    "DEFAULT_STEPS",
    "PATH_ENV",
    "REPORT_ENV",
    "REPORT_STYLES",
    "STEPS_ENV",
    "TID_HOST",
    "TID_REDUCE",
    "Recorder",
    "Session",
    "Window",
    "activate",
    "active",
    "align_clocks",
    "env_settings",
    "read_events",
    "wait_spans",
    "write_merged",
]
