"""The process lease as an agent holds it: acquire at start, renew in the background, know when
it is lost.

A :class:`ProcessLeaseHolder` proves that *this* process (a fresh random boot incarnation per
start) is node N of the cluster. Use it as an async context manager::

    async with ProcessLeaseHolder(root_store, node_id=3, ttl=timedelta(seconds=30)) as holder:
        stamp(holder.node_id, holder.boot_incarnation, holder.term)
        ...

Promises
--------
* ``start()`` writes the first record of the node (term 1), or raises
  :class:`~mushroom_backup.errors.ProcessLeaseHeld` (exit 3) naming the incarnation that holds it
  and how long its record says it lives. With ``takeover=True`` it instead observes that holder
  for one full TTL on the monotonic clock and takes over (term+1, fence sealed) only if the
  head did not move; a holder that renewed meanwhile still raises ``ProcessLeaseHeld``. Each
  store step of ``start`` is bounded by one TTL (:class:`~mushroom_backup.errors.
  ProcessLeaseDeadline`).
* While started, it renews every ``ttl / 3`` (each attempt bounded by ``ttl / 3``). A failed
  renewal is logged and retried at the next tick. A renewal that finds another owner at the
  head means this incarnation was fenced: the holder is *lost* for good, stops renewing and
  never writes again (:attr:`lost`, :meth:`wait_lost`).
* :meth:`write_deadline` is a :class:`~mushroom_backup.lease.fenced.Fence`: writes may start
  until 2/3 of a TTL after the moment the last confirmed renewal was *sent*, so a holder cut off
  from the store stops a third of a TTL before anyone may take over (which needs a full TTL of
  observation). None before start and once lost.

Not promised: release. The history is append-only, so ``stop()`` only stops renewing; a successor
starts with ``takeover=True`` (or an operator runs ``node fence``) and waits one TTL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from datetime import timedelta
from types import TracebackType
from typing import Self, TypeVar
from uuid import UUID, uuid4

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import ProcessLeaseDeadline, ProcessLeaseError, ProcessLeaseHeld
from ...store.base import ObjectStore
from ._timing import StepTimedOut, run_until
from .record import (
    DEFAULT_BOUNDS,
    Acquired,
    Participant,
    ProcessLease,
    ProcessLeaseBounds,
    check_node,
    ttl_to_ms,
    wall_ms,
)
from .store import ProcessLeaseStore

T = TypeVar("T")

DEFAULT_TTL = timedelta(seconds=30)

log = logging.getLogger("mushroom_backup.lease.process")


class ProcessLeaseHolder:
    """Holds node ``node_id``'s process lease for this process. See the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        node_id: int,
        *,
        ttl: timedelta = DEFAULT_TTL,
        clock: Clock = SYSTEM_CLOCK,
        bounds: ProcessLeaseBounds = DEFAULT_BOUNDS,
        boot_incarnation: UUID | None = None,
    ) -> None:
        """``store`` is rooted at the cluster root; ``ttl`` must match every agent's and the
        operators' ``node fence --ttl``. ``boot_incarnation`` defaults to a fresh UUID (pass
        one only in tests: an incarnation that was fenced must never come back)."""
        self.node_id = check_node(node_id)
        self.boot_incarnation = boot_incarnation or uuid4()
        self.ttl = ttl
        self._ttl_s = ttl_to_ms(ttl) / 1000
        self._clock = clock
        self._leases = ProcessLeaseStore(store, node_id, ttl_to_ms(ttl), clock=clock, bounds=bounds)
        self._lease: ProcessLease | None = None
        self._confirmed_sent: float | None = None
        self._lost_reason: str | None = None
        self._lost = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return (
            f"ProcessLeaseHolder(node_id={self.node_id}, "
            f"boot_incarnation={self.boot_incarnation}, term={self.term})"
        )

    # --- what callers read -------------------------------------------------------------------

    @property
    def participant(self) -> Participant:
        """``(node_id, boot_incarnation)``: what a manifest names and an operator fences."""
        return Participant(self.node_id, self.boot_incarnation)

    @property
    def lease(self) -> ProcessLease | None:
        """The last record this holder confirmed, or None before start."""
        return self._lease

    @property
    def term(self) -> int | None:
        """The process term held (constant for a holder's life), or None before start."""
        return None if self._lease is None else self._lease.term

    @property
    def lost(self) -> bool:
        return self._lost_reason is not None

    @property
    def lost_reason(self) -> str | None:
        return self._lost_reason

    async def wait_lost(self) -> str:
        """Wait until the lease is lost; returns why."""
        await self._lost.wait()
        assert self._lost_reason is not None
        return self._lost_reason

    def write_deadline(self) -> float | None:
        """The monotonic moment after which no write may start (see the module docstring)."""
        if self._confirmed_sent is None or self.lost:
            return None
        return self._confirmed_sent + self._ttl_s * 2 / 3

    # --- lifecycle ---------------------------------------------------------------------------

    async def _step(self, what: str, step: Awaitable[T], budget: float) -> T:
        try:
            return await run_until(self._clock, self._clock.monotonic() + budget, step)
        except StepTimedOut:
            raise ProcessLeaseDeadline(
                f"process lease {what} of node {self.node_id} took longer than {budget:g} s; "
                "check the store's reachability"
            ) from None

    def _held_error(self, other: ProcessLease, why: str) -> ProcessLeaseHeld:
        remaining = (other.expires_at_ms - wall_ms(self._clock.wall())) / 1000
        life = (
            f"its record expires in {remaining:.1f} s"
            if remaining >= 0
            else f"its record expired {-remaining:.1f} s ago by its own clock (it may be dead)"
        )
        return ProcessLeaseHeld(
            f"node {self.node_id} is held by process incarnation {other.owner} "
            f"(term {other.term}, seq {other.seq}); {life}; {why}"
        )

    async def start(self, *, takeover: bool = False) -> ProcessLease:
        """Acquire the node (see the module docstring) and start renewing."""
        if self._lease is not None or self.lost:
            raise ProcessLeaseError("a process lease holder starts once; make a new one")
        sent = self._clock.monotonic()
        outcome = await self._step(
            "acquire",
            self._leases.try_acquire(self.boot_incarnation, wall_ms(self._clock.wall())),
            self._ttl_s,
        )
        if not isinstance(outcome, Acquired):
            other = outcome.lease
            if not takeover:
                raise self._held_error(
                    other,
                    "stop that process, start this one with takeover (waits one TTL), or run "
                    f"`mushroom-backup node fence --node {self.node_id} --incarnation "
                    f"{other.owner}`",
                )
            observation = self._leases.observe_rival(other)
            log.warning(
                "process_lease.takeover_observing",
                extra={
                    "fields": {
                        "node": self.node_id,
                        "holder": str(other.owner),
                        "seq": other.seq,
                        "ttl_s": self._ttl_s,
                    }
                },
            )
            await self._clock.sleep_until(self._leases.observation_ends(observation))
            sent = self._clock.monotonic()
            outcome = await self._step(
                "takeover",
                self._leases.try_takeover(
                    self.boot_incarnation, observation, wall_ms(self._clock.wall())
                ),
                self._ttl_s,
            )
            if not isinstance(outcome, Acquired):
                raise self._held_error(
                    outcome.lease, "it changed during the full-TTL observation, so it is alive"
                )
        self._lease = outcome.lease
        self._confirmed_sent = sent
        log.info(
            "process_lease.acquired",
            extra={
                "fields": {
                    "node": self.node_id,
                    "incarnation": str(self.boot_incarnation),
                    "term": outcome.lease.term,
                    "seq": outcome.lease.seq,
                }
            },
        )
        # The schedule starts from the confirmed send, not from when the task first runs.
        self._renewer = asyncio.get_running_loop().create_task(
            self._renew_forever(first=sent + self._ttl_s / 3),
            name=f"process-lease-renew-{self.node_id}",
        )
        return outcome.lease

    async def renew(self) -> None:
        """One renewal attempt, bounded by ``ttl / 3``. Marks the holder lost if another owner
        is at the head; raises :class:`ProcessLeaseError` if the attempt failed."""
        if self.lost or self._lease is None:
            return
        sent = self._clock.monotonic()
        outcome = await self._step(
            "renewal",
            self._leases.try_acquire(self.boot_incarnation, wall_ms(self._clock.wall())),
            self._ttl_s / 3,
        )
        if isinstance(outcome, Acquired) and outcome.lease.term == self._lease.term:
            self._lease = outcome.lease
            self._confirmed_sent = max(sent, self._confirmed_sent or sent)
            return
        other = outcome.lease
        self._mark_lost(
            f"node {self.node_id} was taken over by process incarnation {other.owner} "
            f"(term {other.term}); this process must stop"
        )

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason
            self._lost.set()
            log.error(
                "process_lease.lost",
                extra={"fields": {"node": self.node_id, "reason": reason}},
            )

    async def _renew_forever(self, first: float) -> None:
        interval = self._ttl_s / 3
        next_at = first
        while not self.lost:
            await self._clock.sleep_until(next_at)
            next_at = self._clock.monotonic() + interval
            try:
                await self.renew()
            except ProcessLeaseError as error:
                log.warning(
                    "process_lease.renew_failed",
                    extra={"fields": {"node": self.node_id, "error": error.message}},
                )

    async def stop(self) -> None:
        """Stop renewing and cancel background work. Idempotent; writes nothing."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None and not renewer.done():
            renewer.cancel()
            await asyncio.wait({renewer})
        await self._leases.close()
        self._confirmed_sent = None

    async def wait_prune(self) -> None:
        """Wait for the background history prune in progress, if any (tests)."""
        await self._leases.wait_prune()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
