"""The stall inspector's and the failure hooks' logic, without launching MPI jobs.

The multi-process behaviour is tested under mpirun in test_mpi_faults.py and,
across emulated nodes, in test_cluster.py.
"""

import threading
import time

import pytest

from keras_mpfp16 import _settings as env
from keras_mpfp16.runtime.supervision import stall
from keras_mpfp16.runtime.supervision.stall_messages import (
    Finished,
    Left,
    Suspect,
    Wait,
)


class _FakeComm:
    def __init__(self, rank=0, size=2):
        self._rank, self._size = rank, size
        self.sent = []

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size

    def isend(self, obj, dest, tag):
        req = _FakeRequest(obj)
        self.sent.append(req)
        return req


class _FakeRequest:
    """A send that completes only when the test says so; Test() can block."""

    gate: threading.Event | None = None

    def __init__(self, obj):
        self.obj = obj
        self.done = False

    def Test(self):
        if _FakeRequest.gate is not None:
            # Hold this thread inside the pruning of `_pending` until another
            # thread has had the chance to send (or 0.5 s have passed).
            _FakeRequest.gate.wait(0.5)
        return self.done


def test_pending_sends_are_never_lost_when_two_threads_send():
    """`_pending` must only change under its lock (issue 14).

    Thread A is held inside the pruning of `_pending` while thread B sends.
    Without the lock, A then overwrites the list B appended to and B's
    request (whose buffer MPI may still be reading) is dropped.
    """
    insp = stall.Inspector(_FakeComm(rank=1), timeout=60, abort_after=0)
    insp._send(Wait(1, "x", 0.0, None))  # one outstanding request to prune
    _FakeRequest.gate = threading.Event()
    try:
        a = threading.Thread(target=insp._send, args=(Left(1),))
        a.start()
        time.sleep(0.1)  # A is now inside Test()
        b = threading.Thread(target=insp._send, args=(Wait(2, "y", 0.0, None),))
        b.start()
        time.sleep(0.1)
        _FakeRequest.gate.set()
        a.join(5)
        b.join(5)
    finally:
        _FakeRequest.gate = None
    sent = insp.comm.sent
    assert len(sent) == 3
    assert set(map(id, insp._pending)) == set(map(id, sent)), (
        "a pending send was dropped"
    )


def _insp(size=2, **kw):
    return stall.Inspector(
        _FakeComm(size=size),
        timeout=60,
        abort_after=0,
        hosts=[f"node{r + 1}" for r in range(size)],
        **kw,
    )


def _conflict_message(insp, monkeypatch):
    failures = []
    monkeypatch.setattr(insp, "_fail", failures.append)
    clock = [100.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: clock[0])
    insp._check()
    clock[0] += stall._CONFLICT_GRACE + 0.1
    insp._check()
    assert len(failures) == 1
    return failures[0]


def test_finished_vs_model_signature_check_names_that_not_batches(monkeypatch):
    """Issue 11: a rank waiting in a non-step collective must not be told
    about batches."""
    insp = _insp()
    now = time.time()
    insp.table = {
        0: Finished(2, "barrier", None, "its script ended"),
        1: Wait(3, "model signature check", now, None),
    }
    msg = _conflict_message(insp, monkeypatch)
    assert "model signature check" in msg
    assert "batches" not in msg
    assert "rank 1 (host node2): waiting" in msg
    assert "rank 0 (host node1): finished (its script ended) after 2" in msg


