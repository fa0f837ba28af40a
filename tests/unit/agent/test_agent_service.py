"""The service loop, driven deterministically: one in-memory bucket, a FakeClock, the real
snapshot code, and faults injected by a FaultyStore.

Covers (issue #4): standby names the holder and keeps looking; a dead holder is replaced as
soon as its lease goes stale; holding renews and snapshots on the interval (counted from
LATEST after a takeover); a lost lease cancels the snapshot in flight with LATEST untouched and
the service goes back to standby without exiting; transient renewal failures are retried only
while the fence is open; SIGUSR1-style requests; triggers during a snapshot coalesce into one
follow-up; a stop finishes the snapshot in flight within the grace or cancels it, releases the
lease and returns 0; a fenced process lease (identity lost) stops with exit 4.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

import pytest

from mushroom_backup.agent.service import Service
from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import EXIT_LEASE_LOST, StoreError
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease, LeaseRecord, read_lease
from mushroom_backup.lease.process.authority import ProcessLeaseAuthority
from mushroom_backup.lease.process.holder import ProcessLeaseHolder
from mushroom_backup.lease.process.record import Participant, ProcessLeaseFence
from mushroom_backup.lease.record import format_rfc3339
from mushroom_backup.snapshot.catalog import read_latest
from mushroom_backup.snapshot.manifest import MANIFESTS_PREFIX
from mushroom_backup.store.base import OVERWRITE
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.unit.agent.service_harness import INTERVAL_S, TTL_S, Harness
else:
    from service_harness import INTERVAL_S, TTL_S, Harness

OTHER = "b" * 32
THIEF = "c" * 32


def state(service: Service) -> str:
    """Where the loop is now (a function, so that each read is a fresh one for mypy)."""
    return service.state


def is_data(key: str) -> bool:
    return key.startswith("data/")


async def latest_id(h: Harness) -> str | None:
    ref = await read_latest(h.bucket)
    return None if ref is None else ref.snapshot_id


def manifests(h: Harness) -> list[str]:
    prefix = MANIFESTS_PREFIX
    return [k.removeprefix(prefix) for k in h.bucket.keys if k.startswith(prefix)]


async def lease_holder(h: Harness) -> str | None:
    view = await read_lease(h.bucket)
    return None if view is None or view.record is None else view.record.instance_id


async def steal_lease(h: Harness, instance_id: str = THIEF) -> None:
    """Another instance's fresh record replaces ours (as after a takeover we slept through)."""
    stamp = format_rfc3339(h.clock.wall())
    record = LeaseRecord(instance_id, stamp, stamp, TTL_S, "db9", 999)
    await h.bucket.put(LEASE_KEY, record.encode(), OVERWRITE)


async def holding_after_first_snapshot(h: Harness, **schedule: Any) -> tuple[Service, str]:
    """A service that holds the lease and has taken its first snapshot."""
    service = h.service(**schedule)
    h.start(service)
    await h.until(lambda: h.log.count("snapshot.completed") == 1, "the first snapshot")
    first = await latest_id(h)
    assert first is not None
    assert state(service) == "holding"
    return service, first


# --- standby and holding ---------------------------------------------------------------------


async def test_standby_names_the_holder_takes_over_when_stale_and_returns_to_standby_when_lost(
    h: Harness,
) -> None:
    other = await BucketLease.acquire(
        h.bucket, ttl_s=TTL_S, instance_id=OTHER, clock=h.clock, host="db2", pid=4242
    )
    service = h.service()
    task = h.start(service)
    await h.until(lambda: h.log.count("service.standby") == 1, "standby")
    standby = h.log.last("service.standby")
    assert standby.fields["holder"] == OTHER
    assert standby.fields["holder_host"] == "db2"
    assert standby.fields["holder_pid"] == 4242
    assert state(service) == "standby"
    assert ("STATUS=standby: lease held by " + OTHER + " on db2") in h.notifier.lines()

    # The holder stays alive for three TTLs: the standby keeps looking, and says so once.
    for _ in range(9):
        await h.jump(TTL_S / 3)
        await other.renew()
    assert h.log.count("lease.acquired") == 1  # only the other's
    assert h.log.count("service.standby", level=logging.INFO) == 1
    assert h.log.count("service.standby") > 9  # looked again at least every retry interval

    # The holder dies right after a renewal (out of step with the standby's looks): taken
    # over as soon as its lease is stale, not at the next regular look.
    await h.jump(4.0)
    await other.renew()
    died = h.clock.monotonic()
    took = await h.jump_until(
        lambda: h.log.count("lease.acquired") == 2, "the takeover", limit_s=2 * TTL_S
    )
    assert TTL_S <= took <= TTL_S + 0.2, took
    assert h.log.last("lease.acquired").fields["taken_from"] == OTHER
    assert h.log.last("lease.acquired").at - died == pytest.approx(took)
    await h.until(lambda: h.log.count("snapshot.completed") == 1, "the first snapshot")
    assert state(service) == "holding"
    assert service.metrics.lease_held

    # Someone takes the lease from us: the next renewal finds out; back to standby, not exit.
    await steal_lease(h)
    await h.jump_until(
        lambda: h.log.count("service.lease_lost") == 1, "the lost lease", limit_s=TTL_S / 3
    )
    await h.until(lambda: h.log.count("service.standby", level=logging.INFO) == 2, "standby")
    assert h.log.last("service.standby").fields["holder"] == THIEF
    assert THIEF in str(h.log.last("service.lease_lost").fields["reason"])
    assert state(service) == "standby"
    assert not service.metrics.lease_held
    assert not task.done()
    await h.jump(TTL_S / 2)
    assert not task.done()
    assert await lease_holder(h) == THIEF  # the standby never wrote over a fresh lease


