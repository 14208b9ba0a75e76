"""The messages of the stall inspector (`runtime/stall.py`), as named types.

Every rank's inspector thread sends these to rank 0 (heartbeats go both
ways) over the inspector's private communicator; rank 0 keeps the last
`Wait` or `Finished` of each rank in its table and reads it to diagnose a
hang. They travel pickled (mpi4py's lowercase `isend`): every rank runs the
same keras_mpfp16, so the types resolve identically on both sides.

Nothing here imports Keras or MPI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Wait:
    """A rank has waited in a collective for more than a second.

    Attributes:
        seq: The collective's sequence number on that rank (1-based).
        name: The collective's name (`'gradient allreduce, bucket 1/2, train
            step 12'`).
        since: When it entered the collective, `time.time()` seconds
            (wall-clock: compared across ranks on rank 0).
        last_step: The train step of the rank's last train collective, or
            None before the first.
    """

    seq: int
    name: str
    since: float
    last_step: int | None = None
    kind: ClassVar[str] = "wait"


@dataclass(frozen=True)
class Left:
    """The rank left collective `seq`, which it had reported as a `Wait`."""

    seq: int
    kind: ClassVar[str] = "left"


@dataclass(frozen=True)
class Finished:
    """The rank has finished (at interpreter exit).

    Attributes:
        seq: Collectives it entered in all.
        name: The last collective's name ("" if none).
        last_step: The train step of its last train collective, or None.
        how: How its script ended (`'its script ended'`, an exception, a
            `SystemExit` status), for messages.
    """

    seq: int
    name: str
    last_step: int | None
    how: str
    kind: ClassVar[str] = "finished"


@dataclass(frozen=True)
class Beat:
    """A heartbeat: the sender is alive (rank 0 -> every rank and back)."""

    kind: ClassVar[str] = "beat"


@dataclass(frozen=True)
class Suspect:
    """Rank 0 has been silent for the heartbeat timeout: sent by a rank that
    noticed it to every other rank but 0, so the ranks that still reach each
    other agree on who speaks for them (the lowest-numbered)."""

    kind: ClassVar[str] = "suspect"


# What rank 0's table holds for a rank.
Report = Wait | Finished
