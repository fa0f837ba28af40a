"""What makes a running service take a snapshot, on SeaweedFS with real ``run`` processes:
a file change (watch mode: within the debounce plus the minimum gap), SIGUSR1 (at once), and
what ``backup now`` says while the service holds the lease (exit 3, pointing at SIGUSR1 --
which then works). SIGHUP says that it does not reload, and the service carries on.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from mushroom_backup.cli.main import cli
from mushroom_backup.errors import EXIT_LEASE_HELD

if TYPE_CHECKING:
    from tests.integration.service_agents import Agents, agent_env, agents_fixture, stamp
else:
    from service_agents import Agents, agent_env, agents_fixture, stamp

agents = pytest.fixture(agents_fixture)

DEBOUNCE_S = 0.5
MIN_GAP_S = 1.0
#: watchfiles' own batching (200 ms debounce, 50 ms steps) and a loaded host.
WATCH_LATENCY_S = 1.0


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    root.mkdir()
    (root / "PG_VERSION").write_text("16\n")
    return root


def test_a_file_change_triggers_a_snapshot_within_the_debounce_plus_the_gap(
    seaweed_url: str, source: Path, agents: Agents
) -> None:
    env = agent_env(
        seaweed_url,
        source,
        lease_ttl="5",
        interval="3600",
        watch="on",
        debounce=str(DEBOUNCE_S),
        min_gap=str(MIN_GAP_S),
    )
    agent = agents.start("watcher", env)
    first = agent.wait_for("snapshot.completed")
    assert first["files"] == 1
    started = stamp(agent.last("snapshot.triggered"))

    changed = time.time()
    (source / "new-table").write_bytes(b"rows\n" * 1000)
    triggered = agent.wait_for("snapshot.triggered", count=2)
    assert triggered["reason"] == "change"
    latency = stamp(triggered) - changed
    print(f"\nchange -> snapshot: {latency:.2f} s (debounce {DEBOUNCE_S} s, gap {MIN_GAP_S} s)")
    assert latency <= DEBOUNCE_S + MIN_GAP_S + WATCH_LATENCY_S
    assert stamp(triggered) >= started + MIN_GAP_S  # never closer than the gap
    assert stamp(triggered) >= changed + DEBOUNCE_S  # only once the change settled
    second = agent.wait_for("snapshot.completed", count=2)
    assert second["files"] == 2

    # A burst of changes is one snapshot, not one per change.
    burst = time.time()
    for n in range(5):
        (source / f"wal-{n}").write_bytes(b"x" * 100)
    agent.wait_for("snapshot.completed", count=3)
    assert agent.last("snapshot.completed")["files"] == 7
    assert stamp(agent.last("snapshot.triggered")) >= burst + DEBOUNCE_S
    assert len(agent.events("snapshot.triggered")) == 3
    agent.send(signal.SIGTERM)
    assert agent.exit_code() == 0
    assert len(agent.events("snapshot.triggered")) == 3


def test_backup_now_points_at_the_service_and_sigusr1_takes_a_snapshot_now(
    seaweed_url: str, source: Path, agents: Agents
) -> None:
    agent = agents.start("service", agent_env(seaweed_url, source, lease_ttl="5", interval="3600"))
    agent.wait_for("snapshot.completed")

    refused = CliRunner().invoke(
        cli, ["backup", "now", "--store", seaweed_url, "--source", str(source)]
    )
    assert refused.exit_code == EXIT_LEASE_HELD, refused.output
    assert f"the mushroom-backup service on this host (pid {agent.pid}) holds the lease" in (
        refused.stderr
    )
    assert "systemctl kill -s USR1 mushroom-backup" in refused.stderr
    assert f"kill -USR1 {agent.pid}" in refused.stderr

    asked = agent.send(signal.SIGUSR1)  # what the message says to do
    triggered = agent.wait_for("snapshot.triggered", count=2)
    assert triggered["reason"] == "request"
    print(f"\nSIGUSR1 -> snapshot: {stamp(triggered) - asked:.2f} s")
    assert stamp(triggered) - asked < 1.0
    agent.wait_for("snapshot.completed", count=2)

    agent.send(signal.SIGHUP)
    reload = agent.wait_for("config.reload_unsupported")
    assert "restart" in reload["reason"]
    agent.send(signal.SIGUSR1)
    agent.wait_for("snapshot.completed", count=3)  # still serving after SIGHUP
    agent.send(signal.SIGTERM)
    assert agent.exit_code() == 0
    assert agent.last("service.stopped")["exit_code"] == 0
