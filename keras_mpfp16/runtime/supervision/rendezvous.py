"""Rendezvous: did every rank make this call, or only this one?

`model.evaluate(...)` may be called on all ranks (then the ranks split the
batches and combine their metrics) or on one rank alone (typically rank 0
after training, e.g. on a model it loaded): then it must run without any
collective, or it would wait forever for ranks that never come. No rank can
know on its own which case it is in, so the ranks ask a coordinator:

- every rank that enters such a call sends "entered" to a coordinator thread
  on rank 0 (rank 0's own main thread tells it through a queue) and waits for
  its verdict;
- when every rank has entered, the verdict is "together" for all of them;
- a rank that has waited `wait` seconds without the others (default 5 s,
  `KERAS_MPFP16_EVALUATE_WAIT`), or at once when some other rank has already
  finished (exited), gets "alone" and runs the call by itself.

Point-to-point messages to one thread are not a collective: a rank alone is
never blocked for longer than `wait`. A rank that arrives after another was
sent off alone is told so (the verdict's note), so a job whose ranks call
`evaluate` too far apart says why they did not evaluate together.

The coordinator needs MPI_THREAD_MULTIPLE (mpi4py asks for it by default);
with a lower thread level every rank is "alone" and a warning says why.
Nothing here imports Keras.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import warnings
from dataclasses import dataclass

from keras_mpfp16 import _settings as env

WAIT_ENV = env.setting("EVALUATE_WAIT").name
DEFAULT_WAIT = env.setting("EVALUATE_WAIT").default
_TAG_ENTER = 11
_TAG_VERDICT = 12
# How long after a rank was sent off alone a late arrival is still named in
# the verdict's note.
_LATE_WINDOW = 120.0


@dataclass(frozen=True)
class Verdict:
    """The coordinator's answer to one rank.

    Attributes:
        together: True when every rank entered the call.
        note: Why this rank goes alone, when that is worth telling the user.
    """

    together: bool
    note: str = ""


def _wait_seconds() -> float:
    return env.get("EVALUATE_WAIT")


class _Coordinator:
    """Rank 0's thread: collects arrivals and sends verdicts."""

    def __init__(self, comm, size: int, wait: float):
        self.comm = comm
        self.size = size
        self.wait = wait
        self.local: queue.Queue = queue.Queue()  # rank 0's own arrivals
        self.waiting: dict[int, tuple[str, float]] = {}  # rank -> (what, since)
        self.gone: set[int] = set()
        self.last_alone: tuple[float, int, str] | None = None
        self._rank0_reply: queue.Queue = queue.Queue()
        self._sends: list = []
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="keras_mpfp16-rendezvous", daemon=True
        )

    # -- rank 0's main thread ------------------------------------------------------

    def enter(self, what: str) -> Verdict:
        self.local.put(what)
        return self._rank0_reply.get()

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2.0)

    # -- the thread ----------------------------------------------------------------

    def _reply(self, rank: int, verdict: Verdict) -> None:
        if rank == 0:
            self._rank0_reply.put(verdict)
        else:
            self._sends.append(self.comm.isend(verdict, dest=rank, tag=_TAG_VERDICT))

    def _receive(self) -> None:
        from mpi4py import MPI

        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_TAG_ENTER, status=status):
            source = status.Get_source()
            kind, what = self.comm.recv(source=source, tag=_TAG_ENTER)
            if kind == "gone":
                self.gone.add(source)
            else:
                self._arrive(source, what)
        while True:
            try:
                what = self.local.get_nowait()
            except queue.Empty:
                break
            self._arrive(0, what)

    def _arrive(self, rank: int, what: str) -> None:
        self.waiting[rank] = (what, time.monotonic())

    def _decide(self) -> None:
        if not self.waiting:
            return
        whats = {w for w, _ in self.waiting.values()}
        if len(self.waiting) == self.size and len(whats) == 1:
            for rank in list(self.waiting):
                self._reply(rank, Verdict(True))
            self.waiting.clear()
            return
        now = time.monotonic()
        for rank, (what, since) in list(self.waiting.items()):
            if self.gone or now - since >= self.wait:
                del self.waiting[rank]
                self._reply(rank, Verdict(False, self._note(rank, what, now)))
                self.last_alone = (now, rank, what)

    def _note(self, rank: int, what: str, now: float) -> str:
        if self.gone:
            return ""  # the usual "rank 0 evaluates after the others finished"
        if self.last_alone is not None and now - self.last_alone[0] < _LATE_WINDOW:
            then, other, other_what = self.last_alone
            if other != rank:
                return (
                    f"rank {other} ran {other_what} alone {now - then:.1f}s "
                    f"before rank {rank} arrived in {what}: ranks split the work "
                    f"only when they all call it within {self.wait:g}s of each "
                    f"other ({WAIT_ENV}). Each rank evaluated its own data."
                )
        return ""

    def _run(self) -> None:
        while not self._stop.is_set():
            self._receive()
            self._decide()
            self._sends = [r for r in self._sends if not r.Test()]
            time.sleep(0.005 if self.waiting else 0.05)


