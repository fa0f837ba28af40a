"""ProcessLeaseStore: acquire, renew, races, load, validation of durable records, takeover after
a full observation, fence sealing and lookup (MemoryStore + FaultyStore, FakeClock)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from uuid import UUID

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import (
    NotFound,
    PreconditionFailed,
    ProcessLeaseInvalid,
    ProcessLeaseIO,
)
from mushroom_backup.lease.process.record import (
    DEFAULT_BOUNDS,
    MAX_U64,
    Acquired,
    Held,
    ProcessLease,
    ProcessLeaseBounds,
    ProcessLeaseFence,
    fence_key,
    lease_key,
    lease_prefix,
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


def leases(
    store: ObjectStore, clock: FakeClock, bounds: ProcessLeaseBounds = DEFAULT_BOUNDS
) -> ProcessLeaseStore:
    return ProcessLeaseStore(store, NODE, TTL_MS, clock=clock, bounds=bounds)


# --- construction ------------------------------------------------------------------------------


def test_construction_refuses_a_zero_node_a_zero_ttl_and_a_best_effort_store(
    clock: FakeClock,
) -> None:
    with pytest.raises(ProcessLeaseInvalid, match="node"):
        ProcessLeaseStore(MemoryStore(), 0, TTL_MS, clock=clock)
    with pytest.raises(ProcessLeaseInvalid, match="TTL"):
        ProcessLeaseStore(MemoryStore(), NODE, 0, clock=clock)
    with pytest.raises(ProcessLeaseInvalid, match="conditional writes"):
        ProcessLeaseStore(MemoryStore(conditional=False), NODE, TTL_MS, clock=clock)


async def test_a_nil_owner_is_refused(memory: MemoryStore, clock: FakeClock) -> None:
    with pytest.raises(ProcessLeaseInvalid, match="non-nil"):
        await leases(memory, clock).try_acquire(UUID(int=0), NOW)
    assert memory.keys == []


# --- acquire and renew -------------------------------------------------------------------------


async def test_a_new_node_has_no_head(memory: MemoryStore, clock: FakeClock) -> None:
    assert await leases(memory, clock).load() is None


async def test_first_acquire_writes_term_one_seq_one(memory: MemoryStore, clock: FakeClock) -> None:
    outcome = await leases(memory, clock).try_acquire(A, NOW)
    assert outcome == Acquired(ProcessLease(NODE, A, 1, 1, NOW + TTL_MS))
    assert memory.keys == [lease_key(NODE, 1)]
    assert (await memory.get(lease_key(NODE, 1))).data == outcome.lease.encode()


async def test_renewal_keeps_the_term_and_appends_the_next_sequence(
    memory: MemoryStore, clock: FakeClock
) -> None:
    store = leases(memory, clock)
    await store.try_acquire(A, NOW)
    outcome = await store.try_acquire(A, NOW + 10_000)
    assert outcome == Acquired(ProcessLease(NODE, A, 1, 2, NOW + 10_000 + TTL_MS))
    assert memory.keys == [lease_key(NODE, 1), lease_key(NODE, 2)]
    assert await store.load() == outcome.lease


@pytest.mark.parametrize("now_ms", [NOW, NOW + 10 * TTL_MS])
async def test_another_owner_is_held_whatever_its_expiry_says(
    memory: MemoryStore, clock: FakeClock, now_ms: int
) -> None:
    await write(memory, rec(A, 1, 1))
    outcome = await leases(memory, clock).try_acquire(B, now_ms)
    assert outcome == Held(rec(A, 1, 1))
    assert memory.keys == [lease_key(NODE, 1)]


async def test_a_lost_create_race_reads_the_winner(memory: MemoryStore, clock: FakeClock) -> None:
    faulty = FaultyStore(memory)
    first, second = await asyncio.gather(
        leases(faulty, clock).try_acquire(A, NOW), leases(faulty, clock).try_acquire(B, NOW)
    )
    assert [op for op, _ in faulty.calls].count("put") == 2  # both tried seq 1
    assert first == Acquired(rec(A, 1, 1))
    assert second == Held(rec(A, 1, 1))


async def test_a_lost_race_to_our_own_incarnation_is_acquired(
    memory: MemoryStore, clock: FakeClock
) -> None:
    first, second = await asyncio.gather(
        leases(memory, clock).try_acquire(A, NOW), leases(memory, clock).try_acquire(A, NOW + 1)
    )
    assert first == second == Acquired(rec(A, 1, 1))


async def test_a_refused_create_with_no_readable_winner_is_io(
    memory: MemoryStore, clock: FakeClock
) -> None:
    faulty = FaultyStore(memory)
    faulty.fail("put", error=lambda key: PreconditionFailed(key, "409 ConditionalRequestConflict"))
    with pytest.raises(ProcessLeaseIO, match="winner was not readable"):
        await leases(faulty, clock).try_acquire(A, NOW)


async def test_a_failed_write_is_io_and_a_lost_answer_is_reconciled_by_the_next_renewal(
    memory: MemoryStore, clock: FakeClock
) -> None:
    faulty = FaultyStore(memory)
    store = leases(faulty, clock)
    faulty.fail("put")
    with pytest.raises(ProcessLeaseIO, match="503"):
        await store.try_acquire(A, NOW)
    faulty.lose_answer("put")
    with pytest.raises(ProcessLeaseIO):
        await store.try_acquire(A, NOW)
    assert await store.try_acquire(A, NOW) == Acquired(rec(A, 1, 2))


async def test_an_exhausted_sequence_is_invalid(memory: MemoryStore, clock: FakeClock) -> None:
    await write(memory, ProcessLease(NODE, A, 1, MAX_U64, NOW))
    with pytest.raises(ProcessLeaseInvalid, match="sequence exhausted"):
        await leases(memory, clock).try_acquire(A, NOW)


# --- load --------------------------------------------------------------------------------------


async def test_load_starts_over_when_the_head_moves_under_it(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(A, 1, 2))
    faulty = FaultyStore(memory)
    faulty.fail("get", key=lease_key(NODE, 2), error=NotFound, times=2)
    assert await leases(faulty, clock).load() == rec(A, 1, 2)
    assert [op for op, _ in faulty.calls].count("list") == 3


async def test_load_gives_up_after_the_bounded_attempts(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    faulty = FaultyStore(memory)
    faulty.fail("get", error=NotFound, times=3)
    with pytest.raises(ProcessLeaseIO, match="changed during 3 read attempts"):
        await leases(faulty, clock).load()


def _stored(data: bytes) -> StoredObject:
    return StoredObject("", data, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key_seq", "body", "why"),
    [
        (2, rec(A, 1, 2).encode().replace(b",", b", "), "canonical body"),
        (2, rec(A, 1, 2).encode() + b" " * 300, "bytes"),
        (2, b"", "is 0 bytes"),
        (2, rec(A, 1, 2, node=8).encode(), "lives under node 7"),
        (2, rec(A, 1, 3).encode(), "does not match its object name"),
        (2, b"not json", "not valid JSON"),
    ],
)
async def test_invalid_head_records_are_rejected_never_repaired(
    memory: MemoryStore, clock: FakeClock, key_seq: int, body: bytes, why: str
) -> None:
    await write(memory, rec(A, 1, 1))
    await memory.put(lease_key(NODE, key_seq), body)
    store = leases(memory, clock)
    with pytest.raises(ProcessLeaseInvalid, match=why):
        await store.load()
    with pytest.raises(ProcessLeaseInvalid, match=why):
        await store.try_acquire(A, NOW)
    assert (await memory.get(lease_key(NODE, key_seq))).data == body


async def test_a_transient_list_failure_is_io_and_starts_no_prune(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    faulty = FaultyStore(memory)
    faulty.fail("list")
    store = leases(faulty, clock, SMALL)
    with pytest.raises(ProcessLeaseIO, match="listing the history"):
        await store.load()
    await store.wait_prune()
    assert [op for op, _ in faulty.calls] == ["list"]
    assert store.healthy


async def test_an_invalid_inventory_starts_a_repair_prune(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1))
    await memory.put(lease_prefix(NODE) + "stray", b"x")
    faulty = FaultyStore(memory)
    store = leases(faulty, clock, SMALL)
    with pytest.raises(ProcessLeaseInvalid, match="20-digit"):
        await store.load()
    await store.wait_prune()
    assert [op for op, _ in faulty.calls] == ["list", "list"]  # the load, then the prune
    assert not store.healthy  # the prune met the same stray key and failed closed


async def test_history_beyond_the_list_bound_is_invalid_until_pruned(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, seq) for seq in range(1, SMALL.max_list_records + 2)))
    store = leases(memory, clock, SMALL)
    with pytest.raises(ProcessLeaseInvalid, match="exceeds the fixed 20-record scan bound"):
        await store.load()
    await store.wait_prune()
    assert store.healthy
    assert len(memory.keys) == SMALL.history_to_retain
    assert await store.try_acquire(A, NOW) == Acquired(rec(A, 1, 22))


async def test_exactly_the_list_bound_is_still_readable(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, *(rec(A, 1, seq) for seq in range(1, SMALL.max_list_records + 1)))
    assert await leases(memory, clock, SMALL).load() == rec(A, 1, 20)


# --- takeover ----------------------------------------------------------------------------------


async def test_takeover_before_a_full_ttl_is_held_and_reads_nothing(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    faulty = FaultyStore(memory)
    store = leases(faulty, clock)
    observation = store.observe_rival(rec(A, 1, 3))
    clock.advance(TTL_MS / 1000 - 0.001)
    assert await store.try_takeover(B, observation, NOW) == Held(rec(A, 1, 3))
    assert faulty.calls == []


async def test_takeover_after_a_full_unchanged_ttl_appends_term_and_seq_and_seals_the_fence(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(A, 1, 2), rec(A, 1, 3))
    store = leases(memory, clock)
    observation = store.observe_rival(rec(A, 1, 3))
    clock.advance(TTL_MS / 1000)
    outcome = await store.try_takeover(B, observation, NOW + 5)
    successor = ProcessLease(NODE, B, 2, 4, NOW + 5 + TTL_MS)
    assert outcome == Acquired(successor)
    fence = ProcessLeaseFence(rec(A, 1, 3), successor)
    assert (await memory.get(fence_key(NODE, A))).data == fence.encode()
    assert (await memory.get(successor_fence_key(NODE, B, 2))).data == fence.encode()
    assert await store.find_takeover_from(A) == fence


async def test_takeover_of_a_head_that_changed_is_held_by_the_new_head(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    store = leases(memory, clock)
    observation = store.observe_rival(rec(A, 1, 3))
    await write(memory, rec(A, 1, 4))  # the holder renewed during the observation
    clock.advance(TTL_MS / 1000)
    assert await store.try_takeover(B, observation, NOW) == Held(rec(A, 1, 4))
    assert lease_key(NODE, 5) not in memory.keys


async def test_takeover_of_a_head_that_disappeared_is_invalid(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    store = leases(memory, clock)
    observation = store.observe_rival(rec(A, 1, 3))
    await memory.delete(lease_key(NODE, 3))
    clock.advance(TTL_MS / 1000)
    with pytest.raises(ProcessLeaseInvalid, match="disappeared"):
        await store.try_takeover(B, observation, NOW)


async def test_two_takeovers_race_and_the_loser_reads_the_winner(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    first, second = leases(memory, clock), leases(memory, clock)
    seen_first, seen_second = first.observe_rival(rec(A, 1, 3)), second.observe_rival(rec(A, 1, 3))
    clock.advance(TTL_MS / 1000)
    won, lost = await asyncio.gather(
        first.try_takeover(B, seen_first, NOW), second.try_takeover(C, seen_second, NOW)
    )
    assert won == Acquired(ProcessLease(NODE, B, 2, 4, NOW + TTL_MS))
    assert lost == Held(won.lease)


def test_observing_another_nodes_record_is_invalid(clock: FakeClock) -> None:
    with pytest.raises(ProcessLeaseInvalid, match="lives under node 7"):
        leases(MemoryStore(), clock).observe_rival(rec(A, 1, 1, node=8))


# --- sealing -----------------------------------------------------------------------------------


def _takeover_fence() -> ProcessLeaseFence:
    return ProcessLeaseFence(rec(A, 1, 3), ProcessLease(NODE, B, 2, 4, NOW + TTL_MS))


async def _take_over(store: ProcessLeaseStore, clock: FakeClock) -> None:
    observation = store.observe_rival(rec(A, 1, 3))
    clock.advance(TTL_MS / 1000)
    await store.try_takeover(B, observation, NOW)


async def test_a_conflicting_certificate_at_the_index_is_invalid(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    other = ProcessLeaseFence(rec(A, 1, 3), ProcessLease(NODE, C, 2, 4, NOW))
    await memory.put(fence_key(NODE, A), other.encode())
    with pytest.raises(ProcessLeaseInvalid, match="conflicting takeover evidence"):
        await _take_over(leases(memory, clock), clock)


async def test_a_lost_answer_on_a_fence_write_is_reconciled_by_reading_back(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    faulty = FaultyStore(memory)
    faulty.lose_answer("put", key=fence_key(NODE, A))
    await _take_over(leases(faulty, clock), clock)
    assert (await memory.get(fence_key(NODE, A))).data == _takeover_fence().encode()
    assert (await memory.get(successor_fence_key(NODE, B, 2))).data == _takeover_fence().encode()


async def test_a_fence_write_that_is_not_visible_is_io(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    faulty = FaultyStore(memory)
    faulty.fail("put", key=successor_fence_key(NODE, B, 2))
    with pytest.raises(ProcessLeaseIO, match="not durably visible"):
        await _take_over(leases(faulty, clock), clock)


async def test_a_failed_fence_write_and_a_failed_read_back_report_both(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    faulty = FaultyStore(memory)
    faulty.fail("put", key=fence_key(NODE, A))
    faulty.fail("get", key=fence_key(NODE, A))
    with pytest.raises(ProcessLeaseIO, match=r"fence write failed .*reconciliation failed"):
        await _take_over(leases(faulty, clock), clock)


async def test_noncanonical_or_misfiled_certificates_are_invalid(
    memory: MemoryStore, clock: FakeClock
) -> None:
    store = leases(memory, clock)
    fence = _takeover_fence()
    await memory.put(fence_key(NODE, A), fence.encode().replace(b",", b", "))
    with pytest.raises(ProcessLeaseInvalid, match="canonical body"):
        await store.load_fence(A)
    await memory.put(fence_key(NODE, C), fence.encode())
    with pytest.raises(ProcessLeaseInvalid, match="wrong identity"):
        await store.load_fence(C)
    await memory.put(successor_fence_key(NODE, B, 3), fence.encode())
    with pytest.raises(ProcessLeaseInvalid, match="wrong identity"):
        await store.load_successor_fence(B, 3)


# --- find_takeover_from ------------------------------------------------------------------------


async def test_find_takeover_scans_the_history_when_the_index_is_missing_and_seals_it(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(A, 1, 2), rec(B, 2, 3), rec(B, 2, 4))
    store = leases(memory, clock)
    fence = ProcessLeaseFence(rec(A, 1, 2), rec(B, 2, 3))
    assert await store.find_takeover_from(A) == fence
    assert (await memory.get(fence_key(NODE, A))).data == fence.encode()
    assert (await memory.get(successor_fence_key(NODE, B, 2))).data == fence.encode()
    assert await store.find_takeover_from(B) is None
    assert await store.find_takeover_from(C) is None


async def test_an_owner_in_two_transitions_is_invalid(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(B, 2, 2), rec(A, 3, 3), rec(C, 4, 4))
    with pytest.raises(ProcessLeaseInvalid, match="more than one durable takeover transition"):
        await leases(memory, clock).find_takeover_from(A)


async def test_a_term_jump_by_two_is_no_takeover_evidence(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(A, 1, 2), rec(B, 3, 3))
    store = leases(memory, clock)
    assert await store.find_takeover_from(A) is None
    with pytest.raises(ProcessLeaseInvalid, match="noncanonical term transition"):
        await store.ensure_current_term_fence(rec(B, 3, 3))
    with pytest.raises(ProcessLeaseInvalid, match="noncanonical term transition"):
        await store.try_acquire(B, NOW)


class _PruneBetweenIndexAndScan(FaultyStore):
    """Runs ``hook`` once, right after the first read of ``key`` -- a concurrent pruner that
    seals the index and deletes the history pair between our point read and our scan."""

    def __init__(self, inner: ObjectStore, key: str, hook: ProcessLeaseStore) -> None:
        super().__init__(inner)
        self.key = key
        self.pruner: ProcessLeaseStore | None = hook

    async def get(self, key: str) -> StoredObject:
        try:
            return await super().get(key)
        finally:
            if key == self.key and self.pruner is not None:
                pruner, self.pruner = self.pruner, None
                await pruner.prune_history()


async def test_a_concurrent_pruner_sealing_before_the_scan_is_found_in_the_index(
    memory: MemoryStore, clock: FakeClock
) -> None:
    history = [rec(A, 1, 1), rec(A, 1, 2), rec(B, 2, 3)] + [rec(B, 2, s) for s in range(4, 9)]
    await write(memory, *history)
    pruner = leases(memory, clock, SMALL)
    store = leases(_PruneBetweenIndexAndScan(memory, fence_key(NODE, A), pruner), clock, SMALL)
    fence = await store.find_takeover_from(A)
    assert fence == ProcessLeaseFence(rec(A, 1, 2), rec(B, 2, 3))
    assert lease_key(NODE, 2) not in memory.keys  # the scan could not have found it


# --- ensure_current_term_fence -----------------------------------------------------------------


async def test_term_one_needs_no_evidence(memory: MemoryStore, clock: FakeClock) -> None:
    faulty = FaultyStore(memory)
    await leases(faulty, clock).ensure_current_term_fence(rec(A, 1, 9))
    assert faulty.calls == []


async def test_a_sealed_successor_index_proves_the_term(
    memory: MemoryStore, clock: FakeClock
) -> None:
    fence = ProcessLeaseFence(rec(A, 1, 2), rec(B, 2, 3))
    await memory.put(successor_fence_key(NODE, B, 2), fence.encode())
    await leases(memory, clock).ensure_current_term_fence(rec(B, 2, 5))
    with pytest.raises(ProcessLeaseInvalid, match="starts after the current lease head"):
        await leases(memory, clock).ensure_current_term_fence(rec(B, 2, 2))


async def test_a_term_with_only_history_evidence_is_sealed_from_it(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(B, 2, 2), rec(B, 2, 3))
    await leases(memory, clock).ensure_current_term_fence(rec(B, 2, 3))
    fence = ProcessLeaseFence(rec(A, 1, 1), rec(B, 2, 2))
    assert (await memory.get(successor_fence_key(NODE, B, 2))).data == fence.encode()


async def test_a_term_without_evidence_fails_closed_and_is_not_renewed(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(B, 2, 2))
    with pytest.raises(ProcessLeaseInvalid, match="no durable takeover evidence"):
        await leases(memory, clock).try_acquire(B, NOW)
    assert memory.keys == [lease_key(NODE, 2)]


async def test_fences_are_listed_oldest_first(memory: MemoryStore, clock: FakeClock) -> None:
    await write(memory, rec(A, 1, 1), rec(B, 2, 2), rec(C, 3, 3))
    store = leases(memory, clock)
    assert await store.list_fences() == []
    await store.find_takeover_from(B)
    await store.find_takeover_from(A)
    assert await store.list_fences() == [
        ProcessLeaseFence(rec(A, 1, 1), rec(B, 2, 2)),
        ProcessLeaseFence(rec(B, 2, 2), rec(C, 3, 3)),
    ]


async def test_a_history_read_starts_over_when_a_record_vanishes_and_gives_up_after_the_bound(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 1), rec(A, 1, 2), rec(B, 2, 3))
    faulty = FaultyStore(memory)
    faulty.fail("get", key=lease_key(NODE, 1), error=NotFound, times=2)  # a pruner at work
    store = leases(faulty, clock)
    assert await store.find_takeover_from(A) == ProcessLeaseFence(rec(A, 1, 2), rec(B, 2, 3))
    assert [op for op, _ in faulty.calls].count("list") == 3
    faulty.fail("get", key=lease_key(NODE, 1), error=NotFound, times=3)
    with pytest.raises(ProcessLeaseIO, match="history of node 7 changed during 3 read attempts"):
        await store.read_history()


async def test_a_proven_term_is_remembered_so_renewals_read_only_the_head(
    memory: MemoryStore, clock: FakeClock
) -> None:
    await write(memory, rec(A, 1, 3))
    faulty = FaultyStore(memory)
    store = leases(faulty, clock)
    await _take_over(store, clock)
    await store.wait_prune()  # the prune every takeover starts
    faulty.calls.clear()
    assert await store.try_acquire(B, NOW) == Acquired(ProcessLease(NODE, B, 2, 5, NOW + TTL_MS))
    assert [op for op, _ in faulty.calls] == ["list", "get", "put"]
    fresh = leases(faulty, clock)  # a restarted process proves the term once from the index
    faulty.calls.clear()
    await fresh.try_acquire(B, NOW)
    assert ("get", successor_fence_key(NODE, B, 2)) in faulty.calls
