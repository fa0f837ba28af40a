"""systemd notifications over a real unix datagram socket; the metrics endpoint scraped."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mushroom_backup.agent.metrics import Metrics, serve
from mushroom_backup.agent.notify import Notifier, watchdog_interval
from mushroom_backup.clock import FakeClock


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_notifier_speaks_the_protocol(notify_socket: tuple[str, socket.socket]) -> None:
    path, sock = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    notifier.ready("standby: lease held by abc")
    assert sock.recv(4096) == b"READY=1\nSTATUS=standby: lease held by abc"
    notifier.status("holding lease")
    notifier.status("holding lease")  # unchanged: not sent again
    notifier.watchdog()
    notifier.stopping()
    assert sock.recv(4096) == b"STATUS=holding lease"
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"
    notifier.close()


def test_abstract_socket_names_are_supported() -> None:
    name = f"mushroom-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        Notifier({"NOTIFY_SOCKET": "@" + name}).ready("up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"
    finally:
        sock.close()


def test_without_systemd_nothing_is_sent_and_nothing_fails(tmp_path: Path) -> None:
    assert not Notifier({}).enabled
    Notifier({}).ready("x")
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    gone.ready("x")  # logged once, never raised
    gone.watchdog()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "20000000"}, 10.0),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}, 10.0),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env) == expected


async def scrape(port: int, path: str = "/metrics") -> tuple[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = (await reader.read()).decode()
    writer.close()
    head, _, body = answer.partition("\r\n\r\n")
    return head.split("\r\n", 1)[0], body


async def test_metrics_endpoint_answers_with_every_series() -> None:
    clock = FakeClock()
    metrics = Metrics(lease_held=True, exclusion="best-effort", snapshots_total=2)
    metrics.last_snapshot_wall = clock.wall().timestamp() - 30
    metrics.last_snapshot_duration = 4.5
    metrics.bytes_uploaded_total = 1234
    server = await serve(metrics, "127.0.0.1:0", clock)
    port = server.sockets[0].getsockname()[1]
    try:
        status, body = await scrape(port)
        assert status == "HTTP/1.1 200 OK"
        samples = dict(
            line.rsplit(" ", 1) for line in body.splitlines() if not line.startswith("#")
        )
        assert samples["mushroom_backup_lease_held"] == "1"
        assert samples['mushroom_backup_lease_exclusion{kind="best-effort"}'] == "1"
        assert samples['mushroom_backup_lease_exclusion{kind="conditional"}'] == "0"
        assert samples["mushroom_backup_seconds_since_last_snapshot"] == "30"
        assert samples["mushroom_backup_snapshot_duration_seconds"] == "4.5"
        assert samples["mushroom_backup_bytes_uploaded_total"] == "1234"
        for name in (
            "snapshots_total",
            "snapshots_abandoned_total",
            "lease_renew_failures_total",
            "fence_closures_total",
        ):
            assert f"mushroom_backup_{name}" in samples
        status, _ = await scrape(port, "/")
        assert status == "HTTP/1.1 404 Not Found"
    finally:
        server.close()
        await server.wait_closed()