@pytest.mark.parametrize(
    "seq, waiting, found, absent",
    [
        # Rank 1 waits in evaluate's collective: named, not a batch count.
        (
            41,
            "allreduce (evaluate metrics)",
            ["'allreduce (evaluate metrics)'", "never entered"],
            ["batches"],
        ),
        # Rank 1 is at a later train step: more batches than rank 0.
        (
            37,
            "step check before gradient allreduce, bucket 1/1, train step 12",
            [
                "rank 1 is at train step 12 but rank 0 finished after train step 11",
                "more batches",
            ],
            [],
        ),
    ],
    ids=["evaluate-collective-named", "later-train-step-blames-batches"],
)
def test_finished_rank_vs_a_waiting_one(monkeypatch, seq, waiting, found, absent):
    """Rank 0's script ended after train step 11; rank 1 waits in `waiting`."""
    insp = _insp()
    insp.table = {
        0: Finished(
            seq - 1,
            "gradient allreduce, bucket 1/1, train step 11",
            11,
            "its script ended",
        ),
        1: Wait(seq, waiting, time.time(), 11),
    }
    msg = _conflict_message(insp, monkeypatch)
    for text in found:
        assert text in msg
    for text in absent:
        assert text not in msg


def test_unknown_systemexit_is_named_as_the_cause(monkeypatch):
    insp = _insp()
    now = time.time()
    how = "an uncaught SystemExit with a status Python < 3.12 does not reveal"
    insp.table = {
        0: Wait(9, "gradient allreduce, bucket 1/1, train step 3", now, 3),
        1: Finished(8, "gradient allreduce, bucket 1/1, train step 2", 2, how),
    }
    msg = _conflict_message(insp, monkeypatch)
    assert "rank 1 left the script through an uncaught SystemExit" in msg
    assert "batches" not in msg


def test_different_collectives_with_different_steps_blame_batches(monkeypatch):
    insp = _insp()
    now = time.time()
    insp.table = {
        0: Wait(8, "gradient allreduce, bucket 1/1, train step 5", now, 5),
        1: Wait(8, "gradient allreduce, bucket 1/1, train step 4", now, 4),
    }
    msg = _conflict_message(insp, monkeypatch)
    assert "rank 0 at train step 5, rank 1 at train step 4" in msg


def test_different_collectives_by_name_say_which(monkeypatch):
    insp = _insp()
    now = time.time()
    insp.table = {
        0: Wait(8, "barrier", now, None),
        1: Wait(8, "model signature check", now, None),
    }
    msg = _conflict_message(insp, monkeypatch)
    assert "rank 0 in #8 'barrier'; rank 1 in #8 'model signature check'" in msg
    assert "batches" not in msg


def test_a_silent_rank_is_declared_unreachable_with_its_host(monkeypatch):
    insp = _insp(size=3, heartbeat=5.0)
    failures = []
    monkeypatch.setattr(insp, "_fail", lambda m, **kw: failures.append((m, kw)))
    clock = [1000.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: clock[0])
    insp._heard = {0: 1000.0, 1: 1000.0, 2: 1000.0}
    clock[0] += 4.0
    insp._heard[1] = clock[0]
    insp._check_heartbeats()
    assert failures == []
    clock[0] += 1.5  # rank 2 silent for 5.5 s, rank 1 for 1.5 s
    insp._check_heartbeats()
    assert len(failures) == 1
    msg = failures[0][0]
    assert (
        "rank 2 (host node3) is unreachable" in msg
        and "rank 1" not in msg.split("\n")[0]
    )
    assert failures[0][1] == {"lost": ["node3"]}  # the host for the verdict
    # A rank that has finished is not expected to beat any more.
    failures.clear()
    insp.table[2] = Finished(3, "barrier", None, "its script ended")
    insp._check_heartbeats()
    assert failures == []


