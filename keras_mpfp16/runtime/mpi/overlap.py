"""One communication thread per rank: gradient buckets reduced while backprop runs.

Horovod's design with a fixed order. The train step hands each gradient
bucket, as soon as its gradients exist, to this process's one
communication thread (`submit`: a cheap call that never blocks the
caller), and collects each result before the optimizer applies it
(`wait`). The thread reduces the buckets strictly in the order they were
submitted; the step submits them in bucket-index order (its submit calls
are chained in program order, `backend/tf_order.py`), and `submit` checks
that order (`OrderError`), so the sequence of collectives on the thread's
communicator is the same on every rank by construction, never by arrival
timing.

The thread's collectives run on their own communicator (`world.channel
("overlap")`), so they can never match a collective another thread issues
meanwhile (the metric reduction on `"train"`, the stall inspector's
heartbeats on theirs); that needs MPI_THREAD_MULTIPLE on every rank
(`world.thread_multiple()`): without it the bridge keeps the synchronous
path. The observers (stall inspector, trace recorder) are not entered on
the thread (`observers.unobserved`): the waiting step thread is the one the
stall inspector watches, under the bucket's name.

A failure on the thread (an MPI error, a step-check error, anything) is
kept and raised by the `wait` of that bucket and of every later one, on
the step's thread, with the thread's traceback in the message: the step
fails as a synchronous reduction would, and the library's failure path
(`runtime/supervision/failure.py`) ends the job. After a failure the
thread runs no further collective (its rank is about to end the job).

Nothing here imports a deep-learning framework: a job is any callable.
"""

from __future__ import annotations

import threading
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any


class OrderError(RuntimeError):
    """A bucket was submitted out of the fixed order."""


class CommThreadError(RuntimeError):
    """A job failed on the communication thread (the message has its traceback)."""


class CommThread:
    """Runs submitted jobs one at a time, in submission order, on one thread.

    Args:
        run: Wraps each job's call on the thread (e.g. the communicator and
            observer set-up); `run(job)` returns `job()`'s result. Defaults
            to calling the job.
        name: The thread's name.
    """

    def __init__(
        self,
        run: Callable[[Callable[[], Any]], Any] | None = None,
        name="keras_mpfp16 comm",
    ):
        self._run = run or (lambda job: job())
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._results: dict[int, tuple[bool, Any]] = {}
        self._next_ticket = 0
        self._expected: tuple[int, int] | None = None  # (next index, of total)
        self._failure: str | None = None
        self.executed: list = []  # the keys in the order they ran (tests)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, key: tuple[int, int], job: Callable[[], Any]) -> int:
        """Queues `job`, bucket `key = (index, total)` (1-based), and returns
        its ticket. Buckets must come as 1, 2, ..., total, then 1 again.

        Raises:
            OrderError: `key` is not the next bucket of the fixed order.
        """
        index, total = int(key[0]), int(key[1])
        if not 1 <= index <= total:
            raise OrderError(
                f"bucket {index}/{total} is not a bucket of the plan (1 to {total})."
            )
        with self._cond:
            if index != 1 and self._expected != (index, total):
                raise OrderError(
                    f"bucket {index}/{total} submitted out of order: the fixed "
                    "order expects "
                    + (
                        f"bucket {self._expected[0]}/{self._expected[1]} or 1"
                        if self._expected
                        else "bucket 1"
                    )
                    + " next. Buckets are reduced in bucket-index order on every "
                    "rank; a different order would pair different buckets "
                    "across ranks."
                )
            self._expected = (index + 1, total) if index < total else None
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.append((ticket, (index, total), job))
            self._cond.notify_all()
        return ticket

    def wait(self, ticket: int) -> Any:
        """The result of the job with `ticket` (blocks until it ran).

        Raises:
            CommThreadError: that job, or an earlier one, failed on the thread.
        """
        ticket = int(ticket)
        with self._cond:
            while ticket not in self._results:
                self._cond.wait()
            ok, value = self._results.pop(ticket)
        if not ok:
            raise CommThreadError(value)
        return value

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                ticket, key, job = self._queue.popleft()
            if self._failure is not None:
                result = (False, self._failure)
            else:
                try:
                    self.executed.append(key)
                    result = (True, self._run(job))
                except BaseException:  # noqa: BLE001 -- raised by `wait`
                    self._failure = (
                        f"bucket {key[0]}/{key[1]}'s reduction failed on the "
                        "communication thread (KERAS_MPFP16_OVERLAP):\n"
                        + traceback.format_exc()
                    )
                    result = (False, self._failure)
            with self._cond:
                self._results[ticket] = result
                self._cond.notify_all()


_thread: CommThread | None = None
_lock = threading.Lock()


def comm_thread(run: Callable[[Callable[[], Any]], Any]) -> CommThread:
    """This process's communication thread (started at the first call, with
    `run` wrapping its jobs)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = CommThread(run)
        return _thread
