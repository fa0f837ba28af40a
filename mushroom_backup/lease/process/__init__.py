"""The process lease: which process incarnation is stable cluster node N, and durable proof
that a dead one was revoked.

* :mod:`.record` -- records, fence certificates, their canonical bytes, keys and bounds (pure);
* :mod:`.store` -- :class:`ProcessLeaseStore`, the append-only history of one node;
* :mod:`.authority` -- :class:`ProcessLeaseAuthority`, deadline-bounded fencing and verification;
* :mod:`.holder` -- :class:`ProcessLeaseHolder`, what an agent runs: acquire, renew, lost.

Everything lives under ``{cluster root}/process-lease/{node:020d}/`` (see :mod:`.record`).
"""

from __future__ import annotations

from .authority import ProcessLeaseAuthority
from .holder import DEFAULT_TTL, ProcessLeaseHolder
from .record import (
    DEFAULT_BOUNDS,
    Acquired,
    Held,
    Outcome,
    Participant,
    ProcessLease,
    ProcessLeaseBounds,
    ProcessLeaseFence,
    ProcessLeaseObservation,
)
from .store import ProcessLeaseStore

__all__ = [
    "DEFAULT_BOUNDS",
    "DEFAULT_TTL",
    "Acquired",
    "Held",
    "Outcome",
    "Participant",
    "ProcessLease",
    "ProcessLeaseAuthority",
    "ProcessLeaseBounds",
    "ProcessLeaseFence",
    "ProcessLeaseHolder",
    "ProcessLeaseObservation",
    "ProcessLeaseStore",
]
