"""BucketLease.keep_renewed: the background renewal loop, driven by a fake clock (no real
sleeps): renews every ttl/3, retries transient failures while the fence is open, and on loss
(or a fence that closed without a renewal) marks the lease lost and calls on_lost once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import LeaseLost, StoreError
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease
from mushroom_backup.lease.fenced import FencedStore
from mushroom_backup.lease.record import LeaseRecord
from mushroom_backup.store.base import CREATE, OVERWRITE
from mushroom_backup.store.faults import FaultyStore, service_unavailable
from mushroom_backup.store.memory import MemoryStore


def fields(log: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in log.records if r.getMessage() == event]


async def until(condition: Callable[[], bool], spins: int = 1000) -> None:
    """Let the event loop run until ``condition`` holds (no time passes on any clock)."""
    for _ in range(spins):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class Lost:
    """An on_lost callback that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[LeaseLost] = []

    def __call__(self, lost: LeaseLost) -> None:
        self.calls.append(lost)


async def take(store: FaultyStore, clock: FakeClock) -> BucketLease:
    return await BucketLease.acquire(store, ttl_s=30, clock=clock)


async def test_the_lease_is_renewed_every_third_of_a_ttl(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost) as held:
        assert held is lease
        await until(lambda: clock.sleepers == 1)
        assert clock.next_deadline() == 1010.0
        for step in (1, 2, 3):
            clock.advance(10)
            await until(lambda: clock.sleepers == 1 and lease.write_deadline() != 1020.0)
            assert lease.record.renewed_at == f"2026-11-29T10:00:{10 * step}Z"
            assert clock.next_deadline() == 1010.0 + 10 * step
            assert lease.write_deadline() == pytest.approx(1020.0 + 10 * step)
    assert clock.sleepers == 0  # the loop stopped with the block
    assert not lease.lost
    assert bucket.inner.keys == ["LEASE"]  # type: ignore[attr-defined]  # not released
    assert on_lost.calls == []


async def drive(clock: FakeClock, done: Callable[[], bool], limit: float) -> None:
    """Move the fake clock from one sleeper's deadline to the next until ``done``, never past
    ``limit``."""
    while True:
        await until(lambda: done() or clock.sleepers >= 1)
        if done():
            return
        deadline = clock.next_deadline()
        assert deadline is not None
        assert deadline <= limit, f"nothing happened by {limit}"
        clock.advance(max(0.0, deadline - clock.monotonic()))


