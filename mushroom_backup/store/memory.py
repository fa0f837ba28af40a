"""An in-process object store for tests (``memory://``).

Keeps the whole :mod:`~mushroom_backup.store.base` contract with real compare-and-swap (every
operation is atomic on the event loop: no ``await`` between the check and the swap). Versions
are ``"m<n>"`` ETags from a counter, so two writes of identical bytes still get different
versions here -- unlike S3; tests that care use distinct bodies, as real callers must.

Faults (fail the Nth call, lose the answer of a write that landed, ignore preconditions, stall)
are injected by wrapping any store in :class:`~mushroom_backup.store.faults.FaultyStore`.

``memory://name`` stores with the same name share their objects within a process, so a test
can open "two clients" of one bucket; ``memory://`` alone is private to one instance.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
)
from .base import (
    OVERWRITE,
    Create,
    ObjectInfo,
    ObjectStore,
    Overwrite,
    PutMode,
    StoredObject,
    Update,
    Version,
)


@dataclass
class _Entry:
    data: bytes
    version: Version
    last_modified: datetime


class _Bucket:
    def __init__(self) -> None:
        self.objects: dict[str, _Entry] = {}
        self.counter = itertools.count(1)


_NAMED: dict[str, _Bucket] = {}


class MemoryStore(ObjectStore):
    """A dict of objects with atomic conditional writes. See the module docstring."""

    def __init__(
        self,
        name: str = "",
        *,
        conditional: bool = True,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        """``now`` stamps ``last_modified`` (default: the system's UTC clock); tests pass a
        fake clock's ``wall`` to make object ages deterministic."""
        if name:
            self._bucket = _NAMED.setdefault(name, _Bucket())
        else:
            self._bucket = _Bucket()
        self.url = f"memory://{name}"
        self.conditional = conditional
        self._now = now or (lambda: datetime.now(UTC))

    @property
    def keys(self) -> list[str]:
        """Every key, sorted (for test assertions)."""
        return sorted(self._bucket.objects)

    def _entry(self, key: str) -> _Entry:
        try:
            return self._bucket.objects[key]
        except KeyError:
            raise NotFound(key) from None

    async def get(self, key: str) -> StoredObject:
        await asyncio.sleep(0)
        entry = self._entry(key)
        return StoredObject(key, entry.data, entry.version)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        await asyncio.sleep(0)
        if start < 0 or length < 0:
            raise ValueError("range start and length must not be negative")
        return self._entry(key).data[start : start + length]

    async def head(self, key: str) -> ObjectInfo:
        await asyncio.sleep(0)
        entry = self._entry(key)
        return ObjectInfo(key, len(entry.data), entry.version, entry.last_modified)

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        await asyncio.sleep(0)
        if not self.conditional and not isinstance(mode, Overwrite):
            raise ConditionalWritesUnsupported(key)
        current = self._bucket.objects.get(key)
        if isinstance(mode, Create) and current is not None:
            raise AlreadyExists(key)
        if isinstance(mode, Update):
            if current is None:
                raise PreconditionFailed(key, "the object does not exist")
            if current.version != mode.version:
                raise PreconditionFailed(key, "the object changed")
        version = Version(f'"m{next(self._bucket.counter)}"')
        self._bucket.objects[key] = _Entry(bytes(data), version, self._now())
        return version

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        await asyncio.sleep(0)
        current = self._bucket.objects.get(key)
        if if_match is not None:
            if current is None:
                raise NotFound(key)
            if current.version != if_match:
                raise PreconditionFailed(key, "the object changed")
        self._bucket.objects.pop(key, None)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        # Snapshot the matching keys first: a listing is not consistent with concurrent writes,
        # but it never fails because of them.
        for key in sorted(k for k in self._bucket.objects if k.startswith(prefix)):
            entry = self._bucket.objects.get(key)
            if entry is not None:
                yield ObjectInfo(key, len(entry.data), entry.version, entry.last_modified)
            await asyncio.sleep(0)