def _silent_rank_0(monkeypatch, rank, heard_from=()):
    """An inspector on `rank` of 4 whose rank 0 falls silent; the ranks in
    `heard_from` say they noticed too (`Suspect`). Returns the inspector,
    its failures and the clock."""
    comm = _FakeComm(rank=rank, size=4)
    insp = stall.Inspector(comm, 60, 0, heartbeat=5.0, hosts=["a", "b", "c", "d"])
    failures = []
    monkeypatch.setattr(insp, "_fail", lambda m, **kw: failures.append((m, kw)))
    clock = [1000.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: clock[0])
    insp._heard = dict.fromkeys(range(4), 1000.0)
    clock[0] += 6.0
    insp._check_heartbeats()
    # It told every other rank but 0, and waits for theirs.
    assert sorted(r.obj[0] for r in comm.sent) == [rank] * 2
    assert all(isinstance(r.obj[1], Suspect) for r in comm.sent)
    assert failures == []
    insp._suspects.update(heard_from)
    clock[0] += insp._agree
    insp._check_heartbeats()
    assert len(failures) == 1
    return failures[0]


def test_rank_0_silence_the_lowest_surviving_rank_names_its_host(monkeypatch):
    """Rank 0 silent: the ranks that noticed tell each other; the lowest of
    them names rank 0's host as lost (for the launch wrapper), the others
    leave naming it as their speaker; a rank that heard from nobody speaks
    for itself."""
    msg, kw = _silent_rank_0(monkeypatch, rank=1, heard_from={2, 3})
    assert (
        "rank 0 (host a) is unreachable from rank 1 (host b), rank 2 (host c), "
        "rank 3 (host d): nothing heard from it for 8s" in msg  # 6 + 2 agreeing
    )
    assert "rank 1 speaks for them" in msg
    assert kw == {"local_only": True, "lost": ["a"]}
    msg, kw = _silent_rank_0(monkeypatch, rank=3, heard_from={1})
    assert "rank 1 speaks for the ranks that still reach each other" in msg
    assert kw == {"local_only": True, "lost": []}  # no verdict from rank 3
    msg, kw = _silent_rank_0(monkeypatch, rank=2)
    assert "rank 0 (host a) is unreachable from rank 2 (host c):" in msg
    assert "rank 2 speaks for itself" in msg
    assert kw == {"local_only": True, "lost": ["a"]}


def test_heartbeat_setting_is_validated(monkeypatch):
    with pytest.raises(
        ValueError, match=r"`heartbeat`: expected a number of seconds > 0"
    ):
        stall.configure(heartbeat=0)
    monkeypatch.setenv(stall.HEARTBEAT_ENV, "-1")
    with pytest.raises(ValueError, match="KERAS_MPFP16_HEARTBEAT_TIMEOUT must be >= 0"):
        env.get("HEARTBEAT_TIMEOUT")


def test_train_step_is_read_from_collective_names():
    assert stall.train_step_of("gradient allreduce, bucket 2/3, train step 17") == 17
    assert stall.train_step_of("model signature check") is None


def test_different_collectives_while_a_rank_computes_are_no_conflict(monkeypatch):
    # Rank 0, a broadcast's root, is already in the next collective; rank 2
    # waits for the broadcast's data relayed by rank 1, which is still
    # computing (issue 19: an evaluate rank 1 ran alone under load). Rank 1's
    # arrival completes it, so nothing may be declared.
    insp = _insp(size=3)
    now = time.time()
    insp.table = {
        0: Wait(244, "model signature check", now, None),
        2: Wait(242, "broadcast (header)", now, None),
    }
    failures = []
    monkeypatch.setattr(insp, "_fail", failures.append)
    clock = [100.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: clock[0])
    for _ in range(3):
        insp._check()
        clock[0] += stall._CONFLICT_GRACE + 0.1
    assert not failures, failures
    # Once rank 1 waits too (in yet another collective), it is a conflict.
    insp.table[1] = Wait(250, "barrier", now, None)
    assert "different collectives" in _conflict_message(insp, monkeypatch)


