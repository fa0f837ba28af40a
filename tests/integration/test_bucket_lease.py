"""The bucket lease against real S3 services on 127.0.0.1 (moto's server and SeaweedFS): real
ETags, real 412s, real races.

Mutual exclusion under a race is proven on SeaweedFS, which gives real compare-and-swap; moto
checks preconditions without a lock (DESIGN.md) and is only trusted here because a LEASE object
is tiny (its unlocked window is for objects over ~5 MiB). Time is a fake clock except in the
one test where a real TTL must pass (one second).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from mushroom_backup.clock import SYSTEM_CLOCK, FakeClock
from mushroom_backup.errors import LeaseHeld, LeaseLost, NotFound, PreconditionsIgnored, StoreError
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease
from mushroom_backup.lease.record import (
    Exclusion,
    LeaseRecord,
    LeaseWatch,
    decode_record,
    new_instance_id,
    parse_rfc3339,
)
from mushroom_backup.store import OVERWRITE, ObjectStore, open_store
from mushroom_backup.store.base import PutMode, Update, Version
from mushroom_backup.store.faults import FaultyStore

if TYPE_CHECKING:  # see tests/conftest.py
    from tests.servers import S3Server
else:
    from servers import S3Server

RUST_BYTES = (
    b'{"instance_id":"abc","acquired_at":"2026-11-29T10:00:00Z",'
    b'"renewed_at":"2026-11-29T10:00:00.5Z","ttl_s":30}'
)


@pytest.fixture
async def store(s3_url: str) -> AsyncIterator[ObjectStore]:
    async with open_store(s3_url) as opened:
        yield opened


def server_of(request: pytest.FixtureRequest) -> S3Server:
    kind = request.node.callspec.params["s3_url"]
    server: S3Server = request.getfixturevalue(f"{kind}_server")
    return server


def raw_lease(request: pytest.FixtureRequest, s3_url: str) -> bytes:
    """The LEASE object's bytes, read with a plain boto client at its full key in the bucket."""
    parts = urlsplit(s3_url)
    answer = (
        server_of(request)
        .client()
        .get_object(Bucket=parts.netloc, Key=f"{parts.path.strip('/')}/LEASE")
    )
    data: bytes = answer["Body"].read()
    return data


async def stored(store: ObjectStore) -> LeaseRecord:
    return decode_record((await store.get(LEASE_KEY)).data)


# --- exclusion -----------------------------------------------------------------------------


async def test_contenders_started_together_get_exactly_one_lease(s3_url: str) -> None:
    clock = FakeClock()
    for _ in range(3):
        contenders = [open_store(s3_url) for _ in range(3)]
        try:
            results = await asyncio.gather(
                *(BucketLease.acquire(s, ttl_s=30, clock=clock) for s in contenders),
                return_exceptions=True,
            )
            won = [r for r in results if isinstance(r, BucketLease)]
            held = [r for r in results if isinstance(r, LeaseHeld)]
            assert len(won) == 1, results
            assert len(held) == len(contenders) - 1, results
            assert {h.instance_id for h in held} == {won[0].instance_id}
            assert (await stored(contenders[0])).instance_id == won[0].instance_id
            assert won[0].exclusion is Exclusion.CONDITIONAL
            await won[0].release()
            with pytest.raises(NotFound):
                await contenders[0].get(LEASE_KEY)
        finally:
            for s in contenders:
                await s.close()


