"""Fixtures of the agent tests: the fake clock, the log recorder, and the harness
(:mod:`service_harness`)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.unit.agent.service_harness import Harness, Recorder, RecordingNotifier
else:
    from service_harness import Harness, Recorder, RecordingNotifier


@pytest.fixture
def recorder(clock: FakeClock) -> Iterator[Recorder]:
    logger = logging.getLogger("mushroom_backup")
    handler = Recorder(clock)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
async def h(clock: FakeClock, recorder: Recorder, tmp_path: Path) -> AsyncIterator[Harness]:
    """The harness (short name: tests use it on every line)."""
    source = tmp_path / "source"
    (source / "base").mkdir(parents=True)
    (source / "PG_VERSION").write_bytes(b"16\n")
    (source / "base" / "1").write_bytes(secrets.token_bytes(3000))
    (source / "base" / "2").write_bytes(b"table data\n" * 500)
    bucket = MemoryStore(f"service-{secrets.token_hex(6)}", now=clock.wall)
    h = Harness(clock, bucket, FaultyStore(bucket), source, recorder, RecordingNotifier())
    try:
        yield h
    finally:
        for task in h.tasks:
            task.cancel()
        if h.tasks:
            await asyncio.wait(h.tasks)
