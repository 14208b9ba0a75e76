"""The job's services, started on the library's communicator by every `init`.

- the stall inspector (`stall`): names missing ranks, ends jobs that cannot
  meet, heartbeats that name a lost rank or host;
- the evaluate rendezvous (`rendezvous`): "did every rank call evaluate?";
- the abort on a failure (`failure`): one rank's exception or `sys.exit(n)`
  ends the whole job instead of hanging the others.

`world.init` calls `start` through its init hooks (registered when the
runtime package is imported), so `world`, the bottom of the runtime,
imports none of these modules.
"""

from __future__ import annotations

from typing import Any

from keras_mpfp16.runtime.mpi import world
from keras_mpfp16.runtime.supervision import failure, rendezvous, stall


def start(comm: Any) -> None:
    """Starts every service on `comm` (the library's private communicator)."""
    stall.start(comm)
    rendezvous.start(comm)
    failure.install_abort_on_exception(comm.Get_rank(), comm.Get_size())


world.add_init_hook(start)