@dataclass
class _State:
    comm: object
    rank: int
    size: int
    coordinator: _Coordinator | None
    enabled: bool


_state: _State | None = None


def start(comm) -> None:
    """Sets up the rendezvous on `comm` (every rank must call it: it duplicates
    the communicator). A one-process world needs nothing."""
    global _state
    from mpi4py import MPI

    size = comm.Get_size()
    if size == 1:
        _state = _State(None, 0, 1, None, False)
        return
    private = comm.Dup()
    # Rank 0's settings for everyone, so all ranks agree on being enabled.
    wait = private.bcast(_wait_seconds(), root=0)
    enabled = private.allreduce(
        int(MPI.Query_thread() == MPI.THREAD_MULTIPLE), op=MPI.MIN
    )
    rank = private.Get_rank()
    coordinator = None
    if enabled and rank == 0:
        coordinator = _Coordinator(private, size, wait)
        coordinator.thread.start()
    _stop_previous()
    _state = _State(private, rank, size, coordinator, bool(enabled))
    atexit.register(_leave)


def _stop_previous() -> None:
    if _state is not None and _state.coordinator is not None:
        _state.coordinator.stop()


def _leave() -> None:
    """At exit: tell the coordinator this rank will not come any more."""
    state = _state
    if state is None or not state.enabled:
        return
    if state.rank == 0:
        if state.coordinator is not None:
            state.coordinator.stop()
        return
    try:
        request = state.comm.isend(("gone", ""), dest=0, tag=_TAG_ENTER)
        deadline = time.monotonic() + 2.0
        while not request.Test() and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:  # MPI already finalised: nothing left to tell
        pass


_warned_disabled = False


def enter(what: str) -> Verdict:
    """Announces that this rank entered `what` and waits for the verdict.

    Args:
        what: The call, e.g. `"evaluate"`; ranks are together only when all
            entered the same `what`.

    Returns:
        A `Verdict`: `together=True` when every rank entered `what` (within
        the wait), else `together=False` (this rank runs the call alone).
    """
    global _warned_disabled
    state = _state
    if state is None:
        raise RuntimeError(
            "keras_mpfp16.runtime.supervision.rendezvous.enter() before keras_mpfp16.init()."
        )
    if state.size == 1:
        return Verdict(True)
    if not state.enabled:
        if not _warned_disabled:
            _warned_disabled = True
            warnings.warn(
                "keras_mpfp16: the MPI library does not provide "
                "MPI_THREAD_MULTIPLE, which the evaluate rendezvous needs; "
                "every rank evaluates its own data alone.",
                stacklevel=2,
            )
        return Verdict(False)
    if state.rank == 0:
        return state.coordinator.enter(what)
    state.comm.send(("enter", what), dest=0, tag=_TAG_ENTER)
    return state.comm.recv(source=0, tag=_TAG_VERDICT)
