"""A store wrapper that injects faults, for tests of everything above the store.

:class:`FaultyStore` wraps any :class:`~mushroom_backup.store.base.ObjectStore` (memory, local,
S3) and, per rule, on the Nth matching call:

* ``fail``        -- raise an error instead of calling through (default: a retryable 503);
* ``lose_answer`` -- call through (the write lands) and then raise a retryable error, as a
  client whose request timed out after the service applied it;
* ``stall``       -- block the call until the test releases it (a hung connection);

and, globally, ``ignore_preconditions`` turns every conditional write into an unconditional one
(a service that accepts but ignores ``If-None-Match`` / ``If-Match``). Every call is logged in
:attr:`FaultyStore.calls` as ``(op, key)``.

Promises: rules apply in the order they were added, each to its own count of matching calls;
no rule ever sleeps on a real clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from ..errors import StoreError
from .base import OVERWRITE, ObjectInfo, ObjectStore, PutMode, StoredObject, Version

Op = Literal["get", "get_range", "head", "put", "delete", "list"]
T = TypeVar("T")


def service_unavailable(key: str) -> StoreError:
    return StoreError(
        f"injected fault: 503 Service Unavailable for {key!r}", key=key, retryable=True
    )


@dataclass
class Stall:
    """A gate that holds matching calls until :meth:`release`."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    _gate: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0

    def release(self) -> None:
        self._gate.set()

    async def hold(self) -> None:
        self.waiting += 1
        self.entered.set()
        try:
            await self._gate.wait()
        finally:
            self.waiting -= 1


@dataclass
class _Rule:
    op: Op
    kind: Literal["fail", "lose_answer", "stall"]
    nth: int
    times: int
    key: Callable[[str], bool]
    error: Callable[[str], BaseException]
    stall: Stall | None = None
    seen: int = 0
    fired: int = 0

    def matches(self, op: str, key: str) -> bool:
        if op != self.op or not self.key(key):
            return False
        self.seen += 1
        if self.seen >= self.nth and self.fired < self.times:
            self.fired += 1
            return True
        return False


def _key_filter(key: str | Callable[[str], bool] | None) -> Callable[[str], bool]:
    if key is None:
        return lambda _k: True
    if callable(key):
        return key
    return lambda k: k == key


class FaultyStore(ObjectStore):
    """Wraps ``inner`` and injects the faults its rules describe. See the module docstring."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.conditional = inner.conditional
        self.conditional_delete = inner.conditional_delete
        self.ignore_preconditions = False
        self.calls: list[tuple[str, str]] = []
        self._rules: list[_Rule] = []

    # --- arming -----------------------------------------------------------------------------

    def fail(
        self,
        op: Op,
        *,
        nth: int = 1,
        times: int = 1,
        key: str | Callable[[str], bool] | None = None,
        error: Callable[[str], BaseException] = service_unavailable,
    ) -> None:
        """From the ``nth`` matching call on, ``times`` calls raise ``error(key)``."""
        self._rules.append(_Rule(op, "fail", nth, times, _key_filter(key), error))

    def lose_answer(
        self,
        op: Op,
        *,
        nth: int = 1,
        times: int = 1,
        key: str | Callable[[str], bool] | None = None,
    ) -> None:
        """The ``nth`` matching call lands on the store, then raises a retryable error."""
        self._rules.append(
            _Rule(op, "lose_answer", nth, times, _key_filter(key), service_unavailable)
        )

    def stall(
        self,
        op: Op,
        *,
        nth: int = 1,
        times: int = 1_000_000,
        key: str | Callable[[str], bool] | None = None,
    ) -> Stall:
        """Matching calls block until the returned :class:`Stall` is released."""
        gate = Stall()
        self._rules.append(
            _Rule(op, "stall", nth, times, _key_filter(key), service_unavailable, gate)
        )
        return gate

    # --- the store --------------------------------------------------------------------------

    async def _call(self, op: Op, key: str, call: Callable[[], Awaitable[T]]) -> T:
        self.calls.append((op, key))
        lose = None
        for rule in self._rules:
            if not rule.matches(op, key):
                continue
            if rule.kind == "fail":
                raise rule.error(key)
            if rule.kind == "stall":
                assert rule.stall is not None
                await rule.stall.hold()
            if rule.kind == "lose_answer":
                lose = rule
        result = await call()
        if lose is not None:
            raise lose.error(key)
        return result

    async def get(self, key: str) -> StoredObject:
        return await self._call("get", key, lambda: self.inner.get(key))

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self._call("get_range", key, lambda: self.inner.get_range(key, start, length))

    async def head(self, key: str) -> ObjectInfo:
        return await self._call("head", key, lambda: self.inner.head(key))

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        sent = OVERWRITE if self.ignore_preconditions else mode
        return await self._call("put", key, lambda: self.inner.put(key, data, sent))

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        sent = None if self.ignore_preconditions else if_match
        await self._call("delete", key, lambda: self.inner.delete(key, sent))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        async def first() -> AsyncIterator[ObjectInfo]:
            return self.inner.list(prefix)

        entries = await self._call("list", prefix, first)
        async for entry in entries:
            yield entry

    async def close(self) -> None:
        await self.inner.close()
