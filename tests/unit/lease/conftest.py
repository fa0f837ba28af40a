"""Shared fixtures for the bucket lease tests: a fake clock, an in-memory bucket behind a fault
injector, and the lease logger captured whatever the root logging configuration is."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore


@pytest.fixture
def lease_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` wired straight to ``mushroom_backup.lease`` at DEBUG (log.setup() turns
    propagation off on the package logger, so the root handler alone could miss records)."""
    logger = logging.getLogger("mushroom_backup.lease")
    monkeypatch.setattr(logger, "propagate", False)
    level = logger.level
    logger.setLevel(logging.DEBUG)  # setLevel, not an attribute: it clears the level caches
    caplog.handler.setLevel(logging.DEBUG)
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)


@pytest.fixture
def bucket(clock: FakeClock) -> FaultyStore:
    """A private in-memory bucket behind a fault injector (no faults armed)."""
    return FaultyStore(MemoryStore(now=clock.wall))