async def test_a_released_lease_is_taken_within_one_retry_interval(h: Harness) -> None:
    other = await BucketLease.acquire(h.bucket, ttl_s=TTL_S, instance_id=OTHER, clock=h.clock)
    h.start(h.service())
    await h.until(lambda: h.log.count("service.standby") == 1, "standby")
    await h.jump(1.0)
    await other.release()
    took = await h.jump_until(
        lambda: h.log.count("lease.acquired") == 2, "the takeover", limit_s=TTL_S
    )
    assert took <= TTL_S / 3  # one retry interval, not a TTL
    assert h.log.last("lease.acquired").fields["taken_from"] is None


async def test_the_interval_counts_from_latest_after_a_takeover(h: Harness) -> None:
    _service, first = await holding_after_first_snapshot(h)
    assert h.log.last("snapshot.triggered").fields["reason"] == "interval"
    began = h.log.last("snapshot.triggered").at
    # A second instance on the same bucket (this one gone without releasing): it waits for the
    # interval since the snapshot LATEST names, not a whole interval from its takeover.
    h.tasks[0].cancel()
    await asyncio.wait(h.tasks)
    await steal_lease(h, OTHER)  # a stale record of a dead holder, renewed now...
    successor = h.service()
    h.start(successor)
    await h.jump_until(
        lambda: h.log.count("snapshot.triggered") == 2, "the next snapshot", limit_s=2 * INTERVAL_S
    )
    await h.until(lambda: h.log.count("snapshot.completed") == 2, "the next snapshot")
    second = h.log.named("snapshot.triggered")[-1]
    assert second.at - began == pytest.approx(INTERVAL_S, abs=0.5)
    assert await latest_id(h) != first


# --- requests and coalescing ----------------------------------------------------------------


async def test_a_request_takes_a_snapshot_now_and_requests_during_one_coalesce(
    h: Harness,
) -> None:
    service, _ = await holding_after_first_snapshot(h)
    await h.jump(60)
    gate = h.store.stall("put", key="LATEST", times=1)
    service.request_snapshot()
    await h.until(lambda: gate.waiting == 1, "the second snapshot reaching LATEST")
    assert h.log.last("snapshot.triggered").fields["reason"] == "request"
    for _ in range(3):
        service.request_snapshot()
    service.source_changed()  # not watching: ignored
    gate.release()
    await h.until(lambda: h.log.count("snapshot.completed") == 3, "one follow-up snapshot")
    assert [e.fields["reason"] for e in h.log.named("snapshot.triggered")] == [
        "interval",
        "request",
        "request",
    ]
    follow_up = h.log.last("snapshot.triggered").at
    # Nothing more until the interval has passed since the follow-up started.
    await h.jump(INTERVAL_S - 1)
    assert h.log.count("snapshot.triggered") == 3
    await h.jump_until(lambda: h.log.count("snapshot.triggered") == 4, "interval", limit_s=2)
    await h.until(lambda: h.log.count("snapshot.completed") == 4, "the interval snapshot")
    assert h.log.last("snapshot.triggered").at - follow_up == pytest.approx(INTERVAL_S)
    assert service.metrics.snapshots_total == 4
    assert len(manifests(h)) == 4


