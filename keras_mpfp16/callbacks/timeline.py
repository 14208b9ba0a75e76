"""Timeline: a trace of where each rank's step time goes, and a scaling report."""

from __future__ import annotations

import os

import keras

from keras_mpfp16.runtime import trace
from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.trace import scaling


class Timeline(keras.callbacks.Callback):
    """Records a trace-event timeline of `fit` and measures how it scales.

    Every rank records its train steps (host timestamps from this callback),
    each gradient bucket's reduction (bytes, wire dtype, path, bucket
    index), the other collectives of a step, validation, checkpoint writes,
    the initial broadcast, loss-scale skips and changes, and the stall
    inspector's warnings, on a clock aligned to rank 0's. Each rank writes
    its events to `<path>.rank<r>` as it goes (flushed after every traced
    step, so a crashed job leaves a readable trace); at the end of `fit`
    rank 0 merges them, with "wait for slowest rank" spans, into `path`
    (Chrome's trace-event JSON: open it in https://ui.perfetto.dev,
    `chrome://tracing` or TensorBoard's trace viewer) and removes the part
    files.

    The same `fit` also gets a scaling report per epoch (median and p95
    step time, share of compute / reduction / waiting, bytes per step, bus
    bandwidth, the slowest rank, the reduction's overlap with the backward
    pass): always in `timeline.report`, printed on rank 0 when `report` is
    set. See docs/timeline.md for the definitions and how to read a trace.

    Set `KERAS_MPFP16_TIMELINE=path` (and optionally
    `KERAS_MPFP16_TIMELINE_STEPS`, `KERAS_MPFP16_TIMELINE_REPORT`) to get
    one in every multi-process `fit` without changing the script.

    Keras runs a step's function synchronously between
    `on_train_batch_begin` and `on_train_batch_end`, so a step span is the
    step; with `steps_per_execution=k` one span covers k steps.

    Args:
        path: The merged trace file, or None for the report only.
        steps: The traced window of train steps, counted from 0 over the
            whole `fit`: `"100-200"` (inclusive), `(100, 200)`, one step, or
            `"every:K"`. Default `"0-19"`. Every step still counts in the
            report; only the window writes trace events.
        every: Trace every `every`-th step instead of a window.
        report: Print the report on rank 0: `True` or `"epoch"` (one line
            per epoch), `"table"` (a table at the end of `fit`), `False`.

    Example:

    ```python
    timeline = kmp.callbacks.Timeline("trace.json", steps="100-200", report=True)
    model.fit(x, y, epochs=3, callbacks=[timeline])
    timeline.report["epochs"][-1]["busbw_gbps"]
    ```
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        steps=None,
        every: int | None = None,
        report: bool | str = False,
    ):
        super().__init__()
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ValueError(
                "Invalid value for argument `path`: expected a file path or None. "
                f"Received: path={path!r}"
            )
        if not (report is True or report is False or report in ("epoch", "table")):
            raise ValueError(
                "Invalid value for argument `report`: expected True, False, "
                f"'epoch' or 'table'. Received: report={report!r}"
            )
        self.path = os.fspath(path) if path is not None else None
        self.window = trace.Window(steps, every)
        self.report_style = "epoch" if report is True else (report or None)
        self.report: dict = {}
        self.written: str | None = None
        self._session: trace.Session | None = None
        self._base = 0
        self._batches = 0
        self._epoch = 0
        self._skipped_at_epoch = None
        self._traced_last = False
        self._scale = None
        self._skipped = None
        self._val_begin = 0

    @classmethod
    def from_env(cls) -> Timeline | None:
        """The timeline `KERAS_MPFP16_TIMELINE*` asks for, or None."""
        settings = trace.env_settings()
        if settings is None:
            return None
        return cls(settings["path"], steps=settings["steps"], report=settings["report"])

    # -- loss scale ---------------------------------------------------------------

    def _loss_scale(self):
        """(scale, skipped steps) of a DistributedOptimizer, else (None, None)."""
        opt = getattr(self.model, "optimizer", None)
        scale = getattr(opt, "dynamic_scale", None)
        skipped = getattr(opt, "skipped_steps", None)
        if scale is None or skipped is None:
            return None, None
        return float(keras.ops.convert_to_numpy(scale)), int(
            keras.ops.convert_to_numpy(skipped)
        )

    # -- fit ----------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._session = trace.Session(self.path, self.window)
        self._base = self._batches = 0
        self._traced_last = False
        self.report = self._session.report()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._base += self._batches
        self._batches = 0
        self._skipped_at_epoch = None  # read at the first step (built by then)

    def on_train_batch_begin(self, batch, logs=None):
        if self._session is None:
            return
        recorder = self._session.recorder
        if self._skipped_at_epoch is None:
            self._skipped_at_epoch = self._loss_scale()[1] or 0
        step = self._base + batch
        if step in self.window and not self._traced_last:
            # The loss-scale state before the window's first step (or the
            # first step after a gap), so a change is put on the right step.
            self._scale, self._skipped = self._loss_scale()
        recorder.begin_step(step, self._epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._session is None:
            return
        recorder = self._session.recorder
        tracing = recorder.tracing
        recorder.end_step()
        self._batches = batch + 1
        self._traced_last = tracing
        if tracing and self._scale is not None:
            scale, skipped = self._loss_scale()
            step = self._base + batch
            if skipped > self._skipped:
                recorder.instant(
                    "loss scale: step skipped",
                    "loss_scale",
                    {"step": step, "scale": scale, "skipped_total": skipped},
                )
            if scale > self._scale:
                recorder.instant(
                    "loss scale: grow",
                    "loss_scale",
                    {"step": step, "from": self._scale, "to": scale},
                )
            elif scale < self._scale:
                recorder.instant(
                    "loss scale: back off",
                    "loss_scale",
                    {"step": step, "from": self._scale, "to": scale},
                )
            self._scale, self._skipped = scale, skipped

    def on_test_begin(self, logs=None):
        if self._session is not None:
            self._session.recorder.in_validation = True
            self._val_begin = self._session.recorder.now_ns()

    def on_test_end(self, logs=None):
        if self._session is not None:
            recorder = self._session.recorder
            recorder.in_validation = False
            recorder.span_event(
                "validation",
                "validation",
                self._val_begin,
                recorder.now_ns(),
                {"epoch": self._epoch + 1},
            )

    def on_epoch_end(self, epoch, logs=None):
        if self._session is None:
            return
        _, skipped = self._loss_scale()
        skips = (skipped or 0) - (self._skipped_at_epoch or 0)
        entry = self._session.end_epoch(epoch, skips)
        self.report = self._session.report()
        if self.report_style == "epoch" and world.is_root():
            print(scaling.epoch_line(epoch, entry), flush=True)

    def on_train_end(self, logs=None):
        if self._session is None:
            return
        session, self._session = self._session, None
        self.report = session.report()
        self.written = session.finish()
        if self.report_style == "table" and world.is_root():
            print(
                f"keras_mpfp16 timeline: scaling report, {session.size} ranks\n"
                + scaling.table(self.report["epochs"]),
                flush=True,
            )
