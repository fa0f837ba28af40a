"""The agent's node identity in a cluster: the process lease, held for the whole process.

With ``[cluster] root`` and ``node_id`` set, :func:`node_identity` opens the cluster root store,
creates a fresh boot incarnation, acquires node N's process lease *before anything else* (or
raises :class:`~mushroom_backup.errors.ProcessLeaseHeld`, exit 3, naming the live holder; with
``takeover`` it observes the holder for one full TTL first), keeps it renewed, and yields the
:class:`~mushroom_backup.lease.process.holder.ProcessLeaseHolder`. Without a cluster it yields
None. Half a cluster configuration (a root without a node id, or the reverse) is a usage error.

The holder is also a write fence: :class:`CombinedFence` lets a snapshot write only while both
the bucket lease and the process lease allow it, so a fenced incarnation writes nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

from ..clock import SYSTEM_CLOCK, Clock
from ..config import Settings
from ..errors import UsageError
from ..lease.fenced import Fence
from ..lease.process.holder import ProcessLeaseHolder
from ..store import open_store


@dataclass(frozen=True)
class CombinedFence:
    """Open only while every fence is open; closes at the earliest deadline."""

    fences: tuple[Fence, ...]

    def write_deadline(self) -> float | None:
        deadlines = [fence.write_deadline() for fence in self.fences]
        if any(deadline is None for deadline in deadlines):
            return None
        return min(d for d in deadlines if d is not None)


@contextlib.asynccontextmanager
async def node_identity(
    settings: Settings, *, takeover: bool = False, clock: Clock = SYSTEM_CLOCK
) -> AsyncIterator[ProcessLeaseHolder | None]:
    cluster = settings.cluster
    if cluster.root is None and cluster.node_id is None:
        yield None
        return
    if cluster.root is None or cluster.node_id is None:
        raise UsageError(
            "a cluster needs both [cluster] root and node_id (MUSHROOM_BACKUP_CLUSTER_ROOT and "
            "MUSHROOM_BACKUP_NODE_ID); set both, or neither"
        )
    async with open_store(cluster.root, conditional=True) as store:
        holder = ProcessLeaseHolder(
            store, cluster.node_id, ttl=timedelta(seconds=cluster.ttl_s), clock=clock
        )
        await holder.start(takeover=takeover)
        try:
            yield holder
        finally:
            await holder.stop()
