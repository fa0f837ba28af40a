"""Where snapshots are found in a bucket: ``LATEST``, the manifests, and the two final writes.

Reading
-------
* :func:`read_latest` -- the ``LATEST`` record and its version, or None before the first
  snapshot.
* :func:`load_manifest` -- one manifest, validated (:mod:`.manifest`).
* :func:`list_snapshots` -- every manifest's header, oldest first, with one ranged GET per
  manifest (the header is the manifest's first zstd frame, a few hundred bytes).

Writing (the last two steps of the write order; DESIGN.md "Write order")
------------------------------------------------------------------------
* :func:`write_manifest` -- create-only. Finding the key present is fine only if it holds our
  exact bytes (our own earlier attempt whose answer was lost); anything else is an error.
  Best-effort mode (no conditional writes): ``head`` first, then an unconditional write.
* :func:`swap_latest` -- compare-and-swap against the version this writer read when the
  snapshot started (``If-None-Match: *`` if there was none). A refusal means another writer
  moved ``LATEST``: :class:`~mushroom_backup.errors.LatestMoved` (exit 4, the lease is lost) --
  unless reading it back shows our own snapshot (a retried write that had landed). A swap whose
  answer was lost is reconciled by reading ``LATEST`` back: ours -> done; unchanged -> the write
  did not land, swap again (3 attempts in all); anything else -> ``LatestMoved``. Best-effort
  mode: read ``LATEST``, refuse if it no longer names the snapshot we started from, then
  overwrite (two overlapping writers can still both win; chunks are content-addressed, so they
  cannot corrupt each other's data).

Retryable store errors (503, throttling, timeouts) of idempotent steps are retried by
:func:`~mushroom_backup.retry.retrying`; a 412 is an answer and never retried blindly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from ..errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    IntegrityError,
    LatestMoved,
    NotFound,
    PreconditionFailed,
    SnapshotError,
    StoreError,
)
from ..retry import retrying
from ..store.base import CREATE, OVERWRITE, ObjectStore, StoredObject, Update, Version
from .ids import is_snapshot_id
from .manifest import (
    LATEST_KEY,
    MANIFESTS_PREFIX,
    LatestRecord,
    Manifest,
    ManifestHeader,
    decode_header,
    decode_latest,
    decode_manifest,
    encode_latest,
    manifest_key,
)

Sleep = Callable[[float], Awaitable[None]]
_HEADER_PROBE = 16 << 10
_LATEST_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class LatestRef:
    """``LATEST`` as read: the record and the version to compare-and-swap against."""

    record: LatestRecord
    version: Version

    @property
    def snapshot_id(self) -> str:
        return self.record.snapshot_id

    @property
    def created_at(self) -> datetime:
        return self.record.created_at


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """One line of ``snapshots``: a manifest's header, and whether ``LATEST`` names it."""

    header: ManifestHeader
    is_latest: bool

    @property
    def snapshot_id(self) -> str:
        return self.header.snapshot_id

    @property
    def created_at(self) -> datetime:
        return self.header.created_at

    @property
    def files(self) -> int:
        return self.header.summary.files

    @property
    def size(self) -> int:
        """Total bytes of the snapshot's files."""
        return self.header.summary.bytes

    @property
    def new_bytes(self) -> int:
        """Bytes this snapshot added to the bucket (new packs)."""
        return self.header.summary.new_bytes_stored

    @property
    def writer_instance(self) -> str:
        return self.header.writer.instance_id


# --- reading -----------------------------------------------------------------------------------


async def get_retrying(store: ObjectStore, key: str, sleep: Sleep) -> StoredObject:
    """``store.get(key)``, retried while the failure is retryable."""

    async def call() -> StoredObject:
        return await store.get(key)

    return await retrying(call, what=f"get {key}", sleep=sleep)


async def get_range_retrying(
    store: ObjectStore, key: str, start: int, length: int, sleep: Sleep
) -> bytes:
    """``store.get_range(key, start, length)``, retried while the failure is retryable."""

    async def call() -> bytes:
        return await store.get_range(key, start, length)

    return await retrying(call, what=f"get {key}", sleep=sleep)


async def read_latest(store: ObjectStore, *, sleep: Sleep = asyncio.sleep) -> LatestRef | None:
    """``LATEST`` and its version, or None if there is no snapshot yet."""
    try:
        found = await get_retrying(store, LATEST_KEY, sleep)
    except NotFound:
        return None
    return LatestRef(decode_latest(found.data), found.version)


async def load_manifest(
    store: ObjectStore, snapshot_id: str, *, sleep: Sleep = asyncio.sleep
) -> Manifest:
    """The validated manifest of ``snapshot_id``; SnapshotError if there is none."""
    if not is_snapshot_id(snapshot_id):
        raise SnapshotError(
            f"{snapshot_id!r} is not a snapshot id (like 20261129T101500.123Z-3f9a1c2e); "
            "list them with `mushroom-backup snapshots`"
        )
    key = manifest_key(snapshot_id)
    try:
        found = await get_retrying(store, key, sleep)
    except NotFound:
        raise SnapshotError(
            f"there is no snapshot {snapshot_id} in {store.url}; "
            "list them with `mushroom-backup snapshots`"
        ) from None
    return decode_manifest(found.data, key, snapshot_id)


