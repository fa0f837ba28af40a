"""A Prometheus text endpoint for the service, on asyncio, with no extra dependency.

:class:`Metrics` holds the service's gauges and counters as plain attributes; the service
updates them. :func:`serve` answers ``GET /metrics`` (anything else: 404) with the text
exposition format (version 0.0.4). Series (all prefixed ``mushroom_backup_``):

- ``lease_held`` (gauge): 1 while this process holds the bucket lease;
- ``lease_exclusion{kind}`` (gauge): 1 for the current kind (conditional / best-effort);
- ``last_snapshot_timestamp``, ``seconds_since_last_snapshot`` (gauges; absent before the
  first snapshot) and ``snapshot_duration_seconds`` (gauge, the last successful one);
- ``snapshots_total``, ``snapshots_abandoned_total`` (fence closed, lease lost, error),
  ``bytes_uploaded_total``, ``lease_renew_failures_total``, ``fence_closures_total`` (counters).

Not promised: histograms; authentication (bind it to loopback).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..clock import Clock


@dataclass
class Metrics:
    lease_held: bool = False
    exclusion: str = "conditional"
    last_snapshot_wall: float | None = None
    last_snapshot_duration: float | None = None
    snapshots_total: int = 0
    snapshots_abandoned_total: int = 0
    bytes_uploaded_total: int = 0
    renew_failures_total: int = 0
    fence_closures_total: int = 0

    def render(self, now_wall: float) -> str:
        """The text exposition of every series at ``now_wall`` (Unix seconds)."""
        lines: list[str] = []

        def series(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            full = f"mushroom_backup_{name}"
            lines.append(f"# HELP {full} {help_}")
            lines.append(f"# TYPE {full} {kind}")
            for labels, value in samples:
                lines.append(f"{full}{labels} {_number(value)}")

        series(
            "lease_held",
            "gauge",
            "1 while this process holds the bucket lease.",
            [("", 1.0 if self.lease_held else 0.0)],
        )
        series(
            "lease_exclusion",
            "gauge",
            "The lease's exclusion kind (1 = current).",
            [
                (f'{{kind="{kind}"}}', 1.0 if self.exclusion == kind else 0.0)
                for kind in ("conditional", "best-effort")
            ],
        )
        if self.last_snapshot_wall is not None:
            series(
                "last_snapshot_timestamp",
                "gauge",
                "Unix time of the last successful snapshot.",
                [("", self.last_snapshot_wall)],
            )
            series(
                "seconds_since_last_snapshot",
                "gauge",
                "Seconds since the last successful snapshot.",
                [("", max(0.0, now_wall - self.last_snapshot_wall))],
            )
        if self.last_snapshot_duration is not None:
            series(
                "snapshot_duration_seconds",
                "gauge",
                "Duration of the last successful snapshot.",
                [("", self.last_snapshot_duration)],
            )
        series(
            "snapshots_total",
            "counter",
            "Successful snapshots.",
            [("", float(self.snapshots_total))],
        )
        series(
            "snapshots_abandoned_total",
            "counter",
            "Snapshots abandoned (fence closed, lease lost or error).",
            [("", float(self.snapshots_abandoned_total))],
        )
        series(
            "bytes_uploaded_total",
            "counter",
            "Bytes sent to the store.",
            [("", float(self.bytes_uploaded_total))],
        )
        series(
            "lease_renew_failures_total",
            "counter",
            "Lease renewals that failed.",
            [("", float(self.renew_failures_total))],
        )
        series(
            "fence_closures_total",
            "counter",
            "Times the write fence closed.",
            [("", float(self.fence_closures_total))],
        )
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """A sample value without losing digits (``:g`` keeps six: a Unix timestamp would be off
    by over an hour): whole numbers as integers, others as the shortest exact decimal."""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


async def serve(metrics: Metrics, listen: str, clock: Clock) -> asyncio.Server:
    """Start answering ``GET /metrics`` on ``HOST:PORT``; the caller closes the server."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method == "GET" and path.split("?", 1)[0] == "/metrics":
                body = metrics.render(clock.wall().timestamp()).encode()
                head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            else:
                body = b"not found: try /metrics\n"
                head = "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(
                f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, int(port))
