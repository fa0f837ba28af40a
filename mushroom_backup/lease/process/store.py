"""Append-only process-lease storage for one stable node id: acquire, renew, take over, fence
certificates, and bounded history retention (port of ``seeds/process_lease_store.rs.txt``).

Promises
--------
* **Create-only history.** Every write is a create (``If-None-Match: *``) of the next sequence
  number; nothing is ever overwritten. First acquire: term 1, seq 1. Renewal by the head's
  owner: same term, ``seq+1``. Takeover by another owner: ``term+1, seq+1``, and only after the
  same head was seen unchanged for a full TTL on the candidate's *own monotonic clock*
  (:meth:`ProcessLeaseStore.observe_rival` / :meth:`ProcessLeaseStore.try_takeover`); another
  host's wall-clock expiry is never trusted. A create that loses the race reads the winner.
* **Fence certificates.** A won takeover seals a :class:`ProcessLeaseFence` at two create-only
  keys -- by predecessor owner, and by successor owner and term -- and reads each back: a
  different certificate at the same key is :class:`ProcessLeaseInvalid`, an absent one
  :class:`ProcessLeaseIO`.
* **Evidence survives retention.** The background prune seals every term transition it sees in
  a batch *before* deleting either side. :meth:`find_takeover_from` looks in the index first and
  scans the history second (sealing what it finds); :meth:`ensure_current_term_fence` proves the
  current term was reached by a sealed takeover.
* **Fail closed.** Any record that is noncanonical, too large, from another node, or stored at
  the wrong sequence is :class:`ProcessLeaseInvalid` -- rejected, never repaired. Store failures
  are :class:`ProcessLeaseIO`. A history with more keys than the list bound is invalid.
* **Bounded history.** Every ``writes_per_prune`` writes (and after every takeover, and when the
  inventory is invalid) one background task prunes to ``history_to_retain`` records, in batches
  of ``prune_batch_records``, each under an I/O timeout on the injected clock, reading at most
  ``read_concurrency`` records at once, for at most ``max_prune_batches`` batches. A failed
  prune marks the store unhealthy; the next acquire or takeover then repairs it synchronously
  (and fails if the repair fails). A transient LIST failure does not start a prune.
* **Bounded retries.** ``load`` and history reads start over at most ``head_read_attempts`` times
  when the head moves under them, then fail with :class:`ProcessLeaseIO`.

Not promised: that the service honours ``If-None-Match`` (a store refused as non-conditional is
rejected up front; one that silently ignores the header is not detected here); that fence
certificates are ever deleted (they are tiny, one per takeover, and are the proof of
revocation). Callers bound wall time themselves (see :mod:`.authority`): only the prune has its
own timeouts.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from itertools import pairwise
from uuid import UUID

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import (
    NotFound,
    PreconditionFailed,
    ProcessLeaseError,
    ProcessLeaseInvalid,
    ProcessLeaseIO,
    StoreError,
)
from ...store.base import CREATE, ObjectStore
from ._timing import StepTimedOut, map_bounded, run_until
from .record import (
    DEFAULT_BOUNDS,
    MAX_U64,
    Acquired,
    Held,
    Outcome,
    ProcessLease,
    ProcessLeaseBounds,
    ProcessLeaseFence,
    ProcessLeaseObservation,
    check_node,
    expiry_ms,
    fence_key,
    fence_prefix,
    lease_key,
    lease_prefix,
    sequence_from_key,
    successor_fence_key,
)

log = logging.getLogger("mushroom_backup.lease.process")


def _io(what: str, error: StoreError) -> ProcessLeaseIO:
    return ProcessLeaseIO(f"process lease store failed while {what}: {error.message}")


class ProcessLeaseStore:
    """The append-only authority for one stable node id on one object store (rooted at the
    cluster root). See the module docstring for what it promises."""

    def __init__(
        self,
        store: ObjectStore,
        node: int,
        ttl_ms: int,
        *,
        clock: Clock = SYSTEM_CLOCK,
        bounds: ProcessLeaseBounds = DEFAULT_BOUNDS,
    ) -> None:
        check_node(node)
        if type(ttl_ms) is not int or ttl_ms <= 0:
            raise ProcessLeaseInvalid("node, owner, and lease TTL must be nonzero")
        if not store.conditional:
            raise ProcessLeaseInvalid(
                "the process lease needs conditional writes (If-None-Match), but this store "
                "client is in best-effort mode; unset MUSHROOM_BACKUP_LEASE_CONDITIONAL=off"
            )
        self.node = node
        self.ttl_ms = ttl_ms
        self.bounds = bounds
        self._store = store
        self._clock = clock
        self._prune_task: asyncio.Task[None] | None = None
        self._healthy = True
        self._writes_since_prune = 0
        self._sealed_term = 0

    def __repr__(self) -> str:
        return f"ProcessLeaseStore(node={self.node}, ttl_ms={self.ttl_ms}, url={self._store.url})"

    @property
    def healthy(self) -> bool:
        """False after a failed prune, until a prune or repair succeeds."""
        return self._healthy

    @property
    def ttl_s(self) -> float:
        return self.ttl_ms / 1000

    # --- reading -----------------------------------------------------------------------------

    async def _get(self, key: str) -> bytes | None:
        try:
            return (await self._store.get(key)).data
        except NotFound:
            return None
        except StoreError as error:
            raise _io(f"reading {key}", error) from error

    async def _list_seqs(self) -> list[int]:
        """Every sequence in the history, ascending; more than the list bound is invalid."""
        bound = self.bounds.max_list_records
        seqs: set[int] = set()
        seen = 0
        try:
            async for info in self._store.list(lease_prefix(self.node)):
                if seen == bound:
                    raise ProcessLeaseInvalid(
                        f"process lease history of node {self.node} exceeds the fixed "
                        f"{bound}-record scan bound"
                    )
                seen += 1
                seqs.add(sequence_from_key(self.node, info.key))
        except StoreError as error:
            raise _io("listing the history", error) from error
        return sorted(seqs)

    async def _oldest_prune_window(self) -> tuple[int, list[int]]:
        """How many records exist, and the ``prune_batch_records + 1`` oldest of them (the
        batch plus the first retained record), ascending. Memory stays O(batch) whatever the
        history's length, so a history beyond the list bound can still be pruned."""
        window_len = self.bounds.prune_batch_records + 1
        largest_first: list[int] = []  # a max-heap of the smallest sequences, negated
        count = 0
        try:
            async for info in self._store.list(lease_prefix(self.node)):
                seq = sequence_from_key(self.node, info.key)
                count += 1
                if len(largest_first) < window_len:
                    heapq.heappush(largest_first, -seq)
                elif seq < -largest_first[0]:
                    heapq.heapreplace(largest_first, -seq)
        except StoreError as error:
            raise _io("listing the history for a prune", error) from error
        return count, sorted(-negated for negated in largest_first)

    async def _read_record(self, seq: int) -> ProcessLease | None:
        data = await self._get(lease_key(self.node, seq))
        if data is None:
            return None
        return ProcessLease.decode(data, node=self.node, seq=seq)

    async def _read_history(self) -> list[ProcessLease]:
        attempts = self.bounds.head_read_attempts
        for _ in range(attempts):
            seqs = await self._list_seqs()
            records = await map_bounded(self._read_record, seqs, self.bounds.read_concurrency)
            present = [record for record in records if record is not None]
            if len(present) == len(records):
                return present
            await asyncio.sleep(0)
        raise ProcessLeaseIO(
            f"process lease history of node {self.node} changed during {attempts} read attempts"
        )

    async def read_history(self) -> list[ProcessLease]:
        """The whole retained history, ascending by sequence (at most the list bound)."""
        return await self._read_history()

    async def load(self) -> ProcessLease | None:
        """The record with the highest durable sequence, or None for a node never acquired.

        An invalid inventory (a stray key, more keys than the list bound) schedules a repair
        prune and raises :class:`ProcessLeaseInvalid`; a LIST that merely failed raises
        :class:`ProcessLeaseIO` and schedules nothing."""
        observed_head = False
        attempts = self.bounds.head_read_attempts
        for _ in range(attempts):
            try:
                seqs = await self._list_seqs()
            except ProcessLeaseInvalid:
                # RECOVERY (seed): a transient LIST failure says nothing about retention health
                # and must not duplicate authority I/O during an outage; an invalid inventory
                # does start the bounded repair path.
                self._schedule_prune(force=True)
                raise
            if not seqs:
                if not observed_head:
                    return None
            else:
                observed_head = True
                lease = await self._read_record(seqs[-1])
                if lease is not None:
                    return lease
            await asyncio.sleep(0)
        raise ProcessLeaseIO(
            f"process lease head of node {self.node} changed during {attempts} read attempts"
        )

    # --- fence certificates ------------------------------------------------------------------

    async def _load_fence_at(self, key: str) -> ProcessLeaseFence | None:
        data = await self._get(key)
        return None if data is None else ProcessLeaseFence.decode(data)

    async def load_fence(self, predecessor: UUID) -> ProcessLeaseFence | None:
        """The certificate indexed by the superseded owner, if one is sealed."""
        fence = await self._load_fence_at(fence_key(self.node, predecessor))
        if fence is not None and (
            fence.predecessor.node != self.node or fence.predecessor.owner != predecessor
        ):
            raise ProcessLeaseInvalid(
                "predecessor-indexed process lease fence has the wrong identity"
            )
        return fence

    async def load_successor_fence(self, successor: UUID, term: int) -> ProcessLeaseFence | None:
        """The certificate indexed by the taking owner and its term, if one is sealed."""
        fence = await self._load_fence_at(successor_fence_key(self.node, successor, term))
        if fence is not None and (
            fence.successor.node != self.node
            or fence.successor.owner != successor
            or fence.successor.term != term
        ):
            raise ProcessLeaseInvalid(
                "successor-indexed process lease fence has the wrong identity"
            )
        return fence

    async def list_fences(self) -> list[ProcessLeaseFence]:
        """Every sealed certificate of this node (by the predecessor index), oldest first; more
        than the list bound is invalid."""
        keys: list[str] = []
        try:
            async for info in self._store.list(fence_prefix(self.node)):
                if len(keys) == self.bounds.max_list_records:
                    raise ProcessLeaseInvalid(
                        f"node {self.node} has more than {len(keys)} fence certificates"
                    )
                keys.append(info.key)
        except StoreError as error:
            raise _io("listing fence certificates", error) from error
        fences = await map_bounded(self._load_fence_at, keys, self.bounds.read_concurrency)
        return sorted(
            (fence for fence in fences if fence is not None), key=lambda f: f.successor.seq
        )

    async def _seal_fence_at(self, key: str, fence: ProcessLeaseFence) -> None:
        put_error: StoreError | None = None
        try:
            await self._store.put(key, fence.encode(), CREATE)
        except StoreError as error:
            put_error = error  # "already there" and "answer lost" are both settled by reading
        try:
            stored = await self._load_fence_at(key)
        except ProcessLeaseError as reconcile_error:
            if put_error is not None and not isinstance(put_error, PreconditionFailed):
                raise ProcessLeaseIO(
                    f"process lease fence write failed ({put_error.message}); "
                    f"reconciliation failed ({reconcile_error.message})"
                ) from reconcile_error
            raise
        if stored == fence:
            return
        if stored is not None:
            raise ProcessLeaseInvalid(
                f"process fence index {key} maps to conflicting takeover evidence"
            )
        raise ProcessLeaseIO(f"process lease fence write to {key} was not durably visible")

    async def _seal_fence(self, fence: ProcessLeaseFence) -> None:
        """Seal ``fence`` at both index keys, each verified by reading it back."""
        if fence.node != self.node:
            raise ProcessLeaseInvalid("cannot seal another node's process lease fence")
        await self._seal_fence_at(fence_key(fence.node, fence.predecessor.owner), fence)
        await self._seal_fence_at(
            successor_fence_key(fence.node, fence.successor.owner, fence.successor.term), fence
        )
        log.info(
            "process_lease.fence_sealed",
            extra={
                "fields": {
                    "node": self.node,
                    "predecessor": str(fence.predecessor.owner),
                    "successor": str(fence.successor.owner),
                    "term": fence.successor.term,
                }
            },
        )

    async def find_takeover_from(self, owner: UUID) -> ProcessLeaseFence | None:
        """The takeover that superseded ``owner``: the index first, then a history scan (and
        the transition found there is sealed). An owner superseded twice is invalid."""
        fence = await self.load_fence(owner)
        if fence is not None:
            return fence
        records = await self._read_history()
        found: ProcessLeaseFence | None = None
        for predecessor, successor in pairwise(records):
            if predecessor.owner != owner or predecessor.seq + 1 != successor.seq:
                continue
            try:
                candidate = ProcessLeaseFence(predecessor, successor)
            except ProcessLeaseInvalid:
                continue  # a renewal, not a transition
            if found is not None:
                raise ProcessLeaseInvalid(
                    f"process owner {owner} appears in more than one durable takeover transition"
                )
            found = candidate
        if found is not None:
            await self._seal_fence(found)
            return found
        # A concurrent pruner may have sealed the index and removed the history pair after our
        # first point read but before the scan completed.
        return await self.load_fence(owner)

    async def ensure_current_term_fence(self, current: ProcessLease) -> None:
        """Prove that ``current``'s term was reached by a sealed takeover (term 1 needs none);
        seal it from the history if only the records are left. Invalid without evidence."""
        if current.term == 1 or self._sealed_term == current.term:
            self._sealed_term = current.term
            return
        fence = await self.load_successor_fence(current.owner, current.term)
        if fence is not None:
            if fence.successor.seq > current.seq:
                raise ProcessLeaseInvalid("process term fence starts after the current lease head")
            self._sealed_term = current.term
            return
        records = await self._read_history()
        for left, right in pairwise(records):
            if (
                left.seq + 1 == right.seq
                and right.owner == current.owner
                and right.term == current.term
            ):
                await self._seal_fence(ProcessLeaseFence(left, right))
                self._sealed_term = current.term
                return
        raise ProcessLeaseInvalid(
            f"current process term {current.term} of node {self.node} has no durable takeover "
            "evidence"
        )

    # --- writing -----------------------------------------------------------------------------

    async def _create(self, record: ProcessLease) -> bool:
        """Create ``record`` at its sequence; False if that sequence already exists."""
        key = lease_key(self.node, record.seq)
        try:
            await self._store.put(key, record.encode(), CREATE)
        except PreconditionFailed:
            return False
        except StoreError as error:
            raise _io(f"writing {key}", error) from error
        return True

    def _candidate(self, owner: UUID, term: int, seq: int, now_ms: int) -> ProcessLease:
        if term > MAX_U64:
            raise ProcessLeaseInvalid("process term exhausted")
        if seq > MAX_U64:
            raise ProcessLeaseInvalid("lease sequence exhausted")
        return ProcessLease(self.node, owner, term, seq, expiry_ms(now_ms, self.ttl_ms))

    @staticmethod
    def _check_owner(owner: UUID) -> None:
        if not isinstance(owner, UUID) or owner.int == 0:
            raise ProcessLeaseInvalid("process lease owner must be a non-nil UUID")

    async def try_acquire(self, owner: UUID, now_ms: int) -> Outcome:
        """Acquire the node for ``owner`` (first term) or renew it (same owner: same term,
        ``seq+1``); ``now_ms`` is the writer's wall clock for ``expires_at_ms``.

        :class:`Held` with the head when another owner has it (whatever its expiry says:
        taking over needs a full observation). A lost create reads the winner."""
        self._check_owner(owner)
        await self._repair_unhealthy_prune()
        current = await self.load()
        if current is not None and current.owner == owner:
            await self.ensure_current_term_fence(current)
        if current is None:
            candidate = self._candidate(owner, 1, 1, now_ms)
        elif current.owner == owner:
            candidate = self._candidate(owner, current.term, current.seq + 1, now_ms)
        else:
            return Held(current)
        if await self._create(candidate):
            self._sealed_term = candidate.term
            self._schedule_prune(force=False)
            return Acquired(candidate)
        winner = await self.load()
        if winner is None:
            raise ProcessLeaseIO("CAS conflict but the winner was not readable")
        self._schedule_prune(force=False)
        if winner.owner == owner:
            await self.ensure_current_term_fence(winner)
            return Acquired(winner)
        return Held(winner)

    def observe_rival(self, lease: ProcessLease) -> ProcessLeaseObservation:
        """Start observing ``lease`` on this candidate's monotonic clock."""
        lease.validate(self.node)
        return ProcessLeaseObservation(lease, self._clock.monotonic())

    def observation_ends(self, observation: ProcessLeaseObservation) -> float:
        """The monotonic moment from which ``observation`` has lasted a full TTL."""
        return observation.started + self.ttl_s

    async def try_takeover(
        self, owner: UUID, observation: ProcessLeaseObservation, now_ms: int
    ) -> Outcome:
        """Take the node over for ``owner`` if the observed head is still the head and has been
        watched for a full TTL: append ``term+1, seq+1`` and seal the fence.

        :class:`Held` with the observed record if the observation is too short (nothing is
        read or written), with the current head if it changed or another takeover won."""
        self._check_owner(owner)
        await self._repair_unhealthy_prune()
        observation.lease.validate(self.node)
        if self._clock.monotonic() < self.observation_ends(observation):
            return Held(observation.lease)
        current = await self.load()
        if current is None:
            raise ProcessLeaseInvalid("observed process lease disappeared")
        if current != observation.lease:
            return Held(current)
        candidate = self._candidate(owner, current.term + 1, current.seq + 1, now_ms)
        if await self._create(candidate):
            await self._seal_fence(ProcessLeaseFence(current, candidate))
            self._sealed_term = candidate.term
            self._schedule_prune(force=True)
            log.warning(
                "process_lease.taken_over",
                extra={
                    "fields": {
                        "node": self.node,
                        "from": str(current.owner),
                        "to": str(owner),
                        "term": candidate.term,
                    }
                },
            )
            return Acquired(candidate)
        winner = await self.load()
        if winner is None:
            raise ProcessLeaseIO("takeover CAS winner was not readable")
        self._schedule_prune(force=True)
        return Held(winner)

    # --- retention ---------------------------------------------------------------------------

    def _schedule_prune(self, *, force: bool) -> None:
        if not force:
            self._writes_since_prune += 1
            if self._writes_since_prune < self.bounds.writes_per_prune:
                return
        if self._prune_task is not None and not self._prune_task.done():
            return  # at most one prune at a time; the counter stays due
        self._writes_since_prune = 0
        self._prune_task = asyncio.get_running_loop().create_task(
            self._background_prune(), name=f"process-lease-prune-{self.node}"
        )

    async def _background_prune(self) -> None:
        try:
            await self.prune_history()
        except ProcessLeaseError as error:
            self._healthy = False
            log.warning(
                "process_lease.prune_failed",
                extra={"fields": {"node": self.node, "error": error.message}},
            )
        else:
            self._healthy = True

    async def wait_prune(self) -> None:
        """Wait for the background prune in progress, if any (it never raises: a failure shows
        as :attr:`healthy` false)."""
        task = self._prune_task
        if task is not None:
            await asyncio.wait({task})

    async def close(self) -> None:
        """Cancel a background prune in progress (the next prune or repair resumes safely: a
        batch seals before it deletes). Does not close the object store."""
        task, self._prune_task = self._prune_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def _repair_unhealthy_prune(self) -> None:
        if self._healthy:
            return
        log.info("process_lease.prune_repair", extra={"fields": {"node": self.node}})
        await self.prune_history()
        self._healthy = True
        self._writes_since_prune = 0

    async def prune_history(self) -> None:
        """Prune to ``history_to_retain`` records in at most ``max_prune_batches`` batches,
        each under ``prune_io_timeout_s`` on the clock. Raises on any failure."""
        for _ in range(self.bounds.max_prune_batches):
            deadline = self._clock.monotonic() + self.bounds.prune_io_timeout_s
            try:
                done = await run_until(self._clock, deadline, self._prune_batch())
            except StepTimedOut:
                raise ProcessLeaseIO(
                    f"process lease history prune of node {self.node} timed out after "
                    f"{self.bounds.prune_io_timeout_s:g} s"
                ) from None
            if done:
                return
            await asyncio.sleep(0)
        raise ProcessLeaseIO(
            f"process lease history of node {self.node} still exceeds the bounded prune budget"
        )

    async def _prune_batch(self) -> bool:
        """One batch: seal every transition in the oldest window, then delete its oldest
        records. True when the history is down to retention."""
        count, window = await self._oldest_prune_window()
        retain = self.bounds.history_to_retain
        if count <= retain:
            return True
        delete_count = min(count - retain, self.bounds.prune_batch_records)
        if len(window) <= delete_count:
            raise ProcessLeaseInvalid("process lease prune window is missing its retained boundary")
        read = await map_bounded(self._read_record, window, self.bounds.read_concurrency)
        records = [record for record in read if record is not None]
        if len(records) != len(read):
            return False  # another pruner got there first; list again
        # Seal every observed term transition under both identities before deleting either
        # side: the index keeps recovery O(1), and routine renewals or later terms can never
        # erase takeover evidence.
        for left, right in pairwise(records):
            if left.seq + 1 != right.seq:
                raise ProcessLeaseInvalid(
                    f"process lease history of node {self.node} contains a noncontiguous "
                    f"sequence ({left.seq} then {right.seq})"
                )
            if left.owner != right.owner or left.term != right.term:
                if right.term != left.term + 1 or left.owner == right.owner:
                    raise ProcessLeaseInvalid(
                        f"process lease history of node {self.node} contains a noncanonical term "
                        f"transition at sequence {right.seq}"
                    )
                await self._seal_fence(ProcessLeaseFence(left, right))
        doomed = [record.seq for record in records[:delete_count]]
        await map_bounded(self._delete_record, doomed, self.bounds.read_concurrency)
        log.debug(
            "process_lease.pruned",
            extra={"fields": {"node": self.node, "deleted": len(doomed), "count": count}},
        )
        return count - delete_count <= retain

    async def _delete_record(self, seq: int) -> None:
        key = lease_key(self.node, seq)
        try:
            await self._store.delete(key)
        except NotFound:
            pass
        except StoreError as error:
            raise _io(f"deleting {key}", error) from error
