"""The writer's rules and edges: when a contender looks again (a table over an explicit
``now``), what ``backup now`` says when the lease is held (the service on this host is
triggered, not raced), what a lost lease or a cancellation does to a snapshot in flight, and
the source checks of ``backup now`` (usage errors, exit 2)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mushroom_backup.agent.writer import (
    MIN_LOOK_S,
    SnapshotRunner,
    acquire_lease,
    backup_now,
    held_message,
    lease_retry_interval,
    next_look,
)
from mushroom_backup.clock import FakeClock
from mushroom_backup.config import Settings
from mushroom_backup.errors import EXIT_USAGE, LeaseHeld, LeaseLost, UsageError
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease
from mushroom_backup.lease.record import LeaseRecord, LeaseView, format_rfc3339
from mushroom_backup.snapshot.catalog import read_latest
from mushroom_backup.store.base import OVERWRITE, Version
from mushroom_backup.store.faults import FaultyStore, Stall
from mushroom_backup.store.memory import MemoryStore

NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
OTHER = "b" * 32


def view(renewed: datetime | None, ttl_s: int = 30) -> LeaseView:
    stamp = format_rfc3339(renewed) if renewed is not None else "not a time"
    record = LeaseRecord(OTHER, stamp, stamp, ttl_s)
    return LeaseView(record, None, Version('"v1"'), 100)


@pytest.mark.parametrize(
    ("ttl_s", "expected"),
    [(1, 1.0), (3, 1.0), (6, 2.0), (30, 10.0), (300, 10.0)],
)
def test_the_retry_interval_is_a_third_of_the_ttl_within_1_to_10_s(
    ttl_s: int, expected: float
) -> None:
    assert lease_retry_interval(ttl_s) == expected


@pytest.mark.parametrize(
    ("seen", "ttl_s", "expected"),
    [
        (None, 30, 10.0),  # nothing read: the regular interval
        (view(NOW), 30, 10.0),  # just renewed: expires in 30 s, look at the regular interval
        (view(NOW - timedelta(seconds=25)), 30, 5.0 + MIN_LOOK_S),  # just after it expires
        (view(NOW - timedelta(seconds=29.99)), 30, MIN_LOOK_S + 0.01),
        (view(NOW - timedelta(seconds=31)), 30, 10.0),  # stale: acquire takes it (or raced)
        (view(NOW + timedelta(seconds=20)), 30, 10.0),  # stamped ahead: fresh for longer
        (view(NOW + timedelta(seconds=40)), 30, 10.0),  # suspect: the watch decides
        (view(None), 30, 10.0),  # unparseable stamp
        (view(NOW - timedelta(seconds=1.5), ttl_s=2), 3, MIN_LOOK_S + 0.5),  # its TTL governs
        (view(NOW - timedelta(seconds=2)), 2, 1.0),  # exactly expired: not fresh
    ],
)
def test_next_look_is_just_after_the_lease_expires_or_the_retry_interval(
    seen: LeaseView | None, ttl_s: int, expected: float
) -> None:
    assert next_look(seen, ttl_s, NOW) == pytest.approx(expected)


def test_next_look_never_spins() -> None:
    almost = view(NOW - timedelta(seconds=30) + timedelta(microseconds=1))
    assert next_look(almost, 30, NOW) >= MIN_LOOK_S


# --- held_message -----------------------------------------------------------------------------


async def put_record(store: MemoryStore, host: str | None, pid: int | None) -> None:
    stamp = format_rfc3339(datetime.now(UTC))
    await store.put(LEASE_KEY, LeaseRecord(OTHER, stamp, stamp, 30, host, pid).encode(), OVERWRITE)


@pytest.fixture
def stand_in() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes whose command lines look like mushroom-backup commands."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=10)


def looks_like(started: list[subprocess.Popen[bytes]], *argv: str) -> int:
    program = "import sys; print('up', flush=True); sys.stdin.read()"
    process = subprocess.Popen(
        [sys.executable, "-c", program, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    started.append(process)
    assert process.stdout is not None
    assert process.stdout.readline() == b"up\n"  # its command line is in place by now
    return process.pid


async def test_the_service_on_this_host_is_triggered_not_raced(
    stand_in: list[subprocess.Popen[bytes]],
) -> None:
    store = MemoryStore()
    pid = looks_like(stand_in, "/usr/local/bin/mushroom-backup", "--config", "x.toml", "run")
    await put_record(store, socket.gethostname(), pid)
    message = await held_message(store, LeaseHeld(OTHER))
    assert f"the mushroom-backup service on this host (pid {pid}) holds the lease" in message
    assert "systemctl kill -s USR1 mushroom-backup" in message
    assert f"kill -USR1 {pid}" in message


async def test_a_one_shot_backup_on_this_host_is_not_called_the_service(
    stand_in: list[subprocess.Popen[bytes]],
) -> None:
    store = MemoryStore()
    pid = looks_like(stand_in, "mushroom-backup", "backup", "now")
    await put_record(store, socket.gethostname(), pid)
    message = await held_message(store, LeaseHeld(OTHER))
    assert f"another mushroom-backup process on this host (pid {pid})" in message
    assert "USR1" not in message
    assert "--wait-lease" in message


@pytest.mark.parametrize(
    ("host", "pid", "expected"),
    [
        ("db2.example", 77, f"held by another instance ({OTHER} on host db2.example)"),
        (None, None, f"held by another instance ({OTHER})"),
    ],
)
async def test_a_holder_elsewhere_is_named_with_its_host(
    host: str | None, pid: int | None, expected: str
) -> None:
    store = MemoryStore()
    await put_record(store, host, pid)
    message = await held_message(store, LeaseHeld(OTHER))
    assert expected in message
    assert "--wait-lease SECONDS" in message


# --- acquire_lease ------------------------------------------------------------------------------


async def test_waiting_for_the_lease_takes_it_as_soon_as_it_goes_stale() -> None:
    clock = FakeClock()
    store = MemoryStore(now=clock.wall)
    holder = await BucketLease.acquire(store, ttl_s=30, instance_id=OTHER, clock=clock)
    clock.advance(7)
    await holder.renew()  # then the holder dies
    settings = Settings.model_validate({"lease": {"ttl_s": 30}})
    waiting = asyncio.create_task(acquire_lease(store, settings, clock=clock, wait_s=120))
    began = clock.monotonic()
    while not waiting.done():
        deadline = clock.next_deadline()
        if deadline is None:
            await asyncio.sleep(0)
            continue
        clock.advance(deadline - clock.monotonic())
        for _ in range(50):
            await asyncio.sleep(0)
    lease = waiting.result()
    assert lease.instance_id != OTHER
    assert 30 <= clock.monotonic() - began <= 30 + MIN_LOOK_S + 1e-6


async def test_waiting_gives_up_after_the_wait_naming_the_holder() -> None:
    clock = FakeClock()
    store = MemoryStore(now=clock.wall)
    holder = await BucketLease.acquire(store, ttl_s=30, instance_id=OTHER, clock=clock)
    settings = Settings.model_validate({"lease": {"ttl_s": 30}})
    waiting = asyncio.create_task(acquire_lease(store, settings, clock=clock, wait_s=25))
    while not waiting.done():
        deadline = clock.next_deadline()
        if deadline is not None:
            clock.advance(deadline - clock.monotonic())
            await holder.renew()
        for _ in range(50):
            await asyncio.sleep(0)
    with pytest.raises(LeaseHeld) as held:
        waiting.result()
    assert held.value.instance_id == OTHER
    assert 25 <= clock.monotonic() - 1000.0 <= 26


# --- SnapshotRunner ---------------------------------------------------------------------------


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    root.mkdir()
    (root / "a").write_bytes(b"a" * 10_000)
    return root


async def runner_with_stalled_upload(source: Path) -> tuple[SnapshotRunner, FaultyStore, Stall]:
    clock = FakeClock()
    store = FaultyStore(MemoryStore(now=clock.wall))
    lease = await BucketLease.acquire(store, ttl_s=30, clock=clock)
    gate = store.stall("put", key=lambda k: k.startswith("data/"))
    runner = SnapshotRunner(store, lease, Settings.model_validate({}), clock)
    return runner, store, gate


async def test_a_lost_lease_turns_the_snapshot_into_lease_lost(source: Path) -> None:
    runner, store, gate = await runner_with_stalled_upload(source)
    snapshot = asyncio.create_task(runner.snapshot(source))
    await asyncio.wait_for(gate.entered.wait(), 20)  # an upload is in flight
    runner.lease_lost(LeaseLost(OTHER))
    with pytest.raises(LeaseLost, match="LATEST still names the previous snapshot"):
        await snapshot
    assert await read_latest(store) is None
    with pytest.raises(LeaseLost):  # and it refuses to start another
        await runner.snapshot(source)
    assert gate.waiting == 0  # the stalled upload was cancelled


async def test_cancelling_the_caller_stays_a_cancellation_even_if_the_lease_is_lost(
    source: Path,
) -> None:
    runner, store, gate = await runner_with_stalled_upload(source)
    snapshot = asyncio.create_task(runner.snapshot(source))
    await asyncio.wait_for(gate.entered.wait(), 20)  # an upload is in flight
    snapshot.cancel()
    runner.lease_lost(LeaseLost(OTHER))
    with pytest.raises(asyncio.CancelledError):
        await snapshot
    assert snapshot.cancelled()
    assert await read_latest(store) is None
    assert gate.waiting == 0  # the stalled upload was cancelled


# --- backup_now: the source ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "what"), [(None, "does not exist"), (b"a file", "is not a directory")]
)
async def test_a_missing_or_non_directory_source_is_a_usage_error(
    tmp_path: Path, make: bytes | None, what: str
) -> None:
    path = tmp_path / "src"
    if make is not None:
        path.write_bytes(make)
    store = MemoryStore()
    settings = Settings.model_validate({"store": "memory://x", "source": str(path)})
    with pytest.raises(UsageError) as error:
        await backup_now(settings, store=store)
    assert error.value.exit_code == EXIT_USAGE
    assert f"the source {path} {what}" in error.value.message
    assert "--source DIR" in error.value.message
    assert store.keys == []  # the lease was never taken
