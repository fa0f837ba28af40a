"""A harness for driving the service deterministically: a FakeClock, one in-memory bucket
(behind a fault injector) shared by every "instance" in the test, a small source tree, the
service's log events recorded, and systemd notifications recorded.

Time moves only when a test says so. :meth:`Harness.jump` wakes sleepers in deadline order
(renewals, the service loop, grace periods), letting each step's in-memory I/O finish before
the next moment; :meth:`Harness.until` waits for a condition that real work (a snapshot's
reader and compression threads) makes true, with a real-time safety limit that only a broken
test reaches. Nothing sleeps for real to synchronise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mushroom_backup.agent.notify import Notifier
from mushroom_backup.agent.service import Service
from mushroom_backup.clock import FakeClock
from mushroom_backup.config import Settings
from mushroom_backup.lease.process.holder import ProcessLeaseHolder
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

#: Real seconds a condition may take before the test fails (a safety net, not a schedule).
SAFETY_LIMIT_S = 20.0
TTL_S = 30
INTERVAL_S = 600.0


@dataclass(frozen=True)
class Event:
    name: str
    level: int
    fields: dict[str, Any]
    at: float  # the fake clock's monotonic reading when it was logged


class Recorder(logging.Handler):
    """Every ``mushroom_backup`` log record, as events stamped with the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(logging.DEBUG)
        self.clock = clock
        self.events: list[Event] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(getattr(record, "fields", {}) or {})
        self.events.append(
            Event(record.getMessage(), record.levelno, fields, self.clock.monotonic())
        )

    def named(self, name: str, *, level: int = logging.DEBUG) -> list[Event]:
        return [e for e in self.events if e.name == name and e.level >= level]

    def count(self, name: str, *, level: int = logging.DEBUG) -> int:
        return len(self.named(name, level=level))

    def last(self, name: str) -> Event:
        found = self.named(name)
        assert found, f"no {name} event was logged; events: {[e.name for e in self.events]}"
        return found[-1]

    def names(self) -> list[str]:
        return [e.name for e in self.events]


class RecordingNotifier(Notifier):
    """A Notifier that records the datagrams it would send to systemd."""

    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[tuple[str, ...]] = []

    def send(self, *assignments: str) -> None:
        self.sent.append(assignments)

    def lines(self) -> list[str]:
        return [line for datagram in self.sent for line in datagram]


@dataclass
class Harness:
    clock: FakeClock
    bucket: MemoryStore
    store: FaultyStore
    source: Path
    log: Recorder
    notifier: RecordingNotifier
    tasks: list[asyncio.Task[int]] = field(default_factory=list)

    def settings(self, retention: dict[str, Any] | None = None, **schedule: Any) -> Settings:
        return Settings.model_validate(
            {
                "store": self.bucket.url,
                "source": str(self.source),
                "lease": {"ttl_s": TTL_S},
                "schedule": {"interval_s": INTERVAL_S, **schedule},
                "retention": retention or {},
            }
        )

    def service(
        self,
        *,
        identity: ProcessLeaseHolder | None = None,
        stop_grace_s: float = 30.0,
        retention: dict[str, Any] | None = None,
        **schedule: Any,  # ScheduleSettings fields
    ) -> Service:
        return Service(
            self.settings(retention, **schedule),
            clock=self.clock,
            notifier=self.notifier,
            store=self.store,
            identity=identity,
            stop_grace_s=stop_grace_s,
            install_signal_handlers=False,
        )

    def start(self, service: Service) -> asyncio.Task[int]:
        task = asyncio.create_task(service.run(), name="service under test")
        self.tasks.append(task)
        return task

    async def settle(self) -> None:
        """Let every ready callback run: in-memory I/O finishes within a few loop turns."""
        for _ in range(100):
            await asyncio.sleep(0)

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait until ``condition()`` holds (real work such as a snapshot makes it so)."""
        try:
            async with asyncio.timeout(SAFETY_LIMIT_S):
                # Conditions are made true by snapshot threads as well as by tasks, so this
                # yields to the loop (it never sleeps) until the condition holds.
                while not condition():  # noqa: ASYNC110
                    await asyncio.sleep(0)
        except TimeoutError:
            pytest.fail(f"never happened: {what}; events: {self.log.names()}")
        await self.settle()

    async def jump(self, seconds: float) -> None:
        """Move the fake clock ``seconds`` ahead, waking each sleeper at its own deadline."""
        target = self.clock.monotonic() + seconds
        await self.settle()
        while True:
            deadline = self.clock.next_deadline()
            if deadline is None or deadline > target:
                break
            self.clock.advance(max(0.0, deadline - self.clock.monotonic()))
            await self.settle()
        self.clock.advance(max(0.0, target - self.clock.monotonic()))
        await self.settle()

    async def jump_until(self, condition: Callable[[], bool], what: str, limit_s: float) -> float:
        """Wake sleepers in deadline order until ``condition()`` holds; fail if that takes more
        than ``limit_s`` of fake time. Returns the fake time it took."""
        began = self.clock.monotonic()
        await self.settle()
        while not condition():
            deadline = self.clock.next_deadline()
            if deadline is None or deadline - began > limit_s:
                pytest.fail(f"not within {limit_s} s of fake time: {what}; {self.log.names()}")
            self.clock.advance(max(0.0, deadline - self.clock.monotonic()))
            await self.settle()
        return self.clock.monotonic() - began
