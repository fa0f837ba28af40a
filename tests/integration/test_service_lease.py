"""Several ``mushroom-backup run`` processes on one prefix, on SeaweedFS (real compare-and-swap),
with a 3 s lease TTL and a snapshot every second.

What is shown, from the processes' JSON logs and from the bucket:

* exactly one process holds the lease at a time: holding periods (``lease.acquired`` until
  ``lease.released`` / ``service.lease_lost`` / the SIGKILL) never overlap, and every snapshot
  (``snapshot.triggered`` .. ``snapshot.completed``) lies inside its process's holding period;
* between them they take every scheduled snapshot: no gap between consecutive snapshot starts
  is longer than the interval (or the snapshot before it) plus a small slack, except a
  handover, after which the new holder starts at once or one interval after the snapshot
  ``LATEST`` names;
* the manifests form one chain (each names the previous as parent) and ``LATEST`` names the
  last: no writer ever raced another;
* a SIGKILLed holder is replaced within one TTL plus one retry interval (and not before its
  lease expired); a SIGTERMed holder releases the lease, and a standby takes it within one
  retry interval, without waiting for the TTL.

Measured times are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.lease.bucket import read_lease
from mushroom_backup.snapshot.catalog import SnapshotInfo, list_snapshots
from mushroom_backup.store import open_store

if TYPE_CHECKING:
    from tests.integration.service_agents import (
        Agent,
        Agents,
        agent_env,
        agents_fixture,
        stamp,
        wait_until,
    )
else:
    from service_agents import Agent, Agents, agent_env, agents_fixture, stamp, wait_until

TTL_S = 3
RETRY_S = 1.0  # lease_retry_interval(3)
INTERVAL_S = 1.0
#: Scheduling slack: a snapshot may start this much later than its moment (loaded CI host).
SLACK_S = 0.5
#: Log stamps are milliseconds, truncated.
STAMP_S = 0.002

agents = pytest.fixture(agents_fixture)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    (root / "base").mkdir(parents=True)
    (root / "PG_VERSION").write_text("16\n")
    for n in range(20):
        (root / "base" / f"{16384 + n}").write_bytes(bytes([n]) * 40_000)
    return root


def env(url: str, source: Path) -> dict[str, str]:
    return agent_env(url, source, lease_ttl=str(TTL_S), interval=str(INTERVAL_S))


def holding_periods(agent: Agent) -> list[tuple[float, float]]:
    """[acquired, released/lost/killed] for every time ``agent`` held the lease."""
    periods = []
    for event in agent.events():
        name = event.get("event")
        if name == "lease.acquired":
            periods.append([stamp(event), float("inf")])
        elif name in ("lease.released", "service.lease_lost") and periods:
            periods[-1][1] = min(periods[-1][1], stamp(event))
    if periods and periods[-1][1] == float("inf") and agent.killed_at is not None:
        periods[-1][1] = agent.killed_at
    return [(start, end) for start, end in periods]


def snapshots_of(agent: Agent) -> list[tuple[float, float, str]]:
    """(triggered, completed, snapshot id) of every snapshot ``agent`` completed."""
    out = []
    triggered: float | None = None
    for event in agent.events():
        if event.get("event") == "snapshot.triggered":
            triggered = stamp(event)
        elif event.get("event") == "snapshot.completed":
            assert triggered is not None
            out.append((triggered, stamp(event), str(event["snapshot_id"])))
    return out


def check_one_writer_and_every_snapshot(url: str, all_agents: list[Agent]) -> None:
    """The invariants of the module docstring, over every agent's log and the bucket."""
    # 1. Holding periods never overlap.
    periods = sorted((p, a.name) for a in all_agents for p in holding_periods(a))
    for ((_, end), name), ((start, _), next_name) in itertools.pairwise(periods):
        assert start >= end - STAMP_S, f"{next_name} acquired before {name} let go: {periods}"
    # 2. Every snapshot inside its holder's period; snapshot windows disjoint.
    windows = []
    for agent in all_agents:
        mine = holding_periods(agent)
        for triggered, completed, snapshot_id in snapshots_of(agent):
            assert any(s - STAMP_S <= triggered and completed <= e + STAMP_S for s, e in mine), (
                f"{agent.name} wrote {snapshot_id} outside its holding periods {mine}"
            )
            windows.append((triggered, completed, agent.name, snapshot_id))
    windows.sort()
    for (_, end, who, _), (start, _, next_who, _) in itertools.pairwise(windows):
        assert start >= end - STAMP_S, f"{next_who} snapshot began before {who}'s ended"
    # 3. Every scheduled snapshot: no gap longer than the schedule allows.
    acquired = {a.name: [stamp(e) for e in a.events("lease.acquired")] for a in all_agents}
    for (t1, c1, who, _), (t2, _, next_who, _) in itertools.pairwise(windows):
        due = t1 + max(INTERVAL_S, c1 - t1)
        if next_who != who:  # a handover: at once, or one interval after LATEST's snapshot
            taken = max(x for x in acquired[next_who] if x <= t2 + STAMP_S)
            due = max(taken, t1 + INTERVAL_S)
        assert t2 <= due + SLACK_S, f"{next_who} started {t2 - due:.2f} s late after {who}"
        assert t2 >= t1 + INTERVAL_S - 0.05, "a snapshot before the interval was up"
    for agent in all_agents:
        reasons = {e["reason"] for e in agent.events("snapshot.triggered")}
        assert reasons <= {"interval"}, reasons
        assert not agent.events("snapshot.abandoned"), agent.tail()
        assert not agent.events("snapshot.failed"), agent.tail()
    # 4. The bucket: one chain of manifests, LATEST at its end, each by its process.
    chain = [w[3] for w in windows]
    by_id = {w[3]: w[2] for w in windows}
    instances = {a.instance_id: a.name for a in all_agents}

    async def inspect() -> tuple[list[SnapshotInfo], bool]:
        async with open_store(url) as store:
            return await list_snapshots(store), await read_lease(store) is None

    infos, lease_gone = asyncio.run(inspect())
    stored = {info.snapshot_id: info for info in infos}
    assert set(chain) <= set(stored)
    for extra in set(stored) - set(chain):  # only a killed holder may leave one behind
        assert instances[stored[extra].writer_instance] in {
            a.name for a in all_agents if a.killed_at is not None
        }
    for previous, current in itertools.pairwise(chain):
        assert stored[current].header.parent_id == previous, "the chain forked"
    for snapshot_id, who in by_id.items():
        assert instances[stored[snapshot_id].writer_instance] == who
    assert stored[chain[-1]].is_latest
    assert lease_gone, "the last holder released the lease"


