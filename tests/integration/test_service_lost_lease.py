"""A lost lease cancels the snapshot in flight, and ``LATEST`` still names a complete snapshot
(a real ``run`` process on SeaweedFS, TTL 3 s).

The holder is frozen (SIGSTOP, as a VM is paused) while its second snapshot uploads 64 MiB;
once its lease has expired, a contender takes it over the proper way (a compare-and-swap over
the stale record); then the holder resumes (SIGCONT). It must find its write fence closed and
its lease gone: the snapshot is abandoned with no manifest, ``LATEST`` still names the first
snapshot (which restores and verifies), nothing more is written, the service goes back to
standby naming the new holder -- it does not exit -- and takes the lease again once that
holder's lease expires.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from mushroom_backup.lease.bucket import BucketLease, read_lease
from mushroom_backup.lease.record import parse_rfc3339
from mushroom_backup.snapshot.catalog import read_latest
from mushroom_backup.snapshot.manifest import MANIFESTS_PREFIX
from mushroom_backup.snapshot.restore import restore_snapshot
from mushroom_backup.store import open_store

if TYPE_CHECKING:
    from tests.integration.service_agents import (
        Agents,
        agent_env,
        agents_fixture,
        stamp,
        wait_until,
    )
else:
    from service_agents import Agents, agent_env, agents_fixture, stamp, wait_until

T = TypeVar("T")
TTL_S = 3
THIEF = "7" * 32
BIG = 64 << 20

agents = pytest.fixture(agents_fixture)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def keys(url: str) -> set[str]:
    async with open_store(url) as store:
        return {info.key async for info in store.list("")}


async def latest(url: str) -> str | None:
    async with open_store(url) as store:
        ref = await read_latest(store)
        return None if ref is None else ref.snapshot_id


async def lease_expires_at(url: str) -> float:
    async with open_store(url) as store:
        view = await read_lease(store)
        assert view is not None
        assert view.record is not None
        renewed = parse_rfc3339(view.record.renewed_at).timestamp()
        return renewed + view.record.ttl_s


async def take_over(url: str) -> None:
    async with open_store(url) as store:
        await BucketLease.acquire(store, ttl_s=TTL_S, instance_id=THIEF)


async def verify(url: str, snapshot_id: str) -> int:
    async with open_store(url) as store:
        result = await restore_snapshot(store, snapshot_id, None, verify_only=True)
        return result.files


def test_a_frozen_holder_that_lost_its_lease_abandons_its_snapshot(
    seaweed_url: str, tmp_path: Path, agents: Agents
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "PG_VERSION").write_text("16\n")
    agent = agents.start("holder", agent_env(seaweed_url, source, lease_ttl=str(TTL_S)))
    agent.wait_for("snapshot.completed")
    first = run(latest(seaweed_url))
    assert first is not None
    with open(source / "big-table", "wb") as big:
        for _ in range(BIG >> 20):
            big.write(os.urandom(1 << 20))

    agent.send(signal.SIGUSR1)
    in_flight = agent.wait_for("snapshot.started", count=2)["snapshot_id"]
    agent.send(signal.SIGSTOP)
    if agent.events("snapshot.completed", snapshot_id=in_flight):
        pytest.fail("the snapshot finished before the freeze; make the source bigger")

    # Frozen until its lease has expired; then another instance takes it over properly.
    expires = run(lease_expires_at(seaweed_url))
    wait_until(lambda: time.time() > expires + 0.05, "the frozen holder's lease expiring", 10)
    run(take_over(seaweed_url))
    resumed = agent.send(signal.SIGCONT)

    abandoned = agent.wait_for("snapshot.abandoned")
    lost = agent.wait_for("service.lease_lost")
    standby = agent.wait_for("service.standby")
    took = stamp(abandoned) - resumed
    print(f"\nresumed -> abandoned: {took:.2f} s ({abandoned['reason']})")
    assert took < 1.0
    assert any(word in abandoned["reason"] for word in ("fence", THIEF))
    assert THIEF in lost["reason"]
    assert standby["holder"] == THIEF
    assert standby["holder_host"] == socket.gethostname()
    after_loss = run(keys(seaweed_url))

    assert run(latest(seaweed_url)) == first
    assert f"{MANIFESTS_PREFIX}{in_flight}" not in after_loss
    assert run(verify(seaweed_url, first)) == 1  # LATEST names a complete, restorable snapshot

    # It never exits for a lost lease: once the new holder's lease expires, it takes it back.
    retaken = agent.wait_for("lease.acquired", count=2, timeout=3 * TTL_S)
    assert retaken["taken_from"] == THIEF
    assert agent.process.poll() is None
    agent.send(signal.SIGTERM)
    assert agent.exit_code() == 0
    assert len(agent.events("snapshot.completed")) == 1  # the interval is counted from LATEST
    assert run(keys(seaweed_url)) == after_loss - {"LEASE"}  # nothing written after the loss
