"""Fixtures of the process-lease tests (``clock`` comes from tests/conftest.py)."""

from __future__ import annotations

import pytest

from mushroom_backup.store.memory import MemoryStore


@pytest.fixture
def memory() -> MemoryStore:
    """A private in-memory bucket."""
    return MemoryStore()