async def _read_header(store: ObjectStore, key: str, sleep: Sleep) -> ManifestHeader:
    probe = await get_range_retrying(store, key, 0, _HEADER_PROBE, sleep)
    header, _ = decode_header(probe, key)
    if header is None and len(probe) >= _HEADER_PROBE:
        found = await get_retrying(store, key, sleep)
        header, _ = decode_header(found.data, key)
    if header is None:
        raise IntegrityError(f"manifest {key} is truncated inside its header")
    if manifest_key(header.snapshot_id) != key:
        raise IntegrityError(f"manifest {key} names snapshot {header.snapshot_id}, not itself")
    return header


async def list_snapshots(
    store: ObjectStore, *, concurrency: int = 16, sleep: Sleep = asyncio.sleep
) -> list[SnapshotInfo]:
    """Every snapshot in the bucket, oldest first. Keys under ``manifests/`` that are not
    snapshot ids are ignored; a manifest whose header is invalid is an IntegrityError."""
    keys = [
        info.key
        async for info in store.list(MANIFESTS_PREFIX)
        if is_snapshot_id(info.key[len(MANIFESTS_PREFIX) :])
    ]
    latest = await read_latest(store, sleep=sleep)
    gate = asyncio.Semaphore(concurrency)

    async def one(key: str) -> ManifestHeader:
        async with gate:
            return await _read_header(store, key, sleep)

    headers = await asyncio.gather(*(one(key) for key in keys))
    latest_id = latest.snapshot_id if latest is not None else None
    infos = [SnapshotInfo(h, h.snapshot_id == latest_id) for h in headers]
    infos.sort(key=lambda info: info.snapshot_id)
    return infos


# --- writing -----------------------------------------------------------------------------------


async def _same_bytes(store: ObjectStore, key: str, data: bytes) -> None:
    existing = await store.get(key)
    if existing.data != data:
        raise SnapshotError(
            f"{key} already exists with other content (a snapshot id collision); "
            "run the backup again"
        )


async def write_manifest(
    store: ObjectStore, key: str, data: bytes, *, sleep: Sleep = asyncio.sleep
) -> None:
    """Store a manifest create-only (module docstring)."""
    best_effort = not store.conditional

    async def attempt() -> None:
        nonlocal best_effort
        if not best_effort:
            try:
                await store.put(key, data, CREATE)
                return
            except AlreadyExists:
                await _same_bytes(store, key, data)
                return
            except ConditionalWritesUnsupported:
                best_effort = True
        try:
            await store.head(key)
        except NotFound:
            await store.put(key, data, OVERWRITE)
            return
        await _same_bytes(store, key, data)

    await retrying(attempt, what=f"put {key}", sleep=sleep)


def _describe(ref: LatestRef | None) -> str:
    if ref is None:
        return "no snapshot"
    return f"snapshot {ref.snapshot_id} (written by {ref.record.writer.instance_id})"


def _moved(expected: LatestRef | None, current: LatestRef | None, ours: str) -> LatestMoved:
    return LatestMoved(
        f"another writer moved {LATEST_KEY} while this backup ran: it names "
        f"{_describe(current)}, not {_describe(expected)} as when the backup started. This "
        f"instance's lease is lost and it stops; snapshot {ours} is stored but not "
        "referenced by LATEST (prune removes it). Check which instance writes to this prefix"
    )


def _unchanged(current: LatestRef | None, expected: LatestRef | None) -> bool:
    if current is None or expected is None:
        return current is None and expected is None
    return current.version == expected.version


async def swap_latest(
    store: ObjectStore,
    expected: LatestRef | None,
    record: LatestRecord,
    *,
    sleep: Sleep = asyncio.sleep,
) -> LatestRef:
    """Point ``LATEST`` at ``record`` if it still is ``expected`` (module docstring). Returns
    the new ``LATEST``. Raises LatestMoved when another writer moved it."""
    body = encode_latest(record)
    ours = record.snapshot_id
    if store.conditional:
        mode = CREATE if expected is None else Update(expected.version)
        for _ in range(_LATEST_ATTEMPTS):
            try:
                version = await store.put(LATEST_KEY, body, mode)
                return LatestRef(record, version)
            except ConditionalWritesUnsupported:
                break
            except (PreconditionFailed, NotFound):
                current = await read_latest(store, sleep=sleep)
                if current is not None and current.snapshot_id == ours:
                    return current
                raise _moved(expected, current, ours) from None
            except StoreError as error:
                if not error.retryable:
                    raise
                # The answer was lost: read back to learn whether the write landed.
                current = await read_latest(store, sleep=sleep)
                if current is not None and current.snapshot_id == ours:
                    return current
                if not _unchanged(current, expected):
                    raise _moved(expected, current, ours) from None
        else:
            raise StoreError(
                f"could not update {LATEST_KEY} after {_LATEST_ATTEMPTS} attempts (the store "
                f"kept failing); snapshot {ours} is stored but {LATEST_KEY} still names "
                f"{_describe(expected)}. Run the backup again",
                key=LATEST_KEY,
                retryable=True,
            )
    # Best-effort mode: read, compare, overwrite.
    current = await read_latest(store, sleep=sleep)
    if (current.snapshot_id if current else None) != (expected.snapshot_id if expected else None):
        raise _moved(expected, current, ours)

    async def overwrite() -> Version:
        return await store.put(LATEST_KEY, body, OVERWRITE)

    version = await retrying(overwrite, what=f"put {LATEST_KEY}", sleep=sleep)
    return LatestRef(record, version)
