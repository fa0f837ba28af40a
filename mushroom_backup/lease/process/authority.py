"""Deadline-bounded fencing of process incarnations and current-participant verification
(port of ``seeds/process_lease_authority.rs.txt``).

A :class:`ProcessLeaseAuthority` binds every node's process-lease namespace on one cluster-root
store and one TTL (the agents' TTL: fencing must wait at least as long as they renew for).

Promises
--------
* :meth:`~ProcessLeaseAuthority.fence_incarnation` durably supersedes an exact incarnation: it
  observes the node's head unchanged for one full TTL on the injected monotonic clock, then
  publishes a takeover by a fresh revoker incarnation (never nil, never the fenced one) and
  returns the verified :class:`~.record.ProcessLeaseFence`. If the incarnation renews during the
  observation it raises :class:`~mushroom_backup.errors.ProcessLeaseHeld` (it is alive). A retry
  after a takeover already won rebuilds the certificate from the index or the retained history
  *without* waiting another TTL.
* :meth:`~ProcessLeaseAuthority.verify_current_participant` (and ``..._term``) says whether an
  exact incarnation (and term) is the node's durable head, after proving its term was reached
  by a sealed takeover and re-reading the head.
* :meth:`~ProcessLeaseAuthority.verify_fence` says whether a certificate is durably indexed, the
  head has reached its successor and the fenced owner is not current.
* Every I/O step runs under the caller's monotonic deadline (``fencing_deadline`` builds one
  covering the TTL plus an I/O budget). A step that starts after the deadline, or is still
  running at it, raises :class:`~mushroom_backup.errors.ProcessLeaseDeadline` and is cancelled.
  Every other failure raises too: nothing here answers "true" on doubt.

Not promised: that a fenced process has stopped writing (it learns of the takeover at its next
renewal; its own write deadline closes it). The authority never deletes anything but through the
store's retention.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar
from uuid import UUID, uuid4

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import ProcessLeaseDeadline, ProcessLeaseHeld, ProcessLeaseInvalid
from ...store.base import ObjectStore
from ._timing import StepTimedOut, run_until
from .record import (
    DEFAULT_BOUNDS,
    Acquired,
    Participant,
    ProcessLease,
    ProcessLeaseBounds,
    ProcessLeaseFence,
    ttl_to_ms,
    wall_ms,
)
from .store import ProcessLeaseStore

T = TypeVar("T")

log = logging.getLogger("mushroom_backup.lease.process")


class ProcessLeaseAuthority:
    """Fences and verifies process incarnations of every node on one cluster root. See the
    module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        ttl: timedelta,
        *,
        clock: Clock = SYSTEM_CLOCK,
        bounds: ProcessLeaseBounds = DEFAULT_BOUNDS,
        new_incarnation: Callable[[], UUID] = uuid4,
    ) -> None:
        """``ttl`` must be positive whole milliseconds, at most an hour, and equal to the
        agents' TTL. ``new_incarnation`` makes revoker ids (tests pin it)."""
        self.ttl_ms = ttl_to_ms(ttl)
        self.ttl = ttl
        self._store = store
        self._clock = clock
        self._bounds = bounds
        self._new_incarnation = new_incarnation
        self._nodes: dict[int, ProcessLeaseStore] = {}

    def __repr__(self) -> str:
        return f"ProcessLeaseAuthority(ttl_ms={self.ttl_ms}, url={self._store.url})"

    def store_for(self, node: int) -> ProcessLeaseStore:
        """The process-lease store of one node (one per node and authority, so its prune task
        and sealed-term memory are shared by every call)."""
        leases = self._nodes.get(node)
        if leases is None:
            leases = ProcessLeaseStore(
                self._store, node, self.ttl_ms, clock=self._clock, bounds=self._bounds
            )
            self._nodes[node] = leases
        return leases

    async def wait_prunes(self) -> None:
        """Wait for every background prune the authority's writes started."""
        for leases in list(self._nodes.values()):
            await leases.wait_prune()

    async def close(self) -> None:
        """Cancel background prunes (the object store stays open: it is the caller's)."""
        for leases in list(self._nodes.values()):
            await leases.close()

    def fencing_deadline(self, io_budget: float) -> float:
        """A monotonic deadline covering the mandatory full-TTL observation plus ``io_budget``
        seconds of authority I/O, so callers need not repeat the TTL as another knob."""
        if not (io_budget > 0 and math.isfinite(io_budget)):
            raise ProcessLeaseInvalid("process lease fencing I/O budget must be nonzero")
        return self._clock.monotonic() + self.ttl_ms / 1000 + io_budget

    async def _bounded(
        self, deadline: float, operation: str, step: Callable[[], Awaitable[T]]
    ) -> T:
        if self._clock.monotonic() >= deadline:
            raise ProcessLeaseDeadline(
                f"deadline expired before {operation}; give it a larger --io-budget"
            )
        try:
            return await run_until(self._clock, deadline, step())
        except StepTimedOut:
            raise ProcessLeaseDeadline(
                f"deadline expired during {operation}; the step was cancelled"
            ) from None

    async def _recover_won_fence(
        self, participant: Participant, head: ProcessLease, deadline: float
    ) -> ProcessLeaseFence:
        incarnation = participant.boot_incarnation
        if head.node != participant.node_id or head.owner == incarnation:
            raise ProcessLeaseInvalid(
                "process lease head has not superseded the requested incarnation"
            )
        leases = self.store_for(participant.node_id)
        fence = await self._bounded(
            deadline,
            "locating process lease takeover evidence",
            lambda: leases.find_takeover_from(incarnation),
        )
        if fence is None:
            raise ProcessLeaseInvalid(
                f"process lease takeover evidence for {incarnation} is missing: node "
                f"{participant.node_id} is held by {head.owner}, which did not take over from it"
            )
        if not await self.verify_fence(fence, deadline):
            raise ProcessLeaseInvalid("process lease takeover is no longer durably verifiable")
        return fence

    def _revoker(self, fenced: UUID) -> UUID:
        revoker = self._new_incarnation()
        while revoker.int == 0 or revoker == fenced:
            revoker = self._new_incarnation()
        return revoker

    async def fence_incarnation(
        self, participant: Participant, deadline: float
    ) -> ProcessLeaseFence:
        """Durably supersede ``participant`` after observing it unchanged for one full TTL, or
        rebuild the certificate of a takeover that already superseded it. See the module
        docstring for the failure cases."""
        leases = self.store_for(participant.node_id)
        head = await self._bounded(deadline, "loading process lease fence head", leases.load)
        if head is None:
            raise ProcessLeaseInvalid(
                f"process lease fence history of node {participant.node_id} is missing"
            )
        if head.owner != participant.boot_incarnation:
            return await self._recover_won_fence(participant, head, deadline)

        observation = leases.observe_rival(head)
        observation_until = leases.observation_ends(observation)
        if observation_until >= deadline:
            raise ProcessLeaseDeadline(
                "deadline does not cover one full process lease TTL; give it a larger --io-budget"
            )
        log.info(
            "process_lease.fence_observing",
            extra={
                "fields": {
                    "node": participant.node_id,
                    "incarnation": str(participant.boot_incarnation),
                    "seq": head.seq,
                    "ttl_ms": self.ttl_ms,
                }
            },
        )
        await self._clock.sleep_until(observation_until)

        revoker = self._revoker(participant.boot_incarnation)
        outcome = await self._bounded(
            deadline,
            "publishing process lease takeover",
            lambda: leases.try_takeover(revoker, observation, wall_ms(self._clock.wall())),
        )
        if isinstance(outcome, Acquired):
            fence = ProcessLeaseFence(head, outcome.lease)
            if not await self.verify_fence(fence, deadline):
                raise ProcessLeaseInvalid("won process lease takeover could not be verified")
            return fence
        current = outcome.lease
        if current.owner == participant.boot_incarnation:
            raise ProcessLeaseHeld(
                f"process incarnation {participant.boot_incarnation} of node "
                f"{participant.node_id} renewed during the full-TTL observation (now seq "
                f"{current.seq}): it is alive; stop it before fencing it"
            )
        return await self._recover_won_fence(participant, current, deadline)

    async def verify_current_participant(self, participant: Participant, deadline: float) -> bool:
        """Whether ``participant`` is its node's durable, takeover-proven current owner."""
        return await self._verify_current(participant, None, deadline)

    async def verify_current_participant_term(
        self, participant: Participant, process_term: int, deadline: float
    ) -> bool:
        """Whether ``participant`` in exactly ``process_term`` is its node's current owner."""
        if type(process_term) is not int or process_term <= 0:
            raise ProcessLeaseInvalid("process lease term must be nonzero")
        return await self._verify_current(participant, process_term, deadline)

    async def _verify_current(
        self, participant: Participant, process_term: int | None, deadline: float
    ) -> bool:
        leases = self.store_for(participant.node_id)
        head = await self._bounded(deadline, "loading current process lease", leases.load)
        if head is None:
            return False
        if head.owner != participant.boot_incarnation or (
            process_term is not None and head.term != process_term
        ):
            return False
        await self._bounded(
            deadline,
            "verifying current process term evidence",
            lambda: leases.ensure_current_term_fence(head),
        )
        after = await self._bounded(deadline, "rechecking current process lease", leases.load)
        if after is None:
            return False
        return (
            after.owner == head.owner
            and after.term == head.term
            and after.seq >= head.seq
            and (process_term is None or after.term == process_term)
        )

    async def verify_fence(self, fence: ProcessLeaseFence, deadline: float) -> bool:
        """Whether ``fence`` is durably indexed, its successor's term is reached (and still held
        by the successor if the term did not move on), and the fenced owner is not current.
        A certificate that is not indexed, or a node with no head, raises."""
        if not isinstance(fence, ProcessLeaseFence):
            raise ProcessLeaseInvalid("process lease fence is not canonical")
        leases = self.store_for(fence.node)
        durable = await self._bounded(
            deadline,
            "verifying indexed process lease fence",
            lambda: leases.load_fence(fence.predecessor.owner),
        )
        if durable is None:
            raise ProcessLeaseInvalid("indexed process lease fence is missing")
        head = await self._bounded(deadline, "verifying process lease fence head", leases.load)
        if head is None:
            raise ProcessLeaseInvalid("process lease fence durable head is missing")
        return (
            durable == fence
            and head.seq >= fence.successor.seq
            and head.term >= fence.successor.term
            and (head.term != fence.successor.term or head.owner == fence.successor.owner)
            and head.owner != fence.predecessor.owner
        )