def test_three_services_one_writer_at_a_time_sigkill_and_sigterm_handovers(
    seaweed_url: str, source: Path, agents: Agents
) -> None:
    environment = env(seaweed_url, source)
    trio = [agents.start(name, environment) for name in ("a", "b", "c")]
    first = wait_for_new_holder(trio, set())
    first.wait_for("snapshot.completed", count=3)
    for other in trio:
        if other is not first:
            standby = other.wait_for("service.standby")
            assert standby["holder"] == first.instance_id
            assert standby["holder_pid"] == first.pid

    killed = first.send(signal.SIGKILL)
    first.exit_code()
    second = wait_for_new_holder(trio, {first.name})
    took = stamp(second.last("lease.acquired")) - killed
    print(f"\nSIGKILL takeover: {took:.2f} s (TTL {TTL_S} s, retry {RETRY_S} s)")
    assert second.last("lease.acquired")["taken_from"] == first.instance_id
    assert TTL_S - TTL_S / 3 - 0.1 <= took <= TTL_S + RETRY_S + SLACK_S
    second.wait_for("snapshot.completed", count=3)

    terminated = second.send(signal.SIGTERM)
    assert second.exit_code() == 0
    third = wait_for_new_holder(trio, {first.name, second.name})
    took = stamp(third.last("lease.acquired")) - terminated
    print(f"SIGTERM takeover: {took:.2f} s (no TTL wait: the lease was released)")
    assert third.last("lease.acquired")["taken_from"] is None  # released, not expired
    assert took < TTL_S - TTL_S / 3  # sooner than any takeover of an unreleased lease
    third.wait_for("snapshot.completed", count=3)
    assert third.send(signal.SIGTERM)
    assert third.exit_code() == 0

    check_one_writer_and_every_snapshot(seaweed_url, trio)


def test_two_services_hand_the_lease_back_and_forth_on_sigterm(
    seaweed_url: str, source: Path, agents: Agents
) -> None:
    environment = env(seaweed_url, source)
    a = agents.start("a", environment)
    a.wait_for("snapshot.completed", count=2)
    b = agents.start("b", environment)
    standby = b.wait_for("service.standby")
    assert standby["holder"] == a.instance_id
    assert standby["holder_pid"] == a.pid
    assert standby["holder_host"]
    a.wait_for("snapshot.completed", count=4)

    terminated = a.send(signal.SIGTERM)
    assert a.exit_code() == 0
    b.wait_for("lease.acquired")
    took_b = stamp(b.last("lease.acquired")) - terminated
    b.wait_for("snapshot.completed", count=2)
    a2 = agents.start("a2", environment)
    assert a2.wait_for("service.standby")["holder"] == b.instance_id
    b.wait_for("snapshot.completed", count=4)

    terminated = b.send(signal.SIGTERM)
    assert b.exit_code() == 0
    a2.wait_for("lease.acquired")
    took_a = stamp(a2.last("lease.acquired")) - terminated
    print(f"\nSIGTERM takeovers: {took_b:.2f} s, {took_a:.2f} s (TTL {TTL_S} s)")
    assert took_b < TTL_S - TTL_S / 3
    assert took_a < TTL_S - TTL_S / 3
    a2.wait_for("snapshot.completed", count=2)
    assert a2.send(signal.SIGTERM)
    assert a2.exit_code() == 0

    check_one_writer_and_every_snapshot(seaweed_url, [a, b, a2])


def wait_for_new_holder(all_agents: list[Agent], excluded: set[str]) -> Agent:
    """The agent, not in ``excluded``, that takes the lease next (waits for it)."""
    found: list[Agent] = []

    def taken() -> bool:
        found[:] = [a for a in all_agents if a.name not in excluded and a.events("lease.acquired")]
        return bool(found)

    wait_until(taken, "a new holder", 30, all_agents)
    assert len(found) == 1, f"two holders at once: {[a.name for a in found]}"
    return found[0]
