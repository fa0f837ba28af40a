"""The service as systemd sees it, with a real ``run`` process on SeaweedFS: the notify socket
receives READY=1, STATUS=, WATCHDOG=1 (at half of WATCHDOG_USEC) and, on SIGTERM, STOPPING=1;
the metrics endpoint answers with every listed series."""

from __future__ import annotations

import itertools
import re
import shutil
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.integration.service_agents import Agents, agent_env, agents_fixture
    from tests.servers import free_ports
else:
    from servers import free_ports
    from service_agents import Agents, agent_env, agents_fixture

agents = pytest.fixture(agents_fixture)

WATCHDOG_USEC = 1_000_000  # keep-alives every 0.5 s

#: Every series the metrics module documents, with its type.
SERIES = {
    "lease_held": "gauge",
    "lease_exclusion": "gauge",
    "last_snapshot_timestamp": "gauge",
    "seconds_since_last_snapshot": "gauge",
    "snapshot_duration_seconds": "gauge",
    "snapshots_total": "counter",
    "snapshots_abandoned_total": "counter",
    "bytes_uploaded_total": "counter",
    "lease_renew_failures_total": "counter",
    "fence_closures_total": "counter",
}


@pytest.fixture
def notify_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket standing in for systemd's (a short path: unix paths max ~107)."""
    directory = tempfile.mkdtemp(prefix="mb-notify-")
    path = f"{directory}/notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    try:
        yield path, sock
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)


class Datagrams:
    """Everything the service sent to the socket, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received: list[tuple[float, list[str]]] = []

    def lines(self) -> list[str]:
        return [line for _, datagram in self.received for line in datagram]

    def until(self, what: str, condition: object, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not (condition() if callable(condition) else False):
            if time.monotonic() > deadline:
                pytest.fail(f"not within {timeout} s: {what}; got {self.lines()}")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.received.append((time.monotonic(), data.decode().split("\n")))


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, for every sample line."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name.removeprefix("mushroom_backup_")] = float(value)
    return found


def test_notify_socket_and_metrics_endpoint(
    seaweed_url: str,
    tmp_path: Path,
    agents: Agents,
    notify_socket: tuple[str, socket.socket],
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "PG_VERSION").write_text("16\n")
    path, sock = notify_socket
    (port,) = free_ports(1)
    env = agent_env(
        seaweed_url,
        source,
        lease_ttl="5",
        interval="3600",
        metrics_listen=f"127.0.0.1:{port}",
        NOTIFY_SOCKET=path,
        WATCHDOG_USEC=str(WATCHDOG_USEC),
    )
    agent = agents.start("service", env)
    got = Datagrams(sock)
    got.until("READY=1", lambda: "READY=1" in got.lines())
    ready = next(d for _, d in got.received if "READY=1" in d)
    assert any(line.startswith("STATUS=standby") for line in ready)  # sent with READY=1
    got.until(
        "STATUS=holding lease; last snapshot ...",
        lambda: any(line.startswith("STATUS=holding lease; last") for line in got.lines()),
    )
    got.until("three keep-alives", lambda: got.lines().count("WATCHDOG=1") >= 3)
    beats = [at for at, d in got.received if d == ["WATCHDOG=1"]]
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    # Every WATCHDOG_USEC / 2: never so late that systemd's watchdog would fire, nor spamming.
    assert all(0.3 <= gap < WATCHDOG_USEC / 1e6 for gap in gaps), gaps

    agent.wait_for("snapshot.completed")
    status, text = scrape(port)
    assert status == 200
    for name, kind in SERIES.items():
        assert f"# TYPE mushroom_backup_{name} {kind}" in text, name
    values = samples(text)
    assert values["lease_held"] == 1
    assert values['lease_exclusion{kind="conditional"}'] == 1
    assert values['lease_exclusion{kind="best-effort"}'] == 0
    assert values["snapshots_total"] == 1
    assert values["snapshots_abandoned_total"] == 0
    assert values["bytes_uploaded_total"] > 0
    assert abs(values["last_snapshot_timestamp"] - time.time()) < 60
    assert 0 <= values["seconds_since_last_snapshot"] < 60
    assert values["snapshot_duration_seconds"] > 0
    assert values["lease_renew_failures_total"] == 0
    assert values["fence_closures_total"] == 0
    assert re.search(r"^mushroom_backup_lease_held 1$", text, re.MULTILINE)
    assert scrape(port, "/")[0] == 404

    agent.send(signal.SIGTERM)
    got.until("STOPPING=1", lambda: "STOPPING=1" in got.lines())
    assert agent.exit_code() == 0
    stopping = got.lines().index("STOPPING=1")
    assert "READY=1" in got.lines()[:stopping]
