"""The process lease inside real ``run`` processes on SeaweedFS: node identity before anything
else, a second process for the same node refused (exit 3) while the first lives, ``--takeover``
after the holder died (term 2), and every manifest stamped with node, incarnation and term."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.errors import EXIT_LEASE_HELD
from mushroom_backup.snapshot.catalog import load_manifest
from mushroom_backup.snapshot.manifest import WriterInfo
from mushroom_backup.store import open_store

if TYPE_CHECKING:
    from tests.integration.service_agents import Agents, agent_env, agents_fixture
else:
    from service_agents import Agents, agent_env, agents_fixture

agents = pytest.fixture(agents_fixture)
NODE = "7"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    root.mkdir()
    (root / "PG_VERSION").write_text("16\n")
    return root


def cluster_env(store_url: str, source: Path) -> dict[str, str]:
    return agent_env(
        store_url,
        source,
        lease_ttl="3",
        interval="3600",
        cluster_root=store_url + "-cluster",
        node_id=NODE,
        cluster_ttl="2",
    )


def writer_of(store_url: str, snapshot_id: str) -> WriterInfo:
    async def read() -> WriterInfo:
        async with open_store(store_url) as store:
            return (await load_manifest(store, snapshot_id)).header.writer

    return asyncio.run(read())


def test_a_node_id_is_held_by_one_process_and_taken_over_after_it_died(
    seaweed_url: str, source: Path, agents: Agents
) -> None:
    env = cluster_env(seaweed_url, source)
    first = agents.start("first", env)
    acquired = first.wait_for("process_lease.acquired")
    assert acquired["node"] == int(NODE)
    assert acquired["term"] == 1
    done = first.wait_for("snapshot.completed")
    stamp = writer_of(seaweed_url, done["snapshot_id"])
    assert (stamp.node_id, stamp.boot_incarnation, stamp.process_term) == (
        int(NODE),
        acquired["incarnation"],
        1,
    )

    second = agents.start("second", env)
    assert second.exit_code() == EXIT_LEASE_HELD
    refusal = second.tail()
    assert f"node {NODE} is held by process incarnation {acquired['incarnation']}" in refusal
    assert not second.events("lease.acquired"), "a refused node touched the backup prefix"

    first.send(signal.SIGKILL)
    assert first.exit_code() == -signal.SIGKILL
    third = agents.start("third", env, "--takeover")
    taken = third.wait_for("process_lease.acquired", timeout=60)
    assert taken["term"] == 2
    assert taken["incarnation"] != acquired["incarnation"]
    third.wait_for("lease.acquired", timeout=30)
    third.send(signal.SIGUSR1)  # the interval counts from the first's snapshot: ask for one
    later = third.wait_for("snapshot.completed", timeout=30)
    stamp = writer_of(seaweed_url, later["snapshot_id"])
    assert (stamp.node_id, stamp.boot_incarnation, stamp.process_term) == (
        int(NODE),
        taken["incarnation"],
        2,
    )
    third.send(signal.SIGTERM)
    assert third.exit_code() == 0
