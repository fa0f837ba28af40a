"""BucketLease.acquire on an in-memory bucket with a fake clock: fresh, stale, suspect, own and
unparseable records; lost answers; lost races; the probe; best-effort mode."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import timedelta
from typing import Any

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import (
    EXIT_LEASE_HELD,
    LeaseHeld,
    PreconditionsIgnored,
    StoreError,
    UsageError,
)
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease, read_lease
from mushroom_backup.lease.record import (
    Exclusion,
    LeaseCondition,
    LeaseRecord,
    LeaseWatch,
    decode_record,
    describe,
    format_rfc3339,
    new_instance_id,
)
from mushroom_backup.store.base import (
    OVERWRITE,
    Create,
    ObjectStore,
    Overwrite,
    PutMode,
    Update,
    Version,
)
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

RUST_BYTES = (
    b'{"instance_id":"abc","acquired_at":"2026-11-29T10:00:00Z",'
    b'"renewed_at":"2026-11-29T10:00:00.5Z","ttl_s":30}'
)


def fields(log: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in log.records if r.getMessage() == event]


def levels(log: pytest.LogCaptureFixture, event: str) -> set[int]:
    return {r.levelno for r in log.records if r.getMessage() == event}


async def put_record(
    store: ObjectStore, instance_id: str, renewed: str, ttl_s: int = 30
) -> Version:
    body = LeaseRecord(instance_id, renewed, renewed, ttl_s).encode()
    return await store.put(LEASE_KEY, body, OVERWRITE)


async def stored(store: ObjectStore) -> LeaseRecord:
    return decode_record((await store.get(LEASE_KEY)).data)


async def acquire(store: ObjectStore, clock: FakeClock, **kwargs: Any) -> BucketLease:
    return await BucketLease.acquire(store, clock=clock, **kwargs)


# --- the plain cases -----------------------------------------------------------------------


async def test_an_empty_prefix_is_taken_with_one_create_and_probed(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    lease = await acquire(bucket, clock, ttl_s=30, host="db1", pid=77)
    # read, create, then the probe: If-None-Match and If-Match on a made-up ETag.
    assert bucket.calls == [("get", "LEASE"), ("put", "LEASE"), ("put", "LEASE"), ("put", "LEASE")]
    assert bucket.inner.keys == ["LEASE"]  # type: ignore[attr-defined]
    assert await stored(bucket) == LeaseRecord(
        lease.instance_id, "2026-11-29T10:00:00Z", "2026-11-29T10:00:00Z", 30, "db1", 77
    )
    assert lease.exclusion is Exclusion.CONDITIONAL
    assert not lease.lost
    assert lease.ttl_s == 30
    assert lease.renew_interval == 10
    assert lease.version == (await bucket.get(LEASE_KEY)).version
    (acquired,) = fields(lease_log, "lease.acquired")
    assert acquired["instance_id"] == lease.instance_id
    assert acquired["exclusion"] == "conditional"


async def test_host_and_pid_default_to_this_process(bucket: FaultyStore, clock: FakeClock) -> None:
    await acquire(bucket, clock)
    record = await stored(bucket)
    assert (record.host, record.pid) == (socket.gethostname(), os.getpid())


async def test_an_instance_id_is_kept_and_a_new_one_is_random(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    me = new_instance_id()
    assert (await acquire(bucket, clock, instance_id=me)).instance_id == me
    other = await acquire(MemoryStore(), clock)
    assert other.instance_id != me
    assert len(other.instance_id) == 32


@pytest.mark.parametrize(("ttl", "kept"), [(0, 1), (1, 1), (3600, 3600)])
async def test_a_zero_ttl_counts_as_one_second(
    bucket: FaultyStore, clock: FakeClock, ttl: int, kept: int
) -> None:
    lease = await acquire(bucket, clock, ttl_s=ttl)
    assert lease.ttl_s == kept
    assert (await stored(bucket)).ttl_s == kept


@pytest.mark.parametrize("ttl", [-1, 3601, 2**64 - 1])
async def test_a_ttl_others_would_find_suspect_is_refused(
    bucket: FaultyStore, clock: FakeClock, ttl: int
) -> None:
    with pytest.raises(UsageError, match="1 to 3600 seconds"):
        await acquire(bucket, clock, ttl_s=ttl)
    assert bucket.calls == []


async def test_a_store_failure_is_a_store_error_and_writes_nothing(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    bucket.fail("get")
    with pytest.raises(StoreError) as raised:
        await acquire(bucket, clock)
    assert raised.value.retryable
    assert bucket.calls == [("get", "LEASE")]


# --- foreign records -----------------------------------------------------------------------


async def test_a_fresh_rust_lease_blocks_until_its_own_ttl_has_passed(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    await bucket.inner.put(LEASE_KEY, RUST_BYTES, OVERWRITE)
    # Our TTL is shorter; the holder's governs. Renewed at 10:00:00.5, so fresh until 10:00:30.5.
    for at in (0.0, 10.0, 30.0, 30.499):
        clock.advance(at - (clock.monotonic() - 1000.0))
        with pytest.raises(LeaseHeld) as raised:
            await acquire(bucket, clock, ttl_s=10)
        assert raised.value.instance_id == "abc"
        assert raised.value.exit_code == EXIT_LEASE_HELD
        assert "(abc)" in raised.value.message
        assert ("put", "LEASE") not in bucket.calls
    clock.advance(0.001)
    lease = await acquire(bucket, clock, ttl_s=10)
    assert (await stored(bucket)).instance_id == lease.instance_id
    (took,) = fields(lease_log, "lease.stale_takeover")
    assert took["holder"] == "abc"
    assert fields(lease_log, "lease.acquired")[0]["taken_from"] == "abc"


async def test_a_stale_lease_is_swapped_against_the_version_read(
    clock: FakeClock,
) -> None:
    sent: list[PutMode] = []

    class Recording(FaultyStore):
        async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
            sent.append(mode)
            return await super().put(key, data, mode)

    store = Recording(MemoryStore())
    old = await put_record(store, "gone", "2026-11-29T09:00:00Z")
    sent.clear()
    await acquire(store, clock)
    assert sent[0] == Update(old)
    assert isinstance(sent[1], Create)  # the probe


async def test_a_lease_with_a_garbage_stamp_is_taken_over_at_once(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    await put_record(bucket, "someone", "yesterday")
    lease = await acquire(bucket, clock)
    assert (await stored(bucket)).instance_id == lease.instance_id


@pytest.mark.parametrize(
    ("garbage", "why"),
    [
        (b"", "not JSON"),
        (b"hello, I edited this by hand\n", "not JSON"),
        (b'{"instance_id":"abc"}', "lacks acquired_at, renewed_at, ttl_s"),
        (RUST_BYTES.replace(b":30", b':"30"'), "ttl_s '30'"),
        (b"\x00\xff" * 10, "not UTF-8"),
        (b"[" * 50_000, "not a lease record"),
    ],
)
async def test_a_hand_edited_lease_is_taken_over_with_a_warning(
    bucket: FaultyStore,
    clock: FakeClock,
    lease_log: pytest.LogCaptureFixture,
    garbage: bytes,
    why: str,
) -> None:
    await bucket.put(LEASE_KEY, garbage, OVERWRITE)
    view = await read_lease(bucket)
    assert view is not None
    assert view.record is None
    assert view.size == len(garbage)
    assert why in (view.error or "")
    assert describe(view, clock.wall()).condition is LeaseCondition.UNPARSEABLE

    lease = await acquire(bucket, clock)
    assert (await stored(bucket)).instance_id == lease.instance_id
    (warning,) = fields(lease_log, "lease.unparseable_takeover")
    assert why in warning["error"]
    assert levels(lease_log, "lease.unparseable_takeover") == {logging.WARNING}


async def test_read_lease_finds_nothing_on_an_empty_prefix(bucket: FaultyStore) -> None:
    assert await read_lease(bucket) is None


# --- our own id ----------------------------------------------------------------------------


async def test_a_lease_naming_our_id_is_taken_back_at_once(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    me = new_instance_id()
    watch = LeaseWatch()
    first = await acquire(bucket, clock, instance_id=me, watch=watch)
    del first  # its answer "never arrived"
    clock.advance(1)
    again = await acquire(bucket, clock, instance_id=me, watch=watch)
    assert again.instance_id == me
    await again.renew()
    assert not again.lost


async def test_a_lost_acquire_answer_is_recognised_by_the_next_attempt(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    me = new_instance_id()
    bucket.lose_answer("put")
    with pytest.raises(StoreError) as raised:
        await acquire(bucket, clock, instance_id=me)
    assert raised.value.retryable
    assert (await stored(bucket)).instance_id == me  # the write landed
    with pytest.raises(LeaseHeld) as held:
        await acquire(bucket, clock)  # another instance is kept out
    assert held.value.instance_id == me
    lease = await acquire(bucket, clock, instance_id=me)  # we are not
    assert lease.instance_id == me
    assert lease.version == (await bucket.get(LEASE_KEY)).version


# --- suspect records -----------------------------------------------------------------------


async def test_a_suspect_lease_unchanged_for_a_ttl_is_taken_over(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    ahead = format_rfc3339(clock.wall() + timedelta(days=1))
    await put_record(bucket, "clock-a-day-ahead", ahead)
    watch = LeaseWatch()
    me = new_instance_id()
    for _ in range(2):
        with pytest.raises(LeaseHeld) as raised:
            await acquire(bucket, clock, instance_id=me, watch=watch)
        assert raised.value.instance_id == "clock-a-day-ahead"
        assert "suspect" in raised.value.message
        clock.advance(10)
    clock.advance(9.999)
    with pytest.raises(LeaseHeld):
        await acquire(bucket, clock, instance_id=me, watch=watch)
    clock.advance(0.001)
    lease = await acquire(bucket, clock, instance_id=me, watch=watch)
    assert lease.instance_id == me
    assert watch.seen is None
    assert len(fields(lease_log, "lease.suspect_noticed")) == 1
    (takeover,) = fields(lease_log, "lease.suspect_takeover")
    assert takeover["holder"] == "clock-a-day-ahead"
    assert levels(lease_log, "lease.suspect_takeover") == {logging.WARNING}


async def test_a_changed_suspect_lease_restarts_the_watch(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    ahead = clock.wall() + timedelta(days=1)
    await put_record(bucket, "clock-a-day-ahead", format_rfc3339(ahead))
    watch = LeaseWatch()
    with pytest.raises(LeaseHeld):
        await acquire(bucket, clock, watch=watch)
    clock.advance(20)
    # Its holder is alive: it renewed (with its clock still a day ahead).
    await put_record(bucket, "clock-a-day-ahead", format_rfc3339(ahead + timedelta(seconds=20)))
    with pytest.raises(LeaseHeld):
        await acquire(bucket, clock, watch=watch)
    clock.advance(29)
    with pytest.raises(LeaseHeld):
        await acquire(bucket, clock, watch=watch)  # 49 s since first seen, 29 s unchanged
    clock.advance(1)
    await acquire(bucket, clock, watch=watch)


async def test_a_suspect_lease_is_never_taken_over_without_a_kept_watch(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    await put_record(bucket, "far-ahead", "2027-01-01T00:00:00Z")
    for _ in range(5):
        with pytest.raises(LeaseHeld):
            await acquire(bucket, clock)
        clock.advance(31)


async def test_an_absurd_ttl_is_suspect(bucket: FaultyStore, clock: FakeClock) -> None:
    await put_record(bucket, "forever", format_rfc3339(clock.wall()), ttl_s=10**9)
    watch = LeaseWatch()
    with pytest.raises(LeaseHeld):
        await acquire(bucket, clock, watch=watch)
    clock.advance(30)
    await acquire(bucket, clock, watch=watch)


# --- races ---------------------------------------------------------------------------------


class Rival(FaultyStore):
    """Before each of our first ``wins`` conditional writes, another contender writes the lease
    (fresh or stale; with ``garbage`` an unreadable one; with ``delete`` it removes it), so our
    compare-and-swap is refused."""

    def __init__(
        self,
        inner: ObjectStore,
        clock: FakeClock,
        *,
        wins: int,
        fresh: bool,
        delete: bool = False,
        garbage: bool = False,
    ) -> None:
        super().__init__(inner)
        self.clock = clock
        self.left = wins
        self.won = 0
        self.fresh = fresh
        self.delete_instead = delete
        self.garbage = garbage

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        if self.left and not isinstance(mode, Overwrite):
            self.left -= 1
            self.won += 1
            if self.delete_instead and isinstance(mode, Update):
                await self.inner.delete(key)
            elif self.garbage:
                await self.inner.put(key, b"garbage %d" % self.won, OVERWRITE)
            else:
                when = self.clock.wall() - (timedelta(0) if self.fresh else timedelta(hours=1))
                await put_record(self.inner, f"rival-{self.won}", format_rfc3339(when))
        return await super().put(key, data, mode)


async def test_a_race_lost_to_a_fresh_winner_reports_the_winner(
    clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    store = Rival(MemoryStore(), clock, wins=1, fresh=True)
    with pytest.raises(LeaseHeld) as raised:
        await acquire(store, clock)
    assert raised.value.instance_id == "rival-1"
    assert store.calls.count(("put", "LEASE")) == 1
    assert len(fields(lease_log, "lease.race_lost")) == 1


async def test_three_lost_races_report_the_winner(
    clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    # Each rival leaves a stale record, so we keep trying -- three times, then give up.
    store = Rival(MemoryStore(), clock, wins=10, fresh=False)
    with pytest.raises(LeaseHeld) as raised:
        await acquire(store, clock)
    assert raised.value.instance_id == "rival-3"
    assert store.calls.count(("put", "LEASE")) == 3
    assert [f["race"] for f in fields(lease_log, "lease.race_lost")] == [1, 2, 3]


async def test_two_lost_races_then_a_won_one_take_the_lease(clock: FakeClock) -> None:
    store = Rival(MemoryStore(), clock, wins=2, fresh=False)
    lease = await acquire(store, clock)
    assert (await stored(store)).instance_id == lease.instance_id


async def test_a_lease_deleted_between_read_and_swap_is_a_lost_race(clock: FakeClock) -> None:
    inner = MemoryStore()
    await put_record(inner, "old", "2026-11-29T09:00:00Z")
    store = Rival(inner, clock, wins=1, fresh=False, delete=True)
    lease = await acquire(store, clock)  # the If-Match hit a missing key; then a create won
    assert (await stored(store)).instance_id == lease.instance_id


async def test_three_races_lost_to_unreadable_records_report_an_unknown_winner(
    clock: FakeClock,
) -> None:
    store = Rival(MemoryStore(), clock, wins=3, fresh=False, garbage=True)
    with pytest.raises(LeaseHeld) as raised:
        await acquire(store, clock)
    assert raised.value.instance_id == "unknown"


async def test_two_contenders_started_together_get_exactly_one_lease(clock: FakeClock) -> None:
    name = f"race-{new_instance_id()}"
    results = await asyncio.gather(
        *(acquire(MemoryStore(name), clock) for _ in range(5)), return_exceptions=True
    )
    won = [r for r in results if isinstance(r, BucketLease)]
    held = [r for r in results if isinstance(r, LeaseHeld)]
    assert len(won) == 1
    assert len(held) == 4
    assert {h.instance_id for h in held} == {won[0].instance_id}
    assert (await stored(MemoryStore(name))).instance_id == won[0].instance_id


# --- the probe -----------------------------------------------------------------------------


class Ignores(FaultyStore):
    """A service that accepts one conditional header but ignores it."""

    def __init__(self, inner: ObjectStore, header: str) -> None:
        super().__init__(inner)
        self.header = header

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        ignored = (self.header == "If-None-Match" and isinstance(mode, Create)) or (
            self.header == "If-Match" and isinstance(mode, Update)
        )
        return await super().put(key, data, OVERWRITE if ignored else mode)


def ignoring_everything(inner: ObjectStore) -> FaultyStore:
    store = FaultyStore(inner)
    store.ignore_preconditions = True
    return store


@pytest.mark.parametrize(
    ("make", "header"),
    [
        (ignoring_everything, "If-None-Match"),
        (lambda inner: Ignores(inner, "If-None-Match"), "If-None-Match"),
        (lambda inner: Ignores(inner, "If-Match"), "If-Match"),
    ],
)
@pytest.mark.parametrize("before", [None, "stale", "own"])
async def test_a_service_ignoring_preconditions_fails_closed_and_hands_the_prefix_back(
    clock: FakeClock,
    lease_log: pytest.LogCaptureFixture,
    make: Any,
    header: str,
    before: str | None,
) -> None:
    inner = MemoryStore()
    me = new_instance_id()
    if before == "stale":
        await put_record(inner, "gone", "2026-11-29T09:00:00Z")
    if before == "own":
        await put_record(inner, me, "2026-11-29T10:00:00Z")
    store = make(inner)
    with pytest.raises(PreconditionsIgnored) as raised:
        await acquire(store, clock, instance_id=me)
    assert raised.value.header == header
    assert header in raised.value.message
    assert "MUSHROOM_BACKUP_LEASE_CONDITIONAL=off" in raised.value.message
    assert inner.keys == []  # handed back
    assert fields(lease_log, "lease.preconditions_ignored")[0]["header"] == header
    assert levels(lease_log, "lease.preconditions_ignored") == {logging.ERROR}
    assert fields(lease_log, "lease.acquired") == []


async def test_a_probe_that_fails_hands_the_prefix_back(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    bucket.fail("put", nth=3)  # the second probe write
    with pytest.raises(StoreError):
        await acquire(bucket, clock)
    assert bucket.inner.keys == []  # type: ignore[attr-defined]


async def test_a_probe_hand_back_that_fails_still_reports_the_cause(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    bucket.ignore_preconditions = True
    bucket.fail("get", nth=2)  # the hand-back's read
    with pytest.raises(PreconditionsIgnored):
        await acquire(bucket, clock)


# --- best-effort mode ----------------------------------------------------------------------


async def test_best_effort_mode_reads_then_writes_and_says_so(
    clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    store = FaultyStore(MemoryStore(conditional=False))
    lease = await acquire(store, clock)
    # read, the refused conditional write (sent nowhere), the plain write; no probe.
    assert store.calls == [("get", "LEASE"), ("put", "LEASE"), ("put", "LEASE")]
    assert lease.exclusion is Exclusion.BEST_EFFORT
    assert str(lease.exclusion) == "best-effort"
    assert (await stored(store)).instance_id == lease.instance_id
    assert levels(lease_log, "lease.best_effort") == {logging.WARNING}
    assert fields(lease_log, "lease.acquired")[0]["exclusion"] == "best-effort"


async def test_best_effort_mode_still_respects_a_fresh_lease(clock: FakeClock) -> None:
    store = MemoryStore(conditional=False)
    await put_record(store, "holder", format_rfc3339(clock.wall()))
    with pytest.raises(LeaseHeld):
        await acquire(store, clock)
