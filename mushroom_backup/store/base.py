"""The object store interface every other part of mushroom-backup uses.

An :class:`ObjectStore` is a flat namespace of keys (``/``-separated strings, no leading ``/``)
holding byte strings, each with an opaque :class:`Version`. A store is rooted at its URL:
``s3://bucket/prod/db1`` gives a store whose key ``LEASE`` is ``prod/db1/LEASE`` in the bucket,
and ``list`` returns keys relative to that root. Every backend (S3 on
aiobotocore, a local directory, memory) keeps this contract; ``tests/contract`` runs one suite
against all of them.

Contract
--------
``get(key)``
    The whole object and its version. :class:`~mushroom_backup.errors.NotFound` if absent.
``get_range(key, start, length)``
    ``length`` bytes from ``start`` (fewer only at the end of the object). ``NotFound`` if absent.
``head(key)``
    Size, version and modification time, without the body. ``NotFound`` if absent.
``put(key, data, mode)``
    Store ``data`` at ``key`` and return the new version. ``mode`` is one of

    * :data:`CREATE` -- only if the key is absent (``If-None-Match: *``); otherwise
      :class:`~mushroom_backup.errors.AlreadyExists`. Exactly one of several concurrent
      creates of one key wins (where the service gives real compare-and-swap).
    * :class:`Update` ``(version)`` -- only if the current version is ``version`` (``If-Match``);
      otherwise :class:`~mushroom_backup.errors.PreconditionFailed`. On a missing key a backend
      raises ``PreconditionFailed`` or ``NotFound`` (services differ: callers handle both).
    * :data:`OVERWRITE` -- unconditionally.

    A client configured without conditional writes (best-effort mode) raises
    :class:`~mushroom_backup.errors.ConditionalWritesUnsupported` for ``CREATE`` and ``Update``
    without sending anything. A write is atomic: a reader sees the old object or the whole new
    one, never a part.
``delete(key, if_match=None)``
    Remove the key. Unconditional deletes of a missing key succeed (idempotent). With
    ``if_match``, delete only if the current version matches, else ``PreconditionFailed``
    (``NotFound``/``PreconditionFailed`` for a missing key). Backends whose service ignores a
    conditional delete say so in :attr:`ObjectStore.conditional_delete`.
``list(prefix)``
    An async iterator over every key starting with ``prefix`` (a plain string prefix, not a
    directory), in ascending order of the key -- byte order on AWS, MinIO, moto, memory and
    local; services built on a directory tree (SeaweedFS) list a "directory" before a sibling
    key that extends its name with a character below ``/`` (``a/b`` before ``a-c``), i.e. in
    order of the key's ``/``-separated segments. The two orders differ only where one key
    continues a shared prefix with ``/`` and another with a character below it (``!`` to
    ``.``); callers that need one exact order sort.

Versions
    A :class:`Version` is what the service returned (ETag, quoted exactly as given, and a
    VersionId where the service has one); compare and send it back verbatim, never parse it.
    Identical bytes may give an identical version (S3 ETags are MD5s): a write that must change
    the version must change the body.

Errors
    Every failure is a :class:`~mushroom_backup.errors.StoreError` subclass;
    ``StoreError.retryable`` is true for throttling, 5xx and connection failures. Backends do
    not retry by themselves beyond their transport's own connection handling: retries live in
    one layer, the caller's (see :mod:`mushroom_backup.retry`).

Not promised: listing consistency with writes in flight, ordering between different keys.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Self


@dataclass(frozen=True, slots=True)
class Version:
    """An object's version, exactly as the service gave it."""

    etag: str | None
    version_id: str | None = None

    def __str__(self) -> str:
        return self.etag or self.version_id or "?"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head`` and ``list`` say about an object."""

    key: str
    size: int
    version: Version
    last_modified: datetime | None = None


@dataclass(frozen=True, slots=True)
class StoredObject:
    """A whole object as ``get`` returns it."""

    key: str
    data: bytes
    version: Version


@dataclass(frozen=True, slots=True)
class Create:
    """Write only if the key is absent (``If-None-Match: *``)."""


@dataclass(frozen=True, slots=True)
class Update:
    """Write only if the object is still at ``version`` (``If-Match``)."""

    version: Version


@dataclass(frozen=True, slots=True)
class Overwrite:
    """Write unconditionally."""


PutMode = Create | Update | Overwrite
CREATE = Create()
OVERWRITE = Overwrite()


class ObjectStore(abc.ABC):
    """See the module docstring for the contract every backend keeps.

    ``conditional`` is false for a client in best-effort mode; ``url`` is the store's URL with
    no credentials in it (safe to log).
    """

    url: str
    conditional: bool = True
    conditional_delete: bool = True

    @abc.abstractmethod
    async def get(self, key: str) -> StoredObject: ...

    @abc.abstractmethod
    async def get_range(self, key: str, start: int, length: int) -> bytes: ...

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version: ...

    @abc.abstractmethod
    async def delete(self, key: str, if_match: Version | None = None) -> None: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]: ...

    async def close(self) -> None:  # noqa: B027 - a no-op default is the point
        """Release connections. Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def join_key(prefix: str, *parts: str) -> str:
    """``prefix/part/...`` without doubled or leading slashes (an empty prefix is the root)."""
    pieces = [p.strip("/") for p in (prefix, *parts)]
    return "/".join(p for p in pieces if p)
