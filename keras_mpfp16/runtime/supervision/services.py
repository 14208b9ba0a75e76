"""The job's services, started on the library's communicator by every `init`.

- the stall inspector (`stall`): names missing ranks, ends jobs that cannot
  meet, heartbeats that name a lost rank or host;
- the evaluate rendezvous (`rendezvous`): "did every rank call evaluate?";
- the launch wrapper's start-up watchdog (`launch_wrapper.report_start`):
  each rank says when it starts MPI and when it is up;
- the abort on a failure (`failure`): one rank's exception or `sys.exit(n)`
  ends the whole job instead of hanging the others.

`world.init` calls `start` through its init hooks (registered when the
runtime package is imported), so `world`, the bottom of the runtime,
imports none of these modules.
"""

from __future__ import annotations

from typing import Any

from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.supervision import failure, launch_wrapper, rendezvous, stall


def start(comm: Any) -> None:
    """Starts every service on `comm` (the library's private communicator)."""
    stall.start(comm)
    rendezvous.start(comm)
    failure.install_abort_on_exception(comm.Get_rank(), comm.Get_size())
    # Under the launch wrapper: this rank is up (its start-up watchdog).
    launch_wrapper.report_start("up")


def _booting() -> None:
    launch_wrapper.report_start("boot")


world.add_before_init_hook(_booting)
world.add_init_hook(start)