def test_a_rank_that_declares_a_loss_exits_69_and_reports_only_named_hosts(
    monkeypatch,
):
    """`_fail` with lost hosts: the verdict goes to the wrapper, the watchdog
    is armed and the rank aborts with 69 (never 0, also without the
    wrapper); with none named (another rank speaks) no verdict but still 69;
    a mere stall or conflict aborts with 1 and tells the wrapper nothing."""
    from keras_mpfp16.runtime.supervision import failure, launch_wrapper

    calls = []
    monkeypatch.setattr(
        failure, "abort_job", lambda code: calls.append(("abort", code))
    )
    monkeypatch.setattr(
        launch_wrapper, "report_lost", lambda m, h: calls.append(("verdict", h))
    )
    monkeypatch.setattr(
        stall.launcher_daemon, "end_later", lambda d, w: calls.append(("watchdog",))
    )
    monkeypatch.setattr(stall, "_VERDICT_FLUSH", 0.0)
    for lost, expected in (
        (["n3"], [("verdict", ["n3"]), ("watchdog",), ("abort", 69)]),
        ([], [("watchdog",), ("abort", 69)]),
        (None, [("abort", 1)]),
    ):
        calls.clear()
        insp = _insp(size=3)
        insp._fail("x", lost=lost)
        assert calls == expected, (lost, calls)


def test_no_progress_for_the_hang_timeout_ends_the_job_naming_the_late_rank(
    monkeypatch,
):
    """Rank 0 (and rank 2) wait in train step 8's gradient allreduce; rank 1
    never arrives. Before `hang` seconds: warnings only; at `hang`: one
    failure naming rank 1, its host, the collective it left (rank 0's
    previous one), the step it is in and the setting."""
    insp = _insp(size=3)
    insp.hang = 1800.0
    failures = []
    monkeypatch.setattr(insp, "_fail", lambda m, **kw: failures.append(m))
    grad = "gradient allreduce, bucket 1/1, train step 8"
    with insp.collective("metrics allreduce, train step 7"):
        pass
    clock = [10_000.0]
    monkeypatch.setattr(stall.time, "time", lambda: clock[0])
    insp.local.seq += 1  # rank 0 now inside #2, the gradient allreduce
    insp.local.previous, insp.local.name = insp.local.name, grad
    insp.local.since = 0.0
    insp.table = {0: Wait(2, grad, clock[0], 7), 2: Wait(2, grad, clock[0], 7)}
    clock[0] += 1799.0
    insp._check()
    assert failures == []
    clock[0] += 1.0
    insp._check()
    assert len(failures) == 1
    msg = failures[0]
    assert msg.startswith(
        "no progress for 1800s: rank 1 (host node2) has not arrived: it left "
        "collective #1 'metrics allreduce, train step 7' and has been outside "
        "MPI since (in train step 8: its computation, or a callback or the input "
        "pipeline before it), while ranks 0, 2 wait in collective #2 "
        f"'{grad}'. The job ends now (KERAS_MPFP16_HANG_TIMEOUT=1800 seconds"
    ), msg
    assert "\n  rank 1 (host node2): not in a collective" in msg


def test_no_progress_when_every_rank_waits_names_the_collective():
    from keras_mpfp16.runtime.supervision.stall_diagnosis import no_progress

    now = time.time()
    waiting = {0: Wait(5, "barrier", now, None), 1: Wait(5, "barrier", now, None)}
    msg = no_progress(
        60,
        waiting,
        2,
        lambda r: f"rank {r} (host h{r})",
        (5, "barrier", "x", True),
        "KERAS_MPFP16_HANG_TIMEOUT=60",
    )
    assert msg.startswith(
        "no progress for 60s: every rank (rank 0 (host h0), rank 1 (host h1)) "
        "waits in collective #5 'barrier', which does not complete"
    ), msg


def test_hang_timeout_defaults_to_30_minutes_and_is_validated(monkeypatch):
    monkeypatch.delenv(stall.HANG_ENV, raising=False)
    assert env.get("HANG_TIMEOUT") == 1800.0
    monkeypatch.setenv(stall.HANG_ENV, "-5")
    with pytest.raises(ValueError, match="KERAS_MPFP16_HANG_TIMEOUT must be >= 0"):
        env.get("HANG_TIMEOUT")
