"""The communication thread's fixed order and failure handling
(runtime/mpi/overlap.py), without MPI."""

import threading
import time

import pytest

from keras_mpfp16.runtime.mpi.overlap import CommThread, CommThreadError, OrderError


def test_jobs_run_one_at_a_time_in_submission_order_whatever_the_waits_order():
    started = threading.Event()
    release = threading.Event()
    running, seen = [], []

    def job(i):
        def run():
            running.append(i)
            assert len(running) == 1  # never two at once
            if i == 1:
                started.set()
                release.wait(5)
            seen.append(i)
            running.remove(i)
            return i * 10

        return run

    t = CommThread()
    tickets = [t.submit((b, 3), job(b)) for b in (1, 2, 3)]
    assert started.wait(5)
    time.sleep(0.05)
    assert seen == []  # 2 and 3 wait behind 1
    release.set()
    assert [t.wait(k) for k in reversed(tickets)] == [30, 20, 10]
    assert seen == [1, 2, 3] and t.executed == [(1, 3), (2, 3), (3, 3)]


def test_buckets_out_of_the_fixed_order_are_refused():
    t = CommThread()
    with pytest.raises(OrderError, match="bucket 2/3 submitted out of order"):
        t.submit((2, 3), lambda: None)
    t.wait(t.submit((1, 3), lambda: None))
    with pytest.raises(OrderError, match=r"expects bucket 2/3"):
        t.submit((3, 3), lambda: None)
    with pytest.raises(OrderError, match="not a bucket of the plan"):
        t.submit((4, 3), lambda: None)
    t.submit((2, 3), lambda: None)
    t.submit((3, 3), lambda: None)
    t.wait(t.submit((1, 2), lambda: None))  # the next step starts at 1


def test_a_failure_reaches_its_wait_and_every_later_one_and_stops_the_thread():
    ran = []

    def boom():
        raise ValueError("the MPI call failed")

    t = CommThread()
    first = t.submit((1, 3), lambda: ran.append(1))
    bad = t.submit((2, 3), boom)
    later = t.submit((3, 3), lambda: ran.append(3))
    t.wait(first)
    for ticket in (bad, later):
        with pytest.raises(CommThreadError) as e:
            t.wait(ticket)
        assert "bucket 2/3's reduction failed" in str(e.value)
        assert "ValueError: the MPI call failed" in str(e.value)  # the traceback
    assert ran == [1]  # nothing ran after the failure
