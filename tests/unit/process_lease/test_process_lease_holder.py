"""ProcessLeaseHolder: acquire at start or refuse naming the holder, renew every TTL/3, take over
only after a full unchanged TTL, a write deadline 2/3 TTL after the last confirmed send, and
lost for good once fenced (MemoryStore + FaultyStore, FakeClock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import UUID

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import ProcessLeaseError, ProcessLeaseHeld
from mushroom_backup.lease.process.authority import ProcessLeaseAuthority
from mushroom_backup.lease.process.holder import ProcessLeaseHolder
from mushroom_backup.lease.process.record import (
    Participant,
    ProcessLeaseFence,
    fence_key,
    lease_key,
)
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

NODE = 3
TTL = timedelta(seconds=30)
TTL_S = 30.0
A = UUID("aaaaaaaa-0000-4000-8000-000000000001")
B = UUID("bbbbbbbb-0000-4000-8000-000000000002")


async def settle() -> None:
    for _ in range(200):
        await asyncio.sleep(0)


@pytest.fixture
async def holder_a(memory: MemoryStore, clock: FakeClock) -> AsyncIterator[ProcessLeaseHolder]:
    holder = ProcessLeaseHolder(memory, NODE, ttl=TTL, clock=clock, boot_incarnation=A)
    yield holder
    await holder.stop()


def records(memory: MemoryStore) -> list[str]:
    return [key for key in memory.keys if "/lease/" in key]


async def test_start_acquires_term_one_and_exposes_the_participant(
    holder_a: ProcessLeaseHolder, clock: FakeClock
) -> None:
    assert holder_a.term is None
    assert holder_a.write_deadline() is None
    started = clock.monotonic()
    lease = await holder_a.start()
    assert (lease.term, lease.seq, lease.owner) == (1, 1, A)
    assert holder_a.term == 1
    assert holder_a.participant == Participant(NODE, A)
    assert holder_a.write_deadline() == started + TTL_S * 2 / 3
    with pytest.raises(ProcessLeaseError, match="starts once"):
        await holder_a.start()


async def test_a_second_incarnation_is_refused_naming_the_holder_and_its_expiry(
    holder_a: ProcessLeaseHolder, memory: MemoryStore, clock: FakeClock
) -> None:
    await holder_a.start()
    clock.advance(10)
    await settle()
    second = ProcessLeaseHolder(memory, NODE, ttl=TTL, clock=clock, boot_incarnation=B)
    with pytest.raises(
        ProcessLeaseHeld, match=rf"held by process incarnation {A}.*expires in 30.0 s"
    ):
        await second.start()
    assert second.write_deadline() is None
    assert records(memory) == [lease_key(NODE, 1), lease_key(NODE, 2)]  # A renewed at TTL/3


async def test_an_expired_holder_is_still_refused_without_takeover(
    holder_a: ProcessLeaseHolder, memory: MemoryStore, clock: FakeClock
) -> None:
    await holder_a.start()
    await holder_a.stop()
    clock.advance(100)
    second = ProcessLeaseHolder(memory, NODE, ttl=TTL, clock=clock, boot_incarnation=B)
    with pytest.raises(ProcessLeaseHeld, match=r"expired 70.0 s ago .*node fence --node 3"):
        await second.start()


async def test_renewals_every_third_of_a_ttl_move_the_write_deadline(
    holder_a: ProcessLeaseHolder, memory: MemoryStore, clock: FakeClock
) -> None:
    await holder_a.start()
    for renewal in range(1, 4):
        clock.advance(TTL_S / 3)
        await settle()
        assert holder_a.lease is not None
        assert holder_a.lease.seq == 1 + renewal
        assert holder_a.write_deadline() == clock.monotonic() + TTL_S * 2 / 3
    assert holder_a.term == 1


async def test_failed_renewals_are_retried_and_the_write_deadline_closes_on_its_own(
    memory: MemoryStore, clock: FakeClock
) -> None:
    faulty = FaultyStore(memory)
    holder = ProcessLeaseHolder(faulty, NODE, ttl=TTL, clock=clock, boot_incarnation=A)
    started = clock.monotonic()
    await holder.start()
    faulty.fail("put", times=2)
    for _ in range(2):
        clock.advance(TTL_S / 3)
        await settle()
    deadline = holder.write_deadline()
    assert deadline == started + TTL_S * 2 / 3
    assert clock.monotonic() >= deadline  # no write may start now
    clock.advance(TTL_S / 3)
    await settle()
    assert holder.lease is not None
    assert holder.lease.seq == 2
    assert not holder.lost
    await holder.stop()


async def test_a_stalled_renewal_is_cut_off_and_retried(
    memory: MemoryStore, clock: FakeClock
) -> None:
    faulty = FaultyStore(memory)
    holder = ProcessLeaseHolder(faulty, NODE, ttl=TTL, clock=clock, boot_incarnation=A)
    await holder.start()
    stall = faulty.stall("put", times=1, key=lease_key(NODE, 2))
    clock.advance(TTL_S / 3)
    await stall.entered.wait()
    clock.advance(TTL_S / 3)
    await settle()
    assert stall.waiting == 0
    assert holder.lease is not None
    assert holder.lease.seq == 2  # the next attempt went through
    await holder.stop()


async def test_takeover_waits_one_unchanged_ttl_and_seals_the_fence(
    holder_a: ProcessLeaseHolder, memory: MemoryStore, clock: FakeClock
) -> None:
    await holder_a.start()
    await holder_a.stop()  # A crashed: no more renewals
    second = ProcessLeaseHolder(memory, NODE, ttl=TTL, clock=clock, boot_incarnation=B)
    task = asyncio.create_task(second.start(takeover=True))
    await settle()
    clock.advance(TTL_S - 0.001)
    await settle()
    assert not task.done()
    clock.advance(0.001)
    lease = await task
    assert (lease.owner, lease.term, lease.seq) == (B, 2, 2)
    assert second.term == 2
    assert fence_key(NODE, A) in memory.keys
    await second.stop()


async def test_takeover_of_a_live_holder_is_refused_after_the_observation(
    holder_a: ProcessLeaseHolder, memory: MemoryStore, clock: FakeClock
) -> None:
    await holder_a.start()
    second = ProcessLeaseHolder(memory, NODE, ttl=TTL, clock=clock, boot_incarnation=B)
    task = asyncio.create_task(second.start(takeover=True))
    await settle()
    for _ in range(3):
        clock.advance(TTL_S / 3)
        await settle()
    with pytest.raises(ProcessLeaseHeld, match="changed during the full-TTL observation"):
        await task
    assert not holder_a.lost


async def test_a_fenced_holder_is_lost_for_good_and_stops_writing(
    memory: MemoryStore, clock: FakeClock
) -> None:
    partitioned = FaultyStore(memory)
    holder = ProcessLeaseHolder(partitioned, NODE, ttl=TTL, clock=clock, boot_incarnation=A)
    await holder.start()
    partitioned.fail("put", times=3)  # cut off from the store: three renewals fail
    authority = ProcessLeaseAuthority(memory, TTL, clock=clock)
    fencing = asyncio.create_task(
        authority.fence_incarnation(Participant(NODE, A), authority.fencing_deadline(5.0))
    )
    await settle()
    for _ in range(3):
        clock.advance(TTL_S / 3)
        await settle()
    fence = await fencing
    assert isinstance(fence, ProcessLeaseFence)
    stopped_writing = holder.write_deadline()
    assert stopped_writing is not None
    assert stopped_writing <= clock.monotonic() - TTL_S / 3  # a third of a TTL before takeover
    clock.advance(TTL_S / 3)  # the partition has healed: the next renewal reads the head
    await settle()
    assert holder.lost
    assert holder.write_deadline() is None
    assert f"taken over by process incarnation {fence.successor.owner}" in await holder.wait_lost()
    puts_before = [c for c in partitioned.calls if c[0] == "put"]
    clock.advance(TTL_S)
    await settle()
    assert [c for c in partitioned.calls if c[0] == "put"] == puts_before
    await holder.stop()


async def test_the_context_manager_starts_and_stops(memory: MemoryStore, clock: FakeClock) -> None:
    async with ProcessLeaseHolder(memory, NODE, ttl=TTL, clock=clock) as holder:
        assert holder.term == 1
        assert holder.write_deadline() is not None
    assert holder.write_deadline() is None
    clock.advance(TTL_S)
    await settle()
    assert records(memory) == [lease_key(NODE, 1)]  # no renewals after stop
