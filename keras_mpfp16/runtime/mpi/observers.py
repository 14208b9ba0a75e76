"""Who watches the MPI layer's collectives: a hook for the layers above it.

Every collective the MPI layer issues runs inside `collective(name)`, which
enters each registered observer around the call. The layers above register
themselves when they are imported: the stall inspector
(`runtime.supervision.stall`: which rank waits where) and the trace
recorder (`runtime.trace.recorder`: when each call ran). So the MPI layer
imports neither, and with no observer registered a collective costs one
empty check.

An observer is a function `observer(name)` that returns a context manager
(e.g. one written with `contextlib.contextmanager`); observers are entered
in the order they were registered, the first one outermost.

Example:

```python
import contextlib

from keras_mpfp16.runtime.mpi import observers

@contextlib.contextmanager
def log_calls(name):
    print("enter", name)
    yield
    print("leave", name)

observers.register(log_calls)
```
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager

Observer = Callable[[str], AbstractContextManager]

_observers: tuple[Observer, ...] = ()
_thread = threading.local()  # .quiet: this thread's collectives are not observed


def register(observer: Observer) -> None:
    """Adds `observer` (entered around every collective from now on).

    Registering the same observer twice has no further effect.
    """
    global _observers
    if not callable(observer):
        raise TypeError(
            "An observer must be a callable taking the collective's name and "
            f"returning a context manager; received {observer!r}."
        )
    if observer not in _observers:
        _observers = (*_observers, observer)


def unregister(observer: Observer) -> None:
    """Removes `observer`; does nothing if it is not registered."""
    global _observers
    _observers = tuple(o for o in _observers if o is not observer)


def registered() -> tuple[Observer, ...]:
    """The registered observers, outermost first."""
    return _observers


@contextmanager
def unobserved():
    """The collectives this thread issues inside are entered by no observer
    (the communication thread's: `overlap.py`; the thread waiting for them
    is the one observed)."""
    before = getattr(_thread, "quiet", False)
    _thread.quiet = True
    try:
        yield
    finally:
        _thread.quiet = before


@contextmanager
def collective(name: str):
    """Marks the enclosed MPI call as collective `name` for every observer."""
    current = _observers  # a tuple: registering meanwhile does not change it
    if not current or getattr(_thread, "quiet", False):
        yield
        return
    if len(current) == 1:
        with current[0](name):
            yield
        return
    with ExitStack() as stack:
        for observer in current:
            stack.enter_context(observer(name))
        yield


__all__ = ["collective", "register", "registered", "unregister"]
