"""A held BucketLease: renewal (with If-Match, the reconcile path after a lost answer, loss
after a takeover), the write fence on both clocks, and release."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import (
    EXIT_LEASE_LOST,
    FenceClosed,
    LeaseHeld,
    LeaseLost,
    StoreError,
)
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease, release_own_record
from mushroom_backup.lease.fenced import Fence, FencedStore
from mushroom_backup.lease.record import (
    Exclusion,
    LeaseRecord,
    decode_record,
    format_rfc3339,
    new_instance_id,
)
from mushroom_backup.store.base import CREATE, OVERWRITE, ObjectStore, Version
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore


def fields(log: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in log.records if r.getMessage() == event]


async def stored(store: ObjectStore) -> LeaseRecord:
    return decode_record((await store.get(LEASE_KEY)).data)


async def take(store: ObjectStore, clock: FakeClock, ttl_s: int = 30) -> BucketLease:
    return await BucketLease.acquire(store, ttl_s=ttl_s, clock=clock)


# --- renewal -------------------------------------------------------------------------------


async def test_a_renewal_swaps_a_new_stamp_in_with_if_match(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    first = await stored(bucket)
    clock.advance(10)
    bucket.calls.clear()
    await lease.renew()
    assert bucket.calls == [("put", "LEASE")]
    now = await stored(bucket)
    assert now.renewed_at == "2026-11-29T10:00:10Z"
    assert now.acquired_at == first.acquired_at == "2026-11-29T10:00:00Z"
    assert (now.instance_id, now.ttl_s, now.host, now.pid) == (
        first.instance_id,
        first.ttl_s,
        first.host,
        first.pid,
    )
    assert lease.version == (await bucket.get(LEASE_KEY)).version
    assert lease.record == now


async def test_every_renewal_writes_a_new_body_even_within_one_clock_tick(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    bodies = [(await bucket.get(LEASE_KEY)).data]
    for _ in range(3):
        await lease.renew()  # the fake clock does not move
        bodies.append((await bucket.get(LEASE_KEY)).data)
    assert len(set(bodies)) == 4
    stamps = [decode_record(b).renewed_at for b in bodies]
    assert stamps == [
        "2026-11-29T10:00:00Z",
        "2026-11-29T10:00:00.000001Z",
        "2026-11-29T10:00:00.000002Z",
        "2026-11-29T10:00:00.000003Z",
    ]


@pytest.mark.parametrize(
    ("step_back", "renewed_at"),
    [
        # Back by less than a TTL: a microsecond after the last stamp (never suspect to others).
        (timedelta(seconds=5), "2026-11-29T10:00:10.000001Z"),
        (timedelta(seconds=30), "2026-11-29T10:00:10.000001Z"),
        # Back by more: the stamp follows the clock.
        (timedelta(seconds=31), "2026-11-29T09:59:39Z"),
        (timedelta(hours=1), "2026-11-29T09:00:10Z"),
    ],
)
async def test_a_renewal_after_the_wall_clock_stepped_back_still_changes_the_body(
    bucket: FaultyStore, clock: FakeClock, step_back: timedelta, renewed_at: str
) -> None:
    lease = await take(bucket, clock)
    clock.advance(10)
    await lease.renew()
    clock.step_wall(-step_back)
    await lease.renew()
    assert (await stored(bucket)).renewed_at == renewed_at


async def test_a_renewal_after_a_takeover_is_lost_for_good_naming_the_new_holder(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    holder = await take(bucket, clock)
    clock.advance(30)  # the holder was partitioned for a whole TTL
    successor = await take(bucket, clock)
    with pytest.raises(LeaseLost) as raised:
        await holder.renew()
    assert raised.value.instance_id == successor.instance_id
    assert successor.instance_id in raised.value.message
    assert raised.value.exit_code == EXIT_LEASE_LOST
    assert holder.lost
    assert holder.write_deadline() is None
    assert fields(lease_log, "lease.lost")[0]["holder"] == successor.instance_id
    # Lost is final: even once the successor has gone, nothing is written.
    await successor.release()
    bucket.calls.clear()
    with pytest.raises(LeaseLost) as again:
        await holder.renew()
    assert again.value.instance_id == successor.instance_id
    assert bucket.calls == []
    assert bucket.inner.keys == []  # type: ignore[attr-defined]


async def test_a_deleted_lease_is_lost(bucket: FaultyStore, clock: FakeClock) -> None:
    lease = await take(bucket, clock)
    await bucket.delete(LEASE_KEY)  # `lease release --force` by an operator
    with pytest.raises(LeaseLost) as raised:
        await lease.renew()
    assert raised.value.instance_id is None
    assert raised.value.message == "the bucket lease was lost"
    assert bucket.inner.keys == []  # type: ignore[attr-defined]


async def test_a_lease_replaced_by_garbage_is_lost(bucket: FaultyStore, clock: FakeClock) -> None:
    lease = await take(bucket, clock)
    await bucket.put(LEASE_KEY, b"junk", OVERWRITE)
    with pytest.raises(LeaseLost):
        await lease.renew()
    assert (await bucket.get(LEASE_KEY)).data == b"junk"


async def test_a_transient_failure_is_a_store_error_and_not_a_loss(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    bucket.fail("put")
    clock.advance(10)
    with pytest.raises(StoreError) as raised:
        await lease.renew()
    assert raised.value.retryable
    assert not lease.lost
    assert lease.write_deadline() == pytest.approx(1020.0)  # the fence still counts from 0 s
    clock.advance(1)
    await lease.renew()
    assert lease.write_deadline() == pytest.approx(1031.0)


async def test_a_lost_renewal_answer_is_reconciled_by_reading(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    lease = await take(bucket, clock)
    acquired_version = lease.version
    clock.advance(10)
    bucket.lose_answer("put")
    with pytest.raises(StoreError):
        await lease.renew()  # it landed, but we never heard
    landed = await bucket.get(LEASE_KEY)
    assert decode_record(landed.data).renewed_at == "2026-11-29T10:00:10Z"
    assert lease.version == acquired_version
    assert lease.write_deadline() == pytest.approx(1020.0)  # not confirmed: no credit taken

    clock.advance(1)
    bucket.calls.clear()
    await lease.renew()  # If-Match refused -> read: still ours -> swap again
    assert bucket.calls == [("put", "LEASE"), ("get", "LEASE"), ("put", "LEASE")]
    now = await bucket.get(LEASE_KEY)
    assert now.version == lease.version != landed.version
    assert decode_record(now.data).renewed_at == "2026-11-29T10:00:11Z"
    assert not lease.lost
    assert lease.write_deadline() == pytest.approx(1031.0)
    assert fields(lease_log, "lease.reconciled")[0]["found"] == str(landed.version)


async def test_a_reconcile_within_one_clock_tick_still_changes_the_body(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    bucket.lose_answer("put")
    with pytest.raises(StoreError):
        await lease.renew()
    landed = (await bucket.get(LEASE_KEY)).data
    await lease.renew()  # same fake instant: the landed body carries the very same stamp
    assert (await bucket.get(LEASE_KEY)).data != landed


async def test_a_reconcile_that_finds_a_successor_is_a_loss(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    other = LeaseRecord("successor", "2026-11-29T10:00:40Z", "2026-11-29T10:00:40Z", 30)
    await bucket.put(LEASE_KEY, other.encode(), OVERWRITE)
    bucket.calls.clear()
    with pytest.raises(LeaseLost) as raised:
        await lease.renew()
    assert raised.value.instance_id == "successor"
    assert bucket.calls == [("put", "LEASE"), ("get", "LEASE")]
    assert await stored(bucket) == other


async def test_a_reconcile_that_loses_the_second_swap_is_a_loss(clock: FakeClock) -> None:
    class Successor(FaultyStore):
        """Takes the lease over just after our reconcile read it."""

        async def get(self, key: str) -> Any:
            found = await super().get(key)
            if self.calls.count(("get", key)) == 2:  # acquire's read, then the reconcile's
                body = LeaseRecord("successor", "x", "2026-11-29T10:00:00Z", 30).encode()
                await self.inner.put(key, body, OVERWRITE)
            return found

    store = Successor(MemoryStore())
    lease = await take(store, clock)
    # Our last renewal's answer was lost: the object is ours, at a version we do not know.
    await store.inner.put(LEASE_KEY, (await store.inner.get(LEASE_KEY)).data, OVERWRITE)
    with pytest.raises(LeaseLost) as raised:
        await lease.renew()
    assert raised.value.instance_id == "successor"
    assert lease.lost


async def test_a_renewal_in_best_effort_mode_reads_then_writes(clock: FakeClock) -> None:
    store = FaultyStore(MemoryStore(conditional=False))
    lease = await take(store, clock)
    assert lease.exclusion is Exclusion.BEST_EFFORT
    clock.advance(10)
    store.calls.clear()
    await lease.renew()
    assert store.calls == [("get", "LEASE"), ("put", "LEASE")]
    assert (await stored(store)).renewed_at == "2026-11-29T10:00:10Z"
    # A takeover (the later writer) is noticed at the next renewal.
    await store.put(
        LEASE_KEY, LeaseRecord("other", "a", "2026-11-29T10:00:15Z", 30).encode(), OVERWRITE
    )
    with pytest.raises(LeaseLost) as raised:
        await lease.renew()
    assert raised.value.instance_id == "other"
    assert (await stored(store)).instance_id == "other"


async def test_a_client_that_turns_conditional_writes_off_degrades_loudly(
    clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    inner = MemoryStore()
    lease = await take(inner, clock)
    inner.conditional = False
    await lease.renew()
    assert lease.exclusion is Exclusion.BEST_EFFORT
    assert fields(lease_log, "lease.best_effort")
    assert not lease.lost


# --- the write fence -----------------------------------------------------------------------


async def test_the_fence_closes_at_exactly_two_thirds_of_a_ttl(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    assert lease.write_deadline() == pytest.approx(1020.0)
    clock.advance(19.999)
    assert lease.may_write()
    clock.advance(0.001)
    assert lease.write_deadline() is None
    assert not lease.may_write()
    assert not lease.lost  # closed, not lost: a renewal reopens it
    await lease.renew()
    assert lease.write_deadline() == pytest.approx(1040.0)


async def test_the_fence_counts_from_when_the_renewal_was_sent(clock: FakeClock) -> None:
    class Slow(FaultyStore):
        async def put(self, key: str, data: bytes, mode: Any = OVERWRITE) -> Version:
            clock.advance(5)  # the answer takes 5 s to come back
            return await super().put(key, data, mode)

    store = Slow(MemoryStore())
    lease = await take(store, clock)  # create + two probes: 15 s pass
    assert clock.monotonic() == 1015.0
    assert lease.write_deadline() == pytest.approx(1020.0)
    await lease.renew()  # sent at 1015, confirmed at 1020
    assert lease.write_deadline() == pytest.approx(1035.0)


async def test_a_wall_clock_stepping_back_leaves_the_monotonic_clock_to_decide(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    clock.step_wall(-timedelta(hours=1))
    assert lease.write_deadline() == pytest.approx(1020.0)
    clock.advance(19.999)
    assert lease.may_write()
    clock.advance(0.001)
    assert not lease.may_write()


async def test_a_wall_clock_jumping_ahead_closes_the_fence(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    clock.step_wall(timedelta(seconds=5))  # e.g. the VM was suspended; monotonic time stood
    assert lease.write_deadline() == pytest.approx(1015.0)
    clock.step_wall(timedelta(seconds=15))
    assert lease.write_deadline() is None
    assert not lease.lost


@pytest.mark.parametrize(
    ("skew_s", "takeover_at", "holder_fenced"),
    [
        (0.0, 30.0, True),
        (5.0, 25.0, True),
        # A contender whose clock runs ahead by a third of a TTL takes over exactly as the
        # holder's fence closes...
        (10.0, 20.0, True),
        # ...and one further ahead could take over while the holder may still write.
        (11.0, 19.0, False),
    ],
)
async def test_clock_skew_up_to_a_third_of_a_ttl_is_absorbed(
    skew_s: float, takeover_at: float, holder_fenced: bool
) -> None:
    bucket = MemoryStore()
    holder_clock = FakeClock()
    contender_clock = FakeClock(wall=holder_clock.wall() + timedelta(seconds=skew_s))
    holder = await BucketLease.acquire(bucket, ttl_s=30, clock=holder_clock)

    def advance(seconds: float) -> None:
        holder_clock.advance(seconds)
        contender_clock.advance(seconds)

    advance(takeover_at - 0.001)
    with pytest.raises(LeaseHeld):
        await BucketLease.acquire(bucket, ttl_s=30, clock=contender_clock)
    advance(0.001)
    await BucketLease.acquire(bucket, ttl_s=30, clock=contender_clock)
    assert holder.may_write() is not holder_fenced


async def test_mark_lost_closes_the_fence_for_good(bucket: FaultyStore, clock: FakeClock) -> None:
    lease = await take(bucket, clock)
    lease.mark_lost("writer-b")
    assert lease.lost
    assert lease.write_deadline() is None
    with pytest.raises(LeaseLost) as raised:
        await lease.renew()
    assert raised.value.instance_id == "writer-b"


async def test_the_lease_is_the_fence_of_a_fenced_store(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    fence: Fence = lease
    data = FencedStore(MemoryStore(), fence, clock)
    await data.put("data/a", b"1", CREATE)
    clock.advance(20)
    with pytest.raises(FenceClosed):
        await data.put("data/b", b"2", CREATE)


# --- release -------------------------------------------------------------------------------


async def test_release_is_one_conditional_delete(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    lease = await take(bucket, clock)
    bucket.calls.clear()
    await lease.release()
    assert bucket.calls == [("delete", "LEASE")]
    assert bucket.inner.keys == []  # type: ignore[attr-defined]
    assert lease.lost
    assert lease.write_deadline() is None
    assert fields(lease_log, "lease.released")
    with pytest.raises(LeaseLost, match="released"):
        await lease.renew()
    await lease.release()  # twice is harmless
    assert bucket.calls == [("delete", "LEASE")]


async def test_release_leaves_a_successors_lease_alone(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    clock.advance(30)
    successor = await take(bucket, clock)
    await lease.release()  # not marked lost yet: the conditional delete is refused
    assert (await stored(bucket)).instance_id == successor.instance_id


async def test_release_after_a_lost_renewal_answer_still_deletes_our_record(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    bucket.lose_answer("put")
    with pytest.raises(StoreError):
        await lease.renew()
    bucket.calls.clear()
    await lease.release()
    assert bucket.calls == [("delete", "LEASE"), ("get", "LEASE"), ("delete", "LEASE")]
    assert bucket.inner.keys == []  # type: ignore[attr-defined]


async def test_a_lost_lease_is_not_released(bucket: FaultyStore, clock: FakeClock) -> None:
    lease = await take(bucket, clock)
    lease.mark_lost()
    bucket.calls.clear()
    await lease.release()
    assert bucket.calls == []
    assert bucket.inner.keys == ["LEASE"]  # type: ignore[attr-defined]


async def test_release_reads_then_deletes_where_conditional_delete_is_ignored(
    clock: FakeClock,
) -> None:
    inner = MemoryStore()
    inner.conditional_delete = False  # e.g. MinIO
    store = FaultyStore(inner)
    lease = await take(store, clock)
    store.calls.clear()
    await lease.release()
    assert store.calls == [("get", "LEASE"), ("delete", "LEASE")]
    assert inner.keys == []


async def test_release_in_best_effort_mode_reads_then_deletes_only_our_own(
    clock: FakeClock,
) -> None:
    store = FaultyStore(MemoryStore(conditional=False))
    lease = await take(store, clock)
    await store.put(LEASE_KEY, LeaseRecord("other", "a", "b", 30).encode(), OVERWRITE)
    store.calls.clear()
    await lease.release()
    assert store.calls == [("get", "LEASE")]
    assert (await stored(store)).instance_id == "other"


async def test_a_failed_release_closes_the_fence_and_raises(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    bucket.fail("delete")
    with pytest.raises(StoreError):
        await lease.release()
    assert lease.write_deadline() is None
    assert bucket.inner.keys == ["LEASE"]  # type: ignore[attr-defined]  # expires by its TTL


@pytest.mark.parametrize("conditional_delete", [True, False])
async def test_release_own_record_deletes_only_a_record_naming_us(
    clock: FakeClock, conditional_delete: bool
) -> None:
    store = MemoryStore()
    store.conditional_delete = conditional_delete
    me = new_instance_id()
    assert not await release_own_record(store, me)  # nothing there
    body = LeaseRecord("other", "a", format_rfc3339(clock.wall()), 30).encode()
    await store.put(LEASE_KEY, body, OVERWRITE)
    assert not await release_own_record(store, me)
    assert store.keys == ["LEASE"]
    await store.delete(LEASE_KEY)
    await BucketLease.acquire(store, instance_id=me, clock=clock)
    assert await release_own_record(store, me)
    assert store.keys == []
