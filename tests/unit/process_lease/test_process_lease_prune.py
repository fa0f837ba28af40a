"""Bounded history retention: prune every N writes to a fixed history, in bounded batches with
an I/O timeout and bounded read concurrency, sealing every transition before deleting it; a
failed prune marks the store unhealthy and the next acquire repairs it synchronously."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import ProcessLeaseInvalid, ProcessLeaseIO
from mushroom_backup.lease.process.record import (
    Acquired,
    ProcessLease,
    ProcessLeaseFence,
    fence_key,
    lease_key,
    successor_fence_key,
)
from mushroom_backup.lease.process.store import ProcessLeaseStore
from mushroom_backup.store.base import ObjectStore, StoredObject
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.unit.process_lease.process_lease_support import (
        NODE,
        NOW,
        SMALL,
        TTL_MS,
        A,
        B,
        C,
        rec,
        write,
    )
else:
    from process_lease_support import NODE, NOW, SMALL, TTL_MS, A, B, C, rec, write


def seqs(memory: MemoryStore) -> list[int]:
    return [int(key.rsplit("/", 1)[1]) for key in memory.keys if "/lease/" in key]


def leases(store: ObjectStore, clock: FakeClock) -> ProcessLeaseStore:
    return ProcessLeaseStore(store, NODE, TTL_MS, clock=clock, bounds=SMALL)


async def test_every_n_writes_a_prune_keeps_the_retained_history(
    memory: MemoryStore, clock: FakeClock
) -> None:
    store = leases(memory, clock)
    # write number -> oldest record kept: prunes after writes 2, 4, 6, 8, 10 keep 4 records
    oldest = {1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 3, 7: 3, 8: 5, 9: 5, 10: 7, 11: 7}
    for write_number, expected in oldest.items():
        await store.try_acquire(A, NOW)
        await store.wait_prune()
        assert seqs(memory) == list(range(expected, write_number + 1)), write_number
    assert store.healthy


async def test_a_transition_in_a_batch_is_sealed_before_either_side_is_deleted(
    memory: MemoryStore, clock: FakeClock
) -> None:
    # 7 records, retain 4: one batch deletes 1..3 and reads 1..4, so the A->B transition at the
    # boundary (3->4) is sealed although only its predecessor is deleted.
    history = [rec(A, 1, 1), rec(A, 1, 2), rec(A, 1, 3), rec(B, 2, 4), rec(B, 2, 5)]
    await write(memory, *history, rec(B, 2, 6), rec(B, 2, 7))
    faulty = FaultyStore(memory)
    await leases(faulty, clock).prune_history()
    assert seqs(memory) == [4, 5, 6, 7]
    fence = ProcessLeaseFence(rec(A, 1, 3), rec(B, 2, 4))
    assert (await memory.get(fence_key(NODE, A))).data == fence.encode()
    assert (await memory.get(successor_fence_key(NODE, B, 2))).data == fence.encode()
    writes = [(op, key) for op, key in faulty.calls if op in ("put", "delete")]
    assert writes[:2] == [("put", fence_key(NODE, A)), ("put", successor_fence_key(NODE, B, 2))]
    assert {op for op, _ in writes[2:]} == {"delete"}
    assert await leases(memory, clock).find_takeover_from(A) == fence


async def test_pruning_keeps_every_fence_of_a_long_history(
    memory: MemoryStore, clock: FakeClock
) -> None:
    history = (
        [rec(A, 1, s) for s in range(1, 6)]
        + [rec(B, 2, s) for s in range(6, 9)]
        + [rec(C, 3, s) for s in range(9, 19)]
    )
    await write(memory, *history)
    store = leases(memory, clock)
    await store.prune_history()
    assert seqs(memory) == [15, 16, 17, 18]
    assert await store.find_takeover_from(A) == ProcessLeaseFence(rec(A, 1, 5), rec(B, 2, 6))
    assert await store.find_takeover_from(B) == ProcessLeaseFence(rec(B, 2, 8), rec(C, 3, 9))
    await store.ensure_current_term_fence(rec(C, 3, 18))


@pytest.mark.parametrize(
    ("history", "why"),
    [
        ([rec(A, 1, 1), rec(A, 1, 2), rec(A, 1, 4), rec(A, 1, 5), rec(A, 1, 6)], "noncontiguous"),
        ([rec(A, 1, 1), rec(A, 1, 2), rec(B, 3, 3), rec(B, 3, 4), rec(B, 3, 5)], "term transition"),
        ([rec(A, 1, 1), rec(A, 1, 2), rec(A, 2, 3), rec(A, 2, 4), rec(A, 2, 5)], "term transition"),
        ([rec(A, 1, 1), rec(A, 1, 2), rec(B, 1, 3), rec(B, 1, 4), rec(B, 1, 5)], "term transition"),
    ],
)
async def test_a_gap_or_a_noncanonical_transition_fails_the_prune_and_deletes_nothing(
    memory: MemoryStore, clock: FakeClock, history: list[ProcessLease], why: str
) -> None:
    await write(memory, *history)
    before = memory.keys
    with pytest.raises(ProcessLeaseInvalid, match=why):
        await leases(memory, clock).prune_history()
    assert memory.keys == before


async def test_a_noncanonical_body_in_the_window_fails_the_prune(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, s) for s in range(1, 7)))
    await memory.put(lease_key(NODE, 2), rec(A, 1, 2).encode() + b"\n")
    with pytest.raises(ProcessLeaseInvalid, match="canonical body"):
        await leases(memory, clock).prune_history()
    assert seqs(memory) == [1, 2, 3, 4, 5, 6]


async def test_a_failed_background_prune_is_repaired_by_the_next_acquire_or_fails_it(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, s) for s in range(1, 8)))
    await memory.put(lease_key(NODE, 2), b"{}")
    store = leases(memory, clock)
    await store.try_acquire(A, NOW)
    await store.try_acquire(A, NOW)  # the second write schedules a prune, which fails
    await store.wait_prune()
    assert not store.healthy
    with pytest.raises(ProcessLeaseInvalid, match="exactly the fields"):
        await store.try_acquire(A, NOW)  # the synchronous repair fails, so the acquire does
    assert seqs(memory)[-1] == 9
    await memory.put(lease_key(NODE, 2), rec(A, 1, 2).encode())  # an operator fixed it
    assert await store.try_acquire(A, NOW) == Acquired(rec(A, 1, 10))
    assert store.healthy
    assert seqs(memory) == [6, 7, 8, 9, 10]  # repaired to 4 before the write appended one


async def test_a_prune_timeout_marks_the_store_unhealthy_and_the_next_acquire_repairs_it(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, s) for s in range(1, 8)))
    faulty = FaultyStore(memory)
    stall = faulty.stall("get", key=lease_key(NODE, 1))
    store = leases(faulty, clock)
    await store.try_acquire(A, NOW)
    await store.try_acquire(A, NOW)
    await stall.entered.wait()
    clock.advance(SMALL.prune_io_timeout_s - 0.001)
    await asyncio.sleep(0)
    assert stall.waiting == 1
    clock.advance(0.001)
    await store.wait_prune()
    assert stall.waiting == 0  # the stalled read was cancelled, not left behind
    assert not store.healthy
    assert seqs(memory) == list(range(1, 10))
    stall.release()
    assert await store.try_acquire(A, NOW) == Acquired(rec(A, 1, 10))
    assert store.healthy
    assert seqs(memory) == [6, 7, 8, 9, 10]


async def test_a_failed_repair_fails_the_acquire_and_stays_unhealthy(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, s) for s in range(1, 8)))
    faulty = FaultyStore(memory)
    faulty.fail("get", key=lease_key(NODE, 1), times=2)
    store = leases(faulty, clock)
    await store.try_acquire(A, NOW)
    await store.try_acquire(A, NOW)
    await store.wait_prune()
    assert not store.healthy
    with pytest.raises(ProcessLeaseIO, match="503"):
        await store.try_acquire(A, NOW)
    assert not store.healthy
    assert seqs(memory)[-1] == 9


async def test_at_most_one_prune_runs_at_a_time(memory: MemoryStore, clock: FakeClock) -> None:
    await write(memory, *(rec(A, 1, s) for s in range(1, 8)))
    faulty = FaultyStore(memory)
    stall = faulty.stall("get", key=lease_key(NODE, 1))
    store = leases(faulty, clock)
    for _ in range(6):  # three prunes fall due while the first is stuck
        await store.try_acquire(A, NOW)
    for _ in range(20):
        await asyncio.sleep(0)
    assert stall.waiting == 1  # a second pruner would be stuck on the same read
    stall.release()
    await store.wait_prune()
    assert store.healthy
    assert seqs(memory) == [10, 11, 12, 13]
    # six loads, and one prune run of three batches (13 -> 10 -> 7 -> 4 records)
    assert [op for op, _ in faulty.calls].count("list") == 6 + 3


async def test_reads_in_a_prune_are_bounded_in_flight(clock: FakeClock) -> None:
    class CountingStore(MemoryStore):
        in_flight = 0
        most = 0

        async def get(self, key: str) -> StoredObject:
            self.in_flight += 1
            type(self).most = max(type(self).most, self.in_flight)
            try:
                for _ in range(3):
                    await asyncio.sleep(0)
                return await super().get(key)
            finally:
                self.in_flight -= 1

    memory = CountingStore()
    await write(memory, *(rec(A, 1, s) for s in range(1, 15)))
    await leases(memory, clock).prune_history()
    assert CountingStore.most == SMALL.read_concurrency
    assert seqs(memory) == [11, 12, 13, 14]


async def test_concurrent_pruners_both_finish_and_keep_the_fence(
    memory: MemoryStore, clock: FakeClock
) -> None:
    history = [rec(A, 1, s) for s in range(1, 5)] + [rec(B, 2, s) for s in range(5, 15)]
    await write(memory, *history)
    first, second = leases(memory, clock), leases(memory, clock)
    await asyncio.gather(first.prune_history(), second.prune_history())
    assert seqs(memory) == [11, 12, 13, 14]
    fence = ProcessLeaseFence(rec(A, 1, 4), rec(B, 2, 5))
    assert await leases(memory, clock).find_takeover_from(A) == fence


async def test_a_backlog_beyond_one_runs_budget_is_pruned_over_several_bounded_runs(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, s) for s in range(1, 61)))  # 3 x the list bound
    store = leases(memory, clock)
    with pytest.raises(ProcessLeaseInvalid, match="scan bound"):
        await store.try_acquire(A, NOW)
    await store.wait_prune()  # the invalid inventory forced a prune: 6 batches of 3
    assert not store.healthy
    assert len(seqs(memory)) == 60 - 18
    for remaining in (60 - 36, 60 - 54):
        with pytest.raises(ProcessLeaseIO, match="bounded prune budget"):
            await store.try_acquire(A, NOW)  # each synchronous repair makes bounded progress
        assert len(seqs(memory)) == remaining
    assert await store.try_acquire(A, NOW) == Acquired(rec(A, 1, 61))
    assert seqs(memory) == [57, 58, 59, 60, 61]
