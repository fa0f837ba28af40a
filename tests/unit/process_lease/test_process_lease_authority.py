"""ProcessLeaseAuthority: fencing after a full observed TTL, renewal during the observation, a
retry after a won takeover, deadlines on every step, current-participant and fence
verification (MemoryStore + FaultyStore, FakeClock; time moves only when a test moves it)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from datetime import timedelta
from uuid import UUID

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import (
    ProcessLeaseDeadline,
    ProcessLeaseHeld,
    ProcessLeaseInvalid,
    ProcessLeaseIO,
)
from mushroom_backup.lease.process.authority import ProcessLeaseAuthority
from mushroom_backup.lease.process.record import (
    Participant,
    ProcessLease,
    ProcessLeaseFence,
    fence_key,
    lease_key,
    successor_fence_key,
    wall_ms,
)
from mushroom_backup.store.base import ObjectStore, StoredObject
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

NODE = 7
TTL = timedelta(seconds=30)
TTL_S = 30.0
A = UUID("aaaaaaaa-0000-4000-8000-000000000001")
B = UUID("bbbbbbbb-0000-4000-8000-000000000002")
C = UUID("cccccccc-0000-4000-8000-000000000003")
R1 = UUID("11111111-0000-4000-8000-00000000000a")
R2 = UUID("22222222-0000-4000-8000-00000000000b")
EXPIRES = 1_796_000_000_000


def rec(owner: UUID, term: int, seq: int) -> ProcessLease:
    return ProcessLease(NODE, owner, term, seq, EXPIRES)


async def write(store: ObjectStore, *records: ProcessLease) -> None:
    for record in records:
        await store.put(lease_key(NODE, record.seq), record.encode())


def revokers(*ids: UUID) -> Callable[[], UUID]:
    pending: Iterator[UUID] = itertools.chain(ids, itertools.repeat(R2))
    return lambda: next(pending)


def authority(
    store: ObjectStore, clock: FakeClock, *revoker_ids: UUID, ttl: timedelta = TTL
) -> ProcessLeaseAuthority:
    return ProcessLeaseAuthority(
        store, ttl, clock=clock, new_incarnation=revokers(*(revoker_ids or (R1,)))
    )


async def settle() -> None:
    """Let every task run until it waits on the clock or a stall (memory I/O needs no time)."""
    for _ in range(200):
        await asyncio.sleep(0)


# --- construction and deadlines ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "why"),
    [
        (timedelta(0), "positive"),
        (timedelta(microseconds=500), "whole milliseconds"),
        (timedelta(seconds=1, microseconds=1), "whole milliseconds"),
        (timedelta(days=2), "limit"),
    ],
)
def test_zero_fractional_and_oversized_ttls_are_refused(ttl: timedelta, why: str) -> None:
    with pytest.raises(ProcessLeaseInvalid, match=why):
        ProcessLeaseAuthority(MemoryStore(), ttl)


def test_fencing_deadline_covers_one_ttl_plus_the_io_budget(clock: FakeClock) -> None:
    fences = authority(MemoryStore(), clock)
    assert fences.fencing_deadline(5.0) == clock.monotonic() + TTL_S + 5.0
    for budget in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ProcessLeaseInvalid, match="I/O budget must be nonzero"):
            fences.fencing_deadline(budget)


# --- fence_incarnation -------------------------------------------------------------------------


async def test_fencing_observes_one_full_ttl_then_supersedes_with_a_fresh_revoker(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(A, 1, 2))
    fences = authority(memory, clock, A, UUID(int=0), R1)  # never the fenced one, never nil
    start = clock.monotonic()
    task = asyncio.create_task(
        fences.fence_incarnation(Participant(NODE, A), fences.fencing_deadline(5.0))
    )
    await settle()
    assert clock.next_deadline() == start + TTL_S  # asleep for exactly one TTL
    clock.advance(TTL_S - 0.001)
    await settle()
    assert not task.done()
    assert lease_key(NODE, 3) not in memory.keys
    clock.advance(0.001)
    fence = await task
    successor = ProcessLease(NODE, R1, 2, 3, wall_ms(clock.wall()) + 30_000)
    assert fence == ProcessLeaseFence(rec(A, 1, 2), successor)
    assert (await memory.get(fence_key(NODE, A))).data == fence.encode()
    assert (await memory.get(successor_fence_key(NODE, R1, 2))).data == fence.encode()
    deadline = clock.monotonic() + 1
    assert await fences.verify_fence(fence, deadline)
    assert not await fences.verify_current_participant(Participant(NODE, A), deadline)
    assert await fences.verify_current_participant_term(Participant(NODE, R1), 2, deadline)


async def test_renewal_during_the_observation_is_an_error_and_writes_nothing(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    fences = authority(memory, clock)
    task = asyncio.create_task(
        fences.fence_incarnation(Participant(NODE, A), fences.fencing_deadline(5.0))
    )
    await settle()
    await write(memory, rec(A, 1, 2))  # the incarnation is alive
    clock.advance(TTL_S)
    with pytest.raises(ProcessLeaseHeld, match="renewed during the full-TTL observation"):
        await task
    assert memory.keys == [lease_key(NODE, 1), lease_key(NODE, 2)]


async def test_a_retry_after_a_won_takeover_rebuilds_the_certificate_without_waiting(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    faulty = FaultyStore(memory)
    faulty.fail("put", key=fence_key(NODE, A))  # the takeover lands, sealing it fails
    fences = authority(faulty, clock)
    task = asyncio.create_task(
        fences.fence_incarnation(Participant(NODE, A), fences.fencing_deadline(5.0))
    )
    await settle()
    clock.advance(TTL_S)
    with pytest.raises(ProcessLeaseIO, match="not durably visible"):
        await task
    assert lease_key(NODE, 2) in memory.keys
    assert fence_key(NODE, A) not in memory.keys

    retry = authority(memory, clock, R2)  # a fresh process: nothing remembered
    retried = asyncio.create_task(
        retry.fence_incarnation(Participant(NODE, A), retry.fencing_deadline(5.0))
    )
    await settle()
    assert retried.done()  # without the clock moving: no second TTL
    fence = retried.result()
    assert fence.predecessor == rec(A, 1, 1)
    assert fence.successor.owner == R1  # the revoker that won, not a new one
    assert (await memory.get(fence_key(NODE, A))).data == fence.encode()
    again = await retry.fence_incarnation(Participant(NODE, A), retry.fencing_deadline(5.0))
    assert again == fence  # now straight from the index


async def test_concurrent_fencers_return_the_same_certificate(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    first, second = authority(memory, clock, R1), authority(memory, clock, R2)
    tasks = [
        asyncio.create_task(f.fence_incarnation(Participant(NODE, A), f.fencing_deadline(5.0)))
        for f in (first, second)
    ]
    await settle()
    clock.advance(TTL_S)
    one, two = await asyncio.gather(*tasks)
    assert one == two
    assert one.successor.owner in (R1, R2)
    assert [key for key in memory.keys if "/lease/" in key] == [
        lease_key(NODE, 1),
        lease_key(NODE, 2),
    ]


async def test_fencing_an_incarnation_that_was_never_superseded_is_invalid(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(B, 2, 2))
    fences = authority(memory, clock)
    with pytest.raises(ProcessLeaseInvalid, match=f"takeover evidence for {C} is missing"):
        await fences.fence_incarnation(Participant(NODE, C), fences.fencing_deadline(5.0))
    with pytest.raises(ProcessLeaseInvalid, match="history of node 8 is missing"):
        await fences.fence_incarnation(Participant(8, A), fences.fencing_deadline(5.0))


async def test_a_deadline_that_does_not_cover_a_full_ttl_is_refused_before_waiting(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    fences = authority(memory, clock)
    with pytest.raises(ProcessLeaseDeadline, match="does not cover one full process lease TTL"):
        await fences.fence_incarnation(Participant(NODE, A), clock.monotonic() + TTL_S)
    with pytest.raises(ProcessLeaseDeadline, match="expired before loading"):
        await fences.fence_incarnation(Participant(NODE, A), clock.monotonic())


async def test_a_step_still_running_at_the_deadline_is_cancelled(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    faulty = FaultyStore(memory)
    stall = faulty.stall("get", key=lease_key(NODE, 1))
    fences = authority(faulty, clock)
    task = asyncio.create_task(
        fences.fence_incarnation(Participant(NODE, A), fences.fencing_deadline(1.0))
    )
    await stall.entered.wait()
    clock.advance(TTL_S + 1.0)
    with pytest.raises(ProcessLeaseDeadline, match="expired during loading process lease"):
        await task
    assert stall.waiting == 0


async def test_a_takeover_still_in_flight_at_the_deadline_is_cancelled(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    faulty = FaultyStore(memory)
    stall = faulty.stall("put", key=lease_key(NODE, 2))
    fences = authority(faulty, clock)
    task = asyncio.create_task(
        fences.fence_incarnation(Participant(NODE, A), fences.fencing_deadline(1.0))
    )
    await settle()
    clock.advance(TTL_S)
    await stall.entered.wait()
    clock.advance(1.0)
    with pytest.raises(ProcessLeaseDeadline, match="during publishing process lease takeover"):
        await task
    assert stall.waiting == 0
    assert memory.keys == [lease_key(NODE, 1)]


# --- verify_current_participant ----------------------------------------------------------------


async def test_current_participant_and_term(memory: MemoryStore, clock: FakeClock) -> None:
    fences = authority(memory, clock)
    deadline = clock.monotonic() + 1
    assert not await fences.verify_current_participant(Participant(NODE, A), deadline)
    await write(memory, rec(A, 1, 1), rec(A, 1, 2))
    assert await fences.verify_current_participant(Participant(NODE, A), deadline)
    assert await fences.verify_current_participant_term(Participant(NODE, A), 1, deadline)
    assert not await fences.verify_current_participant_term(Participant(NODE, A), 2, deadline)
    assert not await fences.verify_current_participant(Participant(NODE, B), deadline)
    with pytest.raises(ProcessLeaseInvalid, match="term must be nonzero"):
        await fences.verify_current_participant_term(Participant(NODE, A), 0, deadline)
    with pytest.raises(ProcessLeaseDeadline, match="before loading current"):
        await fences.verify_current_participant(Participant(NODE, A), clock.monotonic())


async def test_a_current_term_without_takeover_evidence_fails_closed(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(B, 2, 2), rec(B, 2, 3))
    fences = authority(memory, clock)
    with pytest.raises(ProcessLeaseInvalid, match="noncanonical term transition"):
        await fences.verify_current_participant(Participant(NODE, B), clock.monotonic() + 1)
    await memory.delete(lease_key(NODE, 2))
    with pytest.raises(ProcessLeaseInvalid, match="no durable takeover evidence"):
        await fences.verify_current_participant(Participant(NODE, B), clock.monotonic() + 1)


class _TakeoverDuringVerification(FaultyStore):
    """Writes a takeover by C right after the successor index of B's term is read."""

    async def get(self, key: str) -> StoredObject:
        try:
            return await super().get(key)
        finally:
            if key == successor_fence_key(NODE, B, 2):
                await write(self.inner, rec(C, 3, 4))