async def test_watched_changes_settle_then_respect_the_minimum_gap(h: Harness) -> None:
    service, _ = await holding_after_first_snapshot(h, watch=True, debounce_s=10, min_gap_s=60)
    first = h.log.last("snapshot.triggered").at
    await h.jump(5)
    service.source_changed()
    await h.jump(20)  # settled after 10 s, but within the 60 s gap
    assert h.log.count("snapshot.triggered") == 1
    took = await h.jump_until(
        lambda: h.log.count("snapshot.triggered") == 2, "the change snapshot", limit_s=60
    )
    assert h.log.last("snapshot.triggered").fields["reason"] == "change"
    assert h.log.last("snapshot.triggered").at - first == pytest.approx(60)
    assert took == pytest.approx(35)
    await h.until(lambda: h.log.count("snapshot.completed") == 2, "the change snapshot")


async def test_a_standby_ignores_a_request_and_names_the_holder(h: Harness) -> None:
    await BucketLease.acquire(h.bucket, ttl_s=TTL_S, instance_id=OTHER, clock=h.clock)
    service = h.service()
    h.start(service)
    await h.until(lambda: h.log.count("service.standby") == 1, "standby")
    service.request_snapshot()
    ignored = h.log.last("service.snapshot_request_ignored")
    assert ignored.fields["holder"] == OTHER
    assert not service.triggers.requested


# --- lost lease and fence --------------------------------------------------------------------


async def test_a_lost_lease_cancels_the_snapshot_in_flight_and_latest_is_untouched(
    h: Harness,
) -> None:
    service, first = await holding_after_first_snapshot(h)
    (h.source / "base" / "3").write_bytes(b"new data\n" * 1000)  # the next snapshot uploads
    gate = h.store.stall("put", key=is_data)
    service.request_snapshot()
    await h.until(lambda: gate.waiting >= 1, "the second snapshot uploading")
    in_flight = h.log.last("snapshot.started").fields["snapshot_id"]
    keys_before = h.bucket.keys

    await steal_lease(h)
    took = await h.jump_until(
        lambda: h.log.count("snapshot.abandoned") == 1, "the abandoned snapshot", TTL_S / 3
    )
    assert took <= TTL_S / 3  # found at the next renewal
    assert "taken over by " + THIEF in str(h.log.last("snapshot.abandoned").fields["reason"])
    assert h.log.count("service.lease_lost") == 1
    await h.until(lambda: gate.waiting == 0, "the stalled upload cancelled")
    gate.release()
    await h.jump(TTL_S / 2)
    assert await latest_id(h) == first
    assert in_flight not in manifests(h)
    assert h.bucket.keys == keys_before  # nothing written after the loss
    assert state(service) == "standby"
    assert service.metrics.snapshots_abandoned_total == 1
    assert not h.tasks[0].done()


async def test_renewals_that_keep_failing_close_the_fence_before_anyone_may_take_over(
    h: Harness,
) -> None:
    service, first = await holding_after_first_snapshot(h)
    (h.source / "base" / "3").write_bytes(b"new data\n" * 1000)
    gate = h.store.stall("put", key=is_data)
    service.request_snapshot()
    await h.until(lambda: gate.waiting >= 1, "the second snapshot uploading")
    confirmed = h.clock.monotonic()  # renewed at most this long ago: no renewal since
    outage = [True]  # the store stops taking renewals, until the test says otherwise
    h.store.fail("put", key=lambda k: k == LEASE_KEY and outage[0], times=1_000_000)
    await h.jump_until(
        lambda: h.log.count("snapshot.abandoned") == 1, "the fence closing", limit_s=TTL_S
    )
    closed = h.log.last("snapshot.abandoned").at
    assert closed - confirmed <= TTL_S * 2 / 3  # a third of a TTL before a takeover is allowed
    assert h.log.count("lease.renew_failed") >= 2  # retried while the fence was open
    assert "fence" in str(h.log.last("snapshot.abandoned").fields["reason"])
    await h.until(lambda: h.log.count("service.lease_lost") == 1, "the loss")
    assert await latest_id(h) == first
    gate.release()

    # The store recovers: the record still names us, so the standby takes it back.
    await h.jump(TTL_S)
    assert h.log.count("service.store_unavailable") >= 1
    outage[0] = False
    await h.jump_until(lambda: h.log.count("lease.acquired") == 2, "re-acquired", limit_s=5 * TTL_S)
    assert h.log.last("lease.acquired").fields["taken_from"] is None  # our own record
    assert state(service) == "holding"


