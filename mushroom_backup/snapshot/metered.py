"""A store wrapper that counts what a snapshot or restore costs: requests and bytes.

Every call through :class:`MeteredStore` counts one request (a ``list`` counts one per call,
whatever the number of pages); ``put`` bodies count as uploaded bytes and ``get``/``get_range``
answers as downloaded bytes, whether the call succeeds or not (a failed call still costs a
request). It changes nothing else: errors, cancellation and versions pass through unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..store.base import OVERWRITE, ObjectInfo, ObjectStore, PutMode, StoredObject, Version


class MeteredStore(ObjectStore):
    """Counts requests and bytes of the calls made through it. See the module docstring."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.conditional = inner.conditional
        self.conditional_delete = inner.conditional_delete
        self.requests = 0
        self.bytes_uploaded = 0
        self.bytes_downloaded = 0

    async def get(self, key: str) -> StoredObject:
        self.requests += 1
        found = await self.inner.get(key)
        self.bytes_downloaded += len(found.data)
        return found

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        self.requests += 1
        data = await self.inner.get_range(key, start, length)
        self.bytes_downloaded += len(data)
        return data

    async def head(self, key: str) -> ObjectInfo:
        self.requests += 1
        return await self.inner.head(key)

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        self.requests += 1
        self.bytes_uploaded += len(data)
        return await self.inner.put(key, data, mode)

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        self.requests += 1
        await self.inner.delete(key, if_match)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        self.requests += 1
        async for info in self.inner.list(prefix):
            yield info

    async def close(self) -> None:
        """The inner store belongs to whoever made it: it stays open."""