async def test_a_head_that_moves_during_verification_is_not_current(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(B, 2, 2), rec(B, 2, 3))
    fence = ProcessLeaseFence(rec(A, 1, 1), rec(B, 2, 2))
    await memory.put(successor_fence_key(NODE, B, 2), fence.encode())
    fences = authority(_TakeoverDuringVerification(memory), clock)
    assert not await fences.verify_current_participant(Participant(NODE, B), clock.monotonic() + 1)


# --- verify_fence ------------------------------------------------------------------------------


async def _fenced(memory: MemoryStore, clock: FakeClock) -> ProcessLeaseFence:
    await write(memory, rec(A, 1, 1))
    fences = authority(memory, clock)
    task = asyncio.create_task(
        fences.fence_incarnation(Participant(NODE, A), fences.fencing_deadline(5.0))
    )
    await settle()
    clock.advance(TTL_S)
    return await task


async def test_a_fence_stays_verifiable_after_later_terms(
    memory: MemoryStore, clock: FakeClock
) -> None:
    fence = await _fenced(memory, clock)
    await write(memory, ProcessLease(NODE, C, 3, 3, EXPIRES))
    assert await authority(memory, clock).verify_fence(fence, clock.monotonic() + 1)


async def test_a_fence_whose_predecessor_is_current_again_is_false(
    memory: MemoryStore, clock: FakeClock
) -> None:
    fence = await _fenced(memory, clock)
    await write(memory, ProcessLease(NODE, A, 3, 3, EXPIRES))
    assert not await authority(memory, clock).verify_fence(fence, clock.monotonic() + 1)


async def test_a_fence_that_differs_from_the_durable_one_is_false(
    memory: MemoryStore, clock: FakeClock
) -> None:
    fence = await _fenced(memory, clock)
    s = fence.successor
    forged = ProcessLeaseFence(
        fence.predecessor, ProcessLease(s.node, s.owner, s.term, s.seq, s.expires_at_ms + 1)
    )
    assert not await authority(memory, clock).verify_fence(forged, clock.monotonic() + 1)


async def test_a_fence_without_its_index_or_without_a_head_is_invalid(
    memory: MemoryStore, clock: FakeClock
) -> None:
    fence = await _fenced(memory, clock)
    fences = authority(memory, clock)
    await memory.delete(lease_key(NODE, 1))
    await memory.delete(lease_key(NODE, 2))
    with pytest.raises(ProcessLeaseInvalid, match="durable head is missing"):
        await fences.verify_fence(fence, clock.monotonic() + 1)
    await memory.delete(fence_key(NODE, A))
    with pytest.raises(ProcessLeaseInvalid, match="indexed process lease fence is missing"):
        await fences.verify_fence(fence, clock.monotonic() + 1)