async def test_a_renewal_that_hangs_gives_the_lease_up_when_a_takeover_becomes_possible(
    h: Harness,
) -> None:
    service, first = await holding_after_first_snapshot(h)
    confirmed = h.log.last("lease.acquired").at  # no renewal is confirmed after this one
    gate = h.store.stall("put", key=LEASE_KEY)  # renewals are sent and never answered
    await h.jump_until(
        lambda: h.log.count("service.lease_lost") == 1, "giving up", limit_s=2 * TTL_S
    )
    assert h.log.last("service.lease_lost").at - confirmed == pytest.approx(TTL_S)
    assert "not answering" in str(h.log.last("service.lease_lost").fields["reason"])
    assert not service.metrics.lease_held
    await h.until(lambda: gate.waiting == 1, "the standby's acquire waiting on the store")
    gate.release()  # the store answers again; the record still names us
    await h.until(lambda: h.log.count("lease.acquired") == 2, "re-acquired")
    assert state(service) == "holding"
    assert await latest_id(h) == first


async def test_a_wall_clock_step_forward_is_not_a_lost_lease(h: Harness) -> None:
    service, _ = await holding_after_first_snapshot(h)
    await h.jump(3)
    h.clock.step_wall(timedelta(seconds=TTL_S))  # the fence closes until the next renewal
    service.request_snapshot()  # meanwhile a snapshot cannot write: abandoned, lease kept
    await h.until(lambda: h.log.count("snapshot.abandoned") == 1, "the fenced snapshot")
    await h.jump(3 * TTL_S)
    assert h.log.count("service.lease_lost") == 0
    assert state(service) == "holding"
    assert await lease_holder(h) == service.instance_id


# --- stopping -------------------------------------------------------------------------------


async def test_stop_lets_the_snapshot_in_flight_finish_within_the_grace(h: Harness) -> None:
    service, _ = await holding_after_first_snapshot(h)
    gate = h.store.stall("put", key="LATEST", times=1)
    service.request_snapshot()
    await h.until(lambda: gate.waiting == 1, "the second snapshot reaching LATEST")
    service.stop()
    assert any(line == "STOPPING=1" for line in h.notifier.lines())
    await h.jump(10)  # within the 30 s grace; renewals go on meanwhile
    assert not h.tasks[0].done()
    assert await lease_holder(h) == service.instance_id
    gate.release()
    assert await asyncio.wait_for(h.tasks[0], 20) == 0
    assert h.log.count("snapshot.completed") == 2
    assert await latest_id(h) == h.log.last("snapshot.completed").fields["snapshot_id"]
    assert await lease_holder(h) is None  # released at once
    order = [
        n
        for n in h.log.names()
        if n in ("service.stopping", "snapshot.completed", "lease.released", "service.stopped")
    ]
    assert order == [
        "snapshot.completed",
        "service.stopping",
        "snapshot.completed",
        "lease.released",
        "service.stopped",
    ]


async def test_stop_cancels_a_stuck_snapshot_after_the_grace(h: Harness) -> None:
    service, first = await holding_after_first_snapshot(h)
    (h.source / "base" / "3").write_bytes(b"new data\n" * 1000)
    gate = h.store.stall("put", key=is_data)
    service.request_snapshot()
    await h.until(lambda: gate.waiting >= 1, "the second snapshot uploading")
    stopped = h.clock.monotonic()
    service.stop()
    took = await h.jump_until(lambda: h.tasks[0].done(), "the stop", limit_s=60)
    assert took == pytest.approx(30)  # the grace, then cancelled
    assert h.tasks[0].result() == 0
    assert h.log.last("snapshot.abandoned").at - stopped == pytest.approx(30)
    assert gate.waiting == 0
    assert await latest_id(h) == first
    assert await lease_holder(h) is None


async def test_a_second_stop_cancels_the_snapshot_at_once(h: Harness) -> None:
    service, first = await holding_after_first_snapshot(h)
    (h.source / "base" / "3").write_bytes(b"new data\n" * 1000)
    gate = h.store.stall("put", key=is_data)
    service.request_snapshot()
    await h.until(lambda: gate.waiting >= 1, "the second snapshot uploading")
    service.stop()
    await h.jump(1)
    service.stop()
    await h.until(lambda: h.tasks[0].done(), "the stop")
    assert h.tasks[0].result() == 0
    assert h.log.count("service.stop_hurried") == 1
    assert await latest_id(h) == first
    assert await lease_holder(h) is None


async def test_stop_in_standby_returns_at_once_and_leaves_the_holder_alone(h: Harness) -> None:
    await BucketLease.acquire(h.bucket, ttl_s=TTL_S, instance_id=OTHER, clock=h.clock)
    service = h.service()
    h.start(service)
    await h.until(lambda: h.log.count("service.standby") == 1, "standby")
    service.stop()
    await h.until(lambda: h.tasks[0].done(), "the stop")
    assert h.tasks[0].result() == 0
    assert await lease_holder(h) == OTHER
    assert h.notifier.lines()[0] == "READY=1"


