"""systemd's ``sd_notify`` protocol, written against ``NOTIFY_SOCKET`` directly.

:class:`Notifier` sends ``READY=1``, ``STATUS=…``, ``WATCHDOG=1`` and ``STOPPING=1`` datagrams to
the unix socket systemd names in ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace). Without that variable every call is a no-op, so the service runs the same outside
systemd. :func:`watchdog_interval` reads ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``) and says how
often to send keep-alives: half the watchdog timeout, as sd_watchdog_enabled(3) advises.

Promises: a send never raises (a vanished socket is logged once and then ignored) and never
blocks the event loop (datagrams to a unix socket are non-blocking here).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from .. import log

_log = log.get("agent.notify")


class Notifier:
    """Talks to systemd when it is listening; see the module docstring."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if address.startswith("@"):
            self.address = "\0" + address[1:]
        elif address.startswith("/"):
            self.address = address
        self._socket: socket.socket | None = None
        self._failed = False
        self.last_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> None:
        """Send ``KEY=VALUE`` lines in one datagram."""
        if self.address is None or self._failed:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                )
                self._socket.setblocking(False)
            self._socket.sendto("\n".join(assignments).encode(), self.address)
        except OSError as error:
            self._failed = True
            _log.warning(
                "notify.failed",
                extra={"fields": {"error": error.strerror or str(error), "socket": self.address}},
            )

    def ready(self, status: str) -> None:
        self.last_status = status
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        if status != self.last_status:
            self.last_status = status
            self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self, status: str = "stopping") -> None:
        self.last_status = status
        self.send("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` keep-alives, or None when the watchdog is off (or meant
    for another process)."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 1_000_000 / 2
