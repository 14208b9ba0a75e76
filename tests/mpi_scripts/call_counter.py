"""Counts the MPI calls the library makes, by communicator method and purpose.

`with counting() as calls:` swaps the library's communicators for proxies
that counts every collective method called on it, keyed by the method and
the name the library gives the collective (an observer registered with
`runtime.mpi.observers` sees it), so a
test can tell gradient calls from, e.g., metric reductions or fit-start
checks. `gradient_calls(calls)` keeps the calls made for the gradient
reduction: its buckets, sparse gathers and (in releases before the step
check rode in the first bucket) the separate step check.
"""

import collections
import contextlib

from keras_mpfp16.runtime.mpi import observers, world

_names: list = []


class CountingComm:
    def __init__(self, comm, calls):
        self._comm = comm
        self._calls = calls

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr) or name.startswith("Get_"):
            return attr

        def counted(*args, **kwargs):
            self._calls[(name, _names[-1] if _names else "")] += 1
            return attr(*args, **kwargs)

        return counted


@contextlib.contextmanager
def counting():
    calls = collections.Counter()

    @contextlib.contextmanager
    def named(name):
        _names.append(name)
        try:
            yield
        finally:
            _names.pop()

    w = world.world()
    # The library's communicator and the train/test steps' own (issue 38:
    # `world.channel`).
    saved = {a: getattr(w, a) for a in ("comm", "train_comm", "test_comm")}
    observers.register(named)
    for a, comm in saved.items():
        setattr(w, a, CountingComm(comm, calls))
    try:
        yield calls
    finally:
        for a, comm in saved.items():
            setattr(w, a, comm)
        observers.unregister(named)


GRADIENT_NAMES = ("gradient allreduce", "sparse gradient", "step check")


def gradient_calls(calls, steps: int = 1) -> dict:
    """{method: calls per step} for the gradient reduction's collectives."""
    out = collections.Counter()
    for (method, name), count in calls.items():
        if name.startswith(GRADIENT_NAMES):
            out[method] += count
    return {k: v / steps for k, v in sorted(out.items())}


@contextlib.contextmanager
def counting_crossings():
    """Counts the runs of every host function a graph traced inside the block
    calls through `tf.numpy_function` / `tf.py_function` (a crossing from the
    graph into Python each): `{"numpy_function" or "py_function": runs}`,
    counted for as long as the block lasts. Trace the step inside it."""
    import tensorflow as tf

    runs = collections.Counter()
    real = {"numpy_function": tf.numpy_function, "py_function": tf.py_function}

    def wrapping(kind):
        def make(func, inp, Tout, *args, **kwargs):
            def counted(*a):
                runs[kind] += 1
                return func(*a)

            return real[kind](counted, inp, Tout, *args, **kwargs)

        return make

    tf.numpy_function = wrapping("numpy_function")
    tf.py_function = wrapping("py_function")
    try:
        yield runs
    finally:
        tf.numpy_function = real["numpy_function"]
        tf.py_function = real["py_function"]