async def test_stop_during_a_hung_acquire_hands_back_what_it_wrote(h: Harness) -> None:
    gate = h.store.stall("put", key=LEASE_KEY, nth=2, times=1)  # the probe after the create
    service = h.service()
    h.start(service)
    await h.until(lambda: gate.waiting == 1, "the acquire hanging in its probe")
    assert await lease_holder(h) == service.instance_id
    service.stop()
    await h.until(lambda: h.tasks[0].done(), "the stop")
    assert h.tasks[0].result() == 0
    assert await lease_holder(h) is None


# --- node identity --------------------------------------------------------------------------


async def test_a_fenced_process_lease_stops_the_service_with_exit_4(
    h: Harness, clock: FakeClock
) -> None:
    node_store = MemoryStore()
    partitioned = FaultyStore(node_store)
    incarnation = UUID("aaaaaaaa-0000-4000-8000-000000000001")
    ttl = timedelta(seconds=TTL_S)
    identity = ProcessLeaseHolder(
        partitioned, 3, ttl=ttl, clock=clock, boot_incarnation=incarnation
    )
    await identity.start()
    service = h.service(identity=identity)
    h.start(service)
    await h.until(lambda: h.log.count("snapshot.completed") == 1, "the first snapshot")
    first = await latest_id(h)
    (h.source / "base" / "3").write_bytes(b"new data\n" * 1000)
    gate = h.store.stall("put", key=is_data)
    service.request_snapshot()
    await h.until(lambda: gate.waiting >= 1, "the second snapshot uploading")

    partitioned.fail("put", times=3)  # this incarnation is cut off from the cluster root
    authority = ProcessLeaseAuthority(node_store, ttl, clock=clock)
    fencing = asyncio.create_task(
        authority.fence_incarnation(Participant(3, incarnation), authority.fencing_deadline(5.0))
    )
    await h.jump_until(lambda: fencing.done(), "the fence", limit_s=2 * TTL_S)
    assert isinstance(fencing.result(), ProcessLeaseFence)
    await h.jump_until(lambda: h.tasks[0].done(), "the stop", limit_s=TTL_S)
    assert h.tasks[0].result() == EXIT_LEASE_LOST
    assert h.log.count("process_lease.lost") >= 1
    assert h.log.count("snapshot.abandoned") == 1
    assert await latest_id(h) == first
    assert await lease_holder(h) is None  # the bucket lease is handed back
    await identity.stop()


async def test_a_failing_snapshot_is_logged_and_the_service_carries_on(h: Harness) -> None:
    service, first = await holding_after_first_snapshot(h)
    (h.source / "base" / "3").write_bytes(b"new data\n" * 1000)
    h.store.fail("put", key=is_data, times=100, error=lambda k: StoreError(f"denied {k}", key=k))
    service.request_snapshot()
    await h.until(lambda: h.log.count("snapshot.failed") == 1, "the failure")
    assert "denied" in str(h.log.last("snapshot.failed").fields["error"])
    assert state(service) == "holding"
    assert await latest_id(h) == first
    await h.jump_until(
        lambda: h.log.count("snapshot.triggered") == 3, "the next interval", limit_s=INTERVAL_S
    )


# --- retention -------------------------------------------------------------------------------


async def test_the_retention_policy_forgets_after_each_successful_snapshot(h: Harness) -> None:
    service = h.service(retention={"keep_last": 2})
    h.start(service)
    for taken in (1, 2, 3):
        if taken > 1:
            service.request_snapshot()

        def completed(n: int = taken) -> bool:
            return h.log.count("snapshot.completed") == n

        def forgotten(n: int = taken) -> bool:
            return h.log.count("retention.applied") == n

        await h.until(completed, f"snapshot {taken}")
        await h.until(forgotten, f"forget {taken}")
    kept = manifests(h)
    assert len(kept) == 2, "keep_last = 2 leaves two manifests after the third snapshot"
    assert await latest_id(h) in kept
    assert h.log.last("retention.applied").fields["kept"] == 2
    assert len(h.log.last("retention.applied").fields["forgotten"]) == 1


async def test_without_a_policy_nothing_is_forgotten(h: Harness) -> None:
    service, _ = await holding_after_first_snapshot(h)
    service.request_snapshot()
    await h.until(lambda: h.log.count("snapshot.completed") == 2, "the second snapshot")
    assert h.log.count("retention.applied") == 0
    assert len(manifests(h)) == 2