async def test_a_transient_failure_is_retried_soon_and_the_lease_survives(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    lease = await take(bucket, clock)
    bucket.fail("put")
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        clock.advance(10)
        # The retry comes within a tenth of the interval (jittered, so maybe at once).
        await drive(clock, lambda: lease.record.renewed_at != "2026-11-29T10:00:00Z", 1011.0)
        (failed,) = fields(lease_log, "lease.renew_failed")
        assert failed["retryable"] is True
        assert failed["fence_open"] is True
        await until(lambda: clock.sleepers == 1)
        renewed_at = clock.monotonic()
        assert 1010.0 <= renewed_at <= 1011.0
        assert clock.next_deadline() == pytest.approx(renewed_at + 10)
        assert lease.write_deadline() == pytest.approx(renewed_at + 20)
    assert not lease.lost
    assert on_lost.calls == []


async def test_failures_until_the_fence_closes_lose_the_lease(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    tried_at: list[tuple[float, bool]] = []

    def outage(key: str) -> StoreError:
        tried_at.append((clock.monotonic(), lease.may_write()))
        return service_unavailable(key)

    bucket.fail("put", times=1_000_000, error=outage)
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        await drive(clock, lambda: bool(on_lost.calls), 1020.0)
    # Retried while the fence was open, the last attempt as it closed; then lost.
    times = [t for t, _ in tried_at]
    assert times[0] == 1010.0
    assert times == sorted(times)
    assert len(times) >= 2
    assert times[-1] == pytest.approx(1020.0)
    assert all(open_ for _, open_ in tried_at[:-1])
    assert not tried_at[-1][1]
    (lost,) = on_lost.calls
    assert "before its write fence closed" in lost.message
    assert "503" in lost.message
    assert lease.lost
    assert lease.write_deadline() is None
    assert clock.sleepers == 0


async def test_an_error_retrying_cannot_fix_loses_the_lease_at_once(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    bucket.fail("put", error=lambda key: StoreError(f"put {key}: 403 AccessDenied", key=key))
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        clock.advance(10)
        await until(lambda: bool(on_lost.calls))
    assert "403 AccessDenied" in on_lost.calls[0].message
    assert "not one that retrying fixes" in on_lost.calls[0].message
    assert lease.lost
    assert bucket.calls.count(("put", "LEASE")) == 4  # acquire, two probes, one renewal


async def test_a_takeover_stops_the_loop_and_calls_on_lost_once(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    lease = await take(bucket, clock)
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        successor = LeaseRecord("successor", "x", "2026-11-29T10:00:05Z", 30)
        await bucket.inner.put(LEASE_KEY, successor.encode(), OVERWRITE)
        clock.advance(10)
        await until(lambda: bool(on_lost.calls))
        await until(lambda: clock.sleepers == 0)
        clock.advance(100)
        await until(lambda: True)
    (lost,) = on_lost.calls
    assert lost.instance_id == "successor"
    assert lease.lost
    assert fields(lease_log, "lease.lost")[0]["holder"] == "successor"


async def test_an_async_on_lost_is_awaited(bucket: FaultyStore, clock: FakeClock) -> None:
    lease = await take(bucket, clock)
    told = asyncio.Event()

    async def on_lost(lost: LeaseLost) -> None:
        await asyncio.sleep(0)
        told.set()

    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        await bucket.inner.delete(LEASE_KEY)
        clock.advance(10)
        await until(told.is_set)


async def test_an_on_lost_that_raises_is_logged_not_lost(
    bucket: FaultyStore, clock: FakeClock, lease_log: pytest.LogCaptureFixture
) -> None:
    lease = await take(bucket, clock)

    def on_lost(lost: LeaseLost) -> None:
        raise RuntimeError("callback bug")

    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        await bucket.inner.delete(LEASE_KEY)
        clock.advance(10)
        await until(lambda: bool(fields(lease_log, "lease.on_lost_failed")))
    assert lease.lost


async def test_a_lease_marked_lost_stops_the_loop_without_a_request(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        lease.mark_lost("writer-b")  # a refused LATEST swap, seen by the worker
        bucket.calls.clear()
        clock.advance(10)
        await until(lambda: clock.sleepers == 0)
    assert bucket.calls == []
    assert on_lost.calls == []  # whoever marked it lost already knows


async def test_a_bug_in_the_renewer_fails_closed(
    bucket: FaultyStore,
    clock: FakeClock,
    lease_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lease = await take(bucket, clock)

    async def broken() -> None:
        raise KeyError("oops")

    monkeypatch.setattr(lease, "renew", broken)
    on_lost = Lost()
    async with lease.keep_renewed(on_lost=on_lost):
        await until(lambda: clock.sleepers == 1)
        clock.advance(10)
        await until(lambda: bool(on_lost.calls))
    assert lease.lost
    assert "KeyError" in on_lost.calls[0].message
    assert fields(lease_log, "lease.renew_loop_failed")


async def test_leaving_the_block_cancels_a_stalled_renewal(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    stall = bucket.stall("put")
    async with lease.keep_renewed():
        await until(lambda: clock.sleepers == 1)
        clock.advance(10)
        await stall.entered.wait()
    assert stall.waiting == 0  # the stuck request was cancelled, not left behind
    assert not lease.lost


async def test_an_error_in_the_block_propagates_and_stops_the_loop(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)

    async def worker() -> None:
        async with lease.keep_renewed():
            await until(lambda: clock.sleepers == 1)
            raise ValueError("worker failed")

    with pytest.raises(ValueError, match="worker failed"):
        await worker()
    assert clock.sleepers == 0


async def test_a_renewed_lease_keeps_a_fenced_store_writing(
    bucket: FaultyStore, clock: FakeClock
) -> None:
    lease = await take(bucket, clock)
    data = FencedStore(MemoryStore(), lease, clock)
    async with lease.keep_renewed():
        for second in range(0, 90, 5):
            await until(lambda: clock.sleepers >= 1)
            await data.put(f"data/{second}", b"x", CREATE)
            clock.advance(5)
    assert data.closed_reason is None
