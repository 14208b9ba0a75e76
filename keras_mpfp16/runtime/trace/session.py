"""One recording (a `fit`) across ranks, and the timeline's settings.

A `Session` aligns the clocks, starts this rank's recorder, turns each
epoch's step records into the scaling report and merges the trace at the
end. `env_settings()` reads the `KERAS_MPFP16_TIMELINE*` settings.
"""

from __future__ import annotations

import os

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.trace.clocks import align_clocks
from keras_mpfp16.runtime.trace.merge import write_merged
from keras_mpfp16.runtime.trace.recorder import Recorder, activate
from keras_mpfp16.runtime.trace.windows import Window

# Registered in _settings.py.
PATH_ENV = env.setting("TIMELINE").name
STEPS_ENV = env.setting("TIMELINE_STEPS").name
REPORT_ENV = env.setting("TIMELINE_REPORT").name
REPORT_STYLES = ("epoch", "table")


def env_settings() -> dict | None:
    """The timeline's environment variables, read in one place.

    `KERAS_MPFP16_TIMELINE=path` turns the timeline on; `..._STEPS` sets the
    window (`"100-200"`, `"every:50"`); `..._REPORT` (`1`/`epoch`, `table`,
    `0`) prints the scaling report. The report alone (no path) is allowed.

    Returns:
        `{"path": str | None, "steps": str | None, "report": bool | str}`,
        or None when neither the path nor the report is asked for.
    """
    path = (env.get("TIMELINE") or "").strip() or None
    steps = (env.get("TIMELINE_STEPS") or "").strip() or None
    report = env.get("TIMELINE_REPORT")
    if path is None and not report:
        return None
    return {"path": path, "steps": steps, "report": report}


class Session:
    """One `fit`'s recording on this rank: starts the recorder (clock
    alignment is collective: every rank constructs a Session together),
    turns each epoch's step records into the epoch's report, and merges the
    trace at the end.

    Args:
        path: The merged trace's file, or None (the report only).
        window: Which steps are traced.
    """

    def __init__(self, path: str | None, window: Window):
        import socket

        from keras_mpfp16.runtime.mpi import world

        world.init()
        self.path = os.fspath(path) if path is not None else None
        self.window = window
        self.rank, self.size = world.rank(), world.size()
        self.comm = world.world().comm.Dup() if self.size > 1 else None
        if self.comm is not None:
            self.clock = align_clocks(self.comm)
        else:
            self.clock = {"offset_ns": 0, "bound_us": 0.0, "same_clock": True}
            self.clock["ranks"] = [dict(self.clock)]
        host = socket.gethostname()
        part = f"{self.path}.rank{self.rank}" if self.path else None
        self.recorder = Recorder(
            self.rank, self.size, host, window, part, self.clock["offset_ns"]
        )
        self.epochs: list[dict] = []
        activate(self.recorder)

    def end_epoch(self, epoch: int, skips: int = 0) -> dict:
        """The epoch's report from every rank's records (collective)."""
        from keras_mpfp16.runtime.trace import scaling

        mine = self.recorder.take_records()
        everyone = self.comm.allgather(mine) if self.comm is not None else [mine]
        entry = {"epoch": epoch, **scaling.epoch_report(everyone, skips)}
        self.epochs.append(entry)
        return entry

    def report(self) -> dict:
        ranks = self.clock["ranks"]
        return {
            "ranks": self.size,
            "window": repr(self.window),
            "clock_bound_us": max(r["bound_us"] for r in ranks),
            "epochs": list(self.epochs),
        }

    def finish(self) -> str | None:
        """Gathers every rank's events to rank 0, which writes `path`
        (collective); removes the part files once it is written. Returns the
        path written (rank 0), else None."""
        recorder = self.recorder
        activate(None)
        recorder.flush()
        written = None
        if self.path is not None:
            if self.comm is not None:
                per_rank = self.comm.gather(recorder.events, root=0)
            else:
                per_rank = [recorder.events]
            ok = True
            if self.rank == 0:
                try:
                    other = {
                        "keras_mpfp16": {
                            "report": self.report(),
                            "clock": self.clock["ranks"],
                            "window": repr(self.window),
                        }
                    }
                    write_merged(self.path, per_rank, other)
                    written = self.path
                except OSError:
                    ok = False
                    raise
                finally:
                    if self.comm is not None:
                        self.comm.bcast(ok, root=0)
            elif self.comm is not None:
                ok = self.comm.bcast(None, root=0)
            recorder.close(remove=ok)
        else:
            recorder.close()
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
        return written


__all__ = [
    "PATH_ENV",
    "REPORT_ENV",
    "REPORT_STYLES",
    "STEPS_ENV",
    "Session",
    "env_settings",
]
