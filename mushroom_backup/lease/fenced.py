"""Writes fenced by a lease's write deadline.

:class:`FencedStore` wraps an :class:`~mushroom_backup.store.base.ObjectStore` for a holder of a
lease. Every write (``put``, ``delete``)

* starts only while the fence's :meth:`Fence.write_deadline` is open -- otherwise
  :class:`~mushroom_backup.errors.FenceClosed` is raised and nothing is sent;
* runs as its own task raced against a sleep until that deadline on the injected clock. If the
  deadline comes first and the fence has not moved it (a renewal confirmed meanwhile extends the
  race to the new deadline), the task is cancelled -- nothing waits for it -- and
  ``FenceClosed`` is raised. The first closure is remembered: every later write fails at once.

Reads pass straight through: a stale holder reading does no harm.

Not promised: that a request the service already received is undone. A cancelled upload may
still land (DESIGN.md, "What a stale writer can still do"); the write order makes such objects
harmless orphans.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from ..clock import Clock, finished_by
from ..errors import FenceClosed
from ..store.base import OVERWRITE, ObjectInfo, ObjectStore, PutMode, StoredObject, Version

T = TypeVar("T")


class Fence(Protocol):
    """Anything that says until when its holder may start a write."""

    def write_deadline(self) -> float | None:
        """The monotonic moment (on the holder's clock) after which no write may start, or
        None when no write may start now."""
        ...


class FencedStore(ObjectStore):
    """See the module docstring."""

    def __init__(self, inner: ObjectStore, fence: Fence, clock: Clock) -> None:
        self.inner = inner
        self.fence = fence
        self.clock = clock
        self.url = inner.url
        self.conditional = inner.conditional
        self.conditional_delete = inner.conditional_delete
        self.closed_reason: str | None = None

    def _close(self, reason: str) -> FenceClosed:
        if self.closed_reason is None:
            self.closed_reason = reason
        return FenceClosed(self.closed_reason)

    async def _fenced(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        if self.closed_reason is not None:
            raise FenceClosed(self.closed_reason)
        deadline = self.fence.write_deadline()
        if deadline is None or self.clock.monotonic() >= deadline:
            raise self._close(
                f"the lease's write fence is closed: {what} was not started "
                "(no confirmed renewal within 2/3 of the TTL, or the lease was lost)"
            )
        task: asyncio.Future[T] = asyncio.ensure_future(call())
        while not await finished_by(self.clock, task, deadline):
            moved = self.fence.write_deadline()
            if moved is None or moved <= deadline:
                task.cancel()  # nothing waits for it
                raise self._close(
                    f"the lease's write fence closed while {what} was in flight; "
                    "the request was cancelled"
                )
            deadline = moved
        return task.result()

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        return await self._fenced(f"the write of {key!r}", lambda: self.inner.put(key, data, mode))

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        await self._fenced(f"the delete of {key!r}", lambda: self.inner.delete(key, if_match))

    async def get(self, key: str) -> StoredObject:
        return await self.inner.get(key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self.inner.get_range(key, start, length)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)

    async def close(self) -> None:
        """The inner store belongs to whoever made it: closing the fence leaves it open."""