async def test_the_record_sits_at_the_prefix_root_in_the_rust_format(
    s3_url: str, store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    lease = await BucketLease.acquire(store, ttl_s=30, clock=FakeClock(), host="db1", pid=7)
    data = raw_lease(request, s3_url)  # at backups/db1/LEASE in the bucket
    assert data == (
        b'{"instance_id":"' + lease.instance_id.encode() + b'",'
        b'"acquired_at":"2026-11-29T10:00:00Z","renewed_at":"2026-11-29T10:00:00Z",'
        b'"ttl_s":30,"host":"db1","pid":7}'
    )
    assert list(json.loads(data))[:4] == ["instance_id", "acquired_at", "renewed_at", "ttl_s"]


async def test_a_rust_agents_lease_blocks_us_until_it_expires(store: ObjectStore) -> None:
    clock = FakeClock()
    await store.put(LEASE_KEY, RUST_BYTES, OVERWRITE)
    with pytest.raises(LeaseHeld) as raised:
        await BucketLease.acquire(store, ttl_s=30, clock=clock)
    assert raised.value.instance_id == "abc"
    clock.advance(30.5)
    lease = await BucketLease.acquire(store, ttl_s=30, clock=clock)  # If-Match its real ETag
    assert (await stored(store)).instance_id == lease.instance_id


async def test_a_holder_whose_lease_was_taken_over_learns_it_at_its_next_renewal(
    s3_url: str,
) -> None:
    clock = FakeClock()
    async with open_store(s3_url) as first, open_store(s3_url) as second:
        holder = await BucketLease.acquire(first, ttl_s=30, clock=clock)
        with pytest.raises(LeaseHeld):
            await BucketLease.acquire(second, ttl_s=30, clock=clock)
        clock.advance(30)  # the holder was partitioned for a whole TTL
        successor = await BucketLease.acquire(second, ttl_s=30, clock=clock)
        with pytest.raises(LeaseLost) as raised:
            await holder.renew()
        assert raised.value.instance_id == successor.instance_id
        assert holder.lost
        assert holder.write_deadline() is None
        await holder.release()  # lost: left alone
        await successor.renew()
        assert (await stored(second)).instance_id == successor.instance_id


async def test_release_by_a_superseded_holder_leaves_the_successor_alone(s3_url: str) -> None:
    clock = FakeClock()
    async with open_store(s3_url) as first, open_store(s3_url) as second:
        holder = await BucketLease.acquire(first, ttl_s=30, clock=clock)
        clock.advance(30)
        successor = await BucketLease.acquire(second, ttl_s=30, clock=clock)
        await holder.release()  # not known to be lost: DELETE If-Match our ETag is refused
        assert (await stored(second)).instance_id == successor.instance_id
        await successor.release()
        with pytest.raises(NotFound):
            await second.get(LEASE_KEY)


async def test_a_lost_renewal_answer_is_reconciled_and_the_etag_changes(
    store: ObjectStore,
) -> None:
    clock = FakeClock()
    faulty = FaultyStore(store)
    lease = await BucketLease.acquire(faulty, ttl_s=30, clock=clock)
    faulty.lose_answer("put")
    with pytest.raises(StoreError):
        await lease.renew()
    landed = await store.get(LEASE_KEY)
    await lease.renew()  # same fake instant: If-Match refused, read, ours, swap again
    now = await store.get(LEASE_KEY)
    assert now.version == lease.version
    assert now.version != landed.version
    assert not lease.lost


async def test_a_lease_held_in_real_time_blocks_and_expires_a_ttl_after_its_renewals_stop(
    s3_url: str,
) -> None:
    """The one test where real time passes: a one-second TTL, renewed every third of one."""
    async with open_store(s3_url) as first, open_store(s3_url) as second:
        counted = FaultyStore(first)
        holder = await BucketLease.acquire(counted, ttl_s=1, clock=SYSTEM_CLOCK)
        acquired_at = holder.record.renewed_at
        lost: list[LeaseLost] = []
        async with holder.keep_renewed(on_lost=lost.append):
            await asyncio.sleep(1.5)  # longer than the TTL: only renewals keep it fresh
            with pytest.raises(LeaseHeld):
                await BucketLease.acquire(second, ttl_s=1, clock=SYSTEM_CLOCK)
        renewals = counted.calls.count(("put", "LEASE")) - 3  # minus the create and two probes
        assert renewals >= 3
        assert parse_rfc3339(holder.record.renewed_at) > parse_rfc3339(acquired_at)
        stopped = time.monotonic()
        me, watch = new_instance_id(), LeaseWatch()
        while True:
            try:
                successor = await BucketLease.acquire(
                    second, ttl_s=1, instance_id=me, watch=watch, clock=SYSTEM_CLOCK
                )
                break
            except LeaseHeld:
                assert time.monotonic() - stopped < 10, "the lease never expired"
                await asyncio.sleep(0.1)  # real time must pass for a real TTL
        assert holder.write_deadline() is None  # fenced well before the takeover
        with pytest.raises(LeaseLost) as raised:
            await holder.renew()
        assert raised.value.instance_id == successor.instance_id
        assert lost == []  # the renewer had stopped with its block
        await successor.release()


# --- services that ignore preconditions ----------------------------------------------------


class IgnoresIfMatch(FaultyStore):
    """A service that honours If-None-Match but ignores If-Match (writes anyway)."""

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        return await super().put(key, data, OVERWRITE if isinstance(mode, Update) else mode)


def ignoring_everything(inner: ObjectStore) -> FaultyStore:
    wrapper = FaultyStore(inner)
    wrapper.ignore_preconditions = True
    return wrapper


@pytest.mark.parametrize(
    ("wrap", "header"),
    [(ignoring_everything, "If-None-Match"), (IgnoresIfMatch, "If-Match")],
)
async def test_a_service_that_ignores_preconditions_makes_acquire_fail_closed(
    store: ObjectStore, wrap: Any, header: str
) -> None:
    with pytest.raises(PreconditionsIgnored) as raised:
        await BucketLease.acquire(wrap(store), ttl_s=30, clock=FakeClock())
    assert raised.value.header == header
    assert "MUSHROOM_BACKUP_LEASE_CONDITIONAL=off" in raised.value.message
    with pytest.raises(NotFound):  # the prefix was handed back
        await store.get(LEASE_KEY)


async def test_best_effort_mode_on_a_real_service(s3_url: str) -> None:
    clock = FakeClock()
    async with open_store(s3_url, conditional=False) as store:
        lease = await BucketLease.acquire(store, ttl_s=30, clock=clock)
        assert lease.exclusion is Exclusion.BEST_EFFORT
        with pytest.raises(LeaseHeld):
            await BucketLease.acquire(store, ttl_s=30, clock=clock)
        clock.advance(10)
        await lease.renew()
        assert (await stored(store)).renewed_at == "2026-11-29T10:00:10Z"
        await lease.release()
        with pytest.raises(NotFound):
            await store.get(LEASE_KEY)
