"""The process lease against real S3 services on 127.0.0.1 (moto's server and SeaweedFS), with
real processes: two agents for one node id, the holder killed, fenced from a third process by
``mushroom-backup node fence``, the certificate verified; and pruning under load keeping every
fence.

Real time passes only where a TTL must (1 s here); the in-process test drives the observation
with a FakeClock and waits for real I/O only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import EXIT_LEASE_HELD
from mushroom_backup.lease.process import (
    Acquired,
    Participant,
    ProcessLeaseAuthority,
    ProcessLeaseFence,
    ProcessLeaseStore,
)
from mushroom_backup.lease.process.record import fence_key, lease_key, lease_prefix
from mushroom_backup.store import ObjectStore, open_store

REPO = Path(__file__).resolve().parents[2]
NODE_SCRIPT = Path(__file__).with_name("_process_lease_node.py")
NODE = 4
TTL_S = "1"


def _env() -> dict[str, str]:
    env = dict(os.environ)  # the fixture applied the server's AWS_* variables
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def start_agent(root: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(NODE_SCRIPT), root, str(NODE), TTL_S, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
    )


def holding(agent: subprocess.Popen[str]) -> dict[str, object]:
    """The agent's first line: it holds the node (or it died, and the test shows why)."""
    assert agent.stdout is not None
    line = agent.stdout.readline()
    if not line:
        agent.wait(timeout=10)
        pytest.fail(
            f"agent exited {agent.returncode}: {agent.stderr.read() if agent.stderr else ''}"
        )
    info: dict[str, object] = json.loads(line)
    return info


def node_cli(root: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mushroom_backup", "node", *args, "--root", root, "--ttl", TTL_S],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )


def stop(agent: subprocess.Popen[str]) -> None:
    if agent.poll() is None:
        agent.kill()
    agent.communicate(timeout=10)


def test_a_killed_holder_is_fenced_from_a_third_process_and_the_certificate_verifies(
    s3_url: str,
) -> None:
    first = start_agent(s3_url)
    try:
        incarnation = str(holding(first)["incarnation"])
        second = start_agent(s3_url)
        _, refused = second.communicate(timeout=30)
        assert second.returncode == EXIT_LEASE_HELD, refused
        assert incarnation in refused

        alive = node_cli(s3_url, "fence", "--node", str(NODE), "--incarnation", incarnation)
        assert alive.returncode == EXIT_LEASE_HELD, alive.stderr  # it renewed meanwhile
        assert "renewed during the full-TTL observation" in alive.stderr
        current = node_cli(s3_url, "verify", "--node", str(NODE), "--incarnation", incarnation)
        assert current.returncode == 0, current.stderr

        first.kill()
        first.wait(timeout=10)
        began = time.monotonic()
        fenced = node_cli(
            s3_url, "fence", "--node", str(NODE), "--incarnation", incarnation, "--io-budget", "20"
        )
        assert fenced.returncode == 0, fenced.stderr
        assert time.monotonic() - began >= 1.0  # at least one TTL of observation
    finally:
        stop(first)

    certificate = ProcessLeaseFence.decode(fenced.stdout.strip().encode())
    assert certificate.predecessor.owner == UUID(incarnation)
    assert certificate.successor.term == certificate.predecessor.term + 1
    holds = node_cli(s3_url, "verify", "--node", str(NODE), "--fence", "-", stdin=fenced.stdout)
    assert (holds.returncode, holds.stdout.strip()) == (0, "fence holds")
    gone = node_cli(s3_url, "verify", "--node", str(NODE), "--incarnation", incarnation)
    assert (gone.returncode, gone.stdout.strip()) == (1, "not current")

    # A new agent takes the node over from the revoker (which never renews) after one TTL.
    third = start_agent(s3_url, "--takeover")
    try:
        assert holding(third)["term"] == certificate.successor.term + 1
        still = node_cli(s3_url, "verify", "--node", str(NODE), "--fence", "-", stdin=fenced.stdout)
        assert still.returncode == 0, still.stderr  # a later term keeps the revocation
    finally:
        stop(third)


@pytest.fixture
async def root_store(s3_url: str) -> AsyncIterator[ObjectStore]:
    async with open_store(s3_url) as store:
        yield store


async def test_pruning_under_load_keeps_every_fence(root_store: ObjectStore) -> None:
    clock = FakeClock()
    ttl_ms = 1_000
    a, b = uuid4(), uuid4()
    leases = ProcessLeaseStore(root_store, NODE, ttl_ms, clock=clock)  # production bounds
    retain = leases.bounds.history_to_retain
    now_ms = 1_796_000_000_000
    for _ in range(40):
        assert isinstance(await leases.try_acquire(a, now_ms), Acquired)
    head = await leases.load()
    assert head is not None
    observation = leases.observe_rival(head)
    clock.advance(ttl_ms / 1000)
    taken = await ProcessLeaseStore(root_store, NODE, ttl_ms, clock=clock).try_takeover(
        b, observation, now_ms
    )
    assert isinstance(taken, Acquired)
    for _ in range(70):  # renewals keep coming while background prunes delete history
        outcome = await leases.try_acquire(b, now_ms)
        assert isinstance(outcome, Acquired)
        assert outcome.lease.term == 2
    await leases.wait_prune()
    assert leases.healthy
    assert len(await leases.read_history()) < 111  # the background prunes kept up
    await leases.prune_history()

    history = await leases.read_history()
    assert [record.seq for record in history] == list(range(111 - retain + 1, 112))
    keys = [info.key async for info in root_store.list(lease_prefix(NODE))]
    assert lease_key(NODE, head.seq) not in keys  # the takeover pair itself is pruned
    assert lease_key(NODE, head.seq + 1) not in keys

    fence = await leases.find_takeover_from(a)
    assert fence == ProcessLeaseFence(head, taken.lease)
    authority = ProcessLeaseAuthority(root_store, timedelta(milliseconds=ttl_ms), clock=clock)
    deadline = clock.monotonic() + 30
    assert await authority.verify_fence(fence, deadline)
    assert await authority.verify_current_participant_term(Participant(NODE, b), 2, deadline)
    assert not await authority.verify_current_participant(Participant(NODE, a), deadline)
    assert fence_key(NODE, a) in [info.key async for info in root_store.list(fence_key(NODE, a))]
    await leases.close()
