"""Check: is every snapshot in the bucket complete and restorable? Reads only; needs no lease.

:func:`check_store` lists and reads; the decisions -- which packs are missing or too short,
which files a bad object affects, which packs a ``--read-data-subset`` reads -- are the pure
functions below.

What is checked
---------------
* ``LATEST`` parses and names a manifest that exists.
* Every manifest under ``manifests/`` parses and passes the strict validation of
  :mod:`.manifest` (safe paths, every chunk in the chunk table, chunk sizes adding up to file
  sizes).
* Every pack a manifest uses exists and is long enough for every chunk the manifest locates in
  it, plus the pack footer (the listing gives sizes: no download).
* With ``read_data`` every used pack is downloaded (with ``subset_percent``, only a subset):
  its bytes must hash to its name, its footer and trailer must be sound, and every chunk a
  manifest uses is decompressed at the offset the manifest gives and checked against its
  SHA-256 and size -- each distinct chunk once.

Each problem names the object and every snapshot and file it affects
(:meth:`Problem.lines`: one line per affected file). Packs no manifest uses are *reclaimable*
(``prune`` removes them), not problems; keys that are neither packs nor manifests are listed as
unknown, not problems.

Concurrent writers: a manifest that vanishes between listing and reading (``forget``) is
skipped, and a pack missing from the listing is looked up directly before it is reported (it
may be newer than the listing); if every manifest that used it is gone by then, it is not
reported.

The subset (``--read-data-subset PCT``)
---------------------------------------
A pack's *position* is the first 52 bits of its id as a fraction of 2^52 (ids are SHA-256, so
positions are spread evenly). The circle [0, 1) is cut into ``n = ceil(100 / PCT)`` windows of
PCT % (the last one shorter); on UTC day ``d`` (days since 1970-01-01) window ``d mod n`` is
read. So a run is deterministic for a given day, successive days read successive windows, and a
daily ``check --read-data-subset PCT`` reads every pack once every ``n`` days.

Not promised: checking whole-file hashes (``restore --verify-only`` does), or packs no manifest
uses.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from ..clock import Clock
from ..errors import IntegrityError, NotFound
from ..store.base import ObjectInfo, ObjectStore
from .catalog import get_retrying, read_latest
from .ids import is_snapshot_id
from .manifest import LATEST_KEY, MANIFESTS_PREFIX, FileEntry, Manifest, decode_manifest
from .manifest import manifest_key as _manifest_key
from .pack import DATA_PREFIX, FOOTER_SIZE, decode_pack, decompress_chunk, pack_id_of_key, pack_key

log = logging.getLogger("mushroom_backup.snapshot.check")

Sleep = Callable[[float], Awaitable[None]]

ProblemKind = Literal[
    "latest", "manifest", "pack-missing", "pack-short", "pack-corrupt", "chunk-corrupt"
]


@dataclass(frozen=True, slots=True)
class Affected:
    """A snapshot, and a file in it (None: the snapshot as a whole)."""

    snapshot_id: str
    path: str | None = None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one object, and what it affects."""

    kind: ProblemKind
    key: str
    message: str
    affected: tuple[Affected, ...] = ()

    def lines(self) -> list[str]:
        """One line per affected file (or snapshot), each naming the snapshot and the file."""
        if not self.affected:
            return [f"{self.key}: {self.message}"]
        out = []
        for a in self.affected:
            where = f"snapshot {a.snapshot_id}"
            if a.path is not None:
                where += f" file {a.path!r}"
            out.append(f"{where}: {self.message}")
        return out


# --- pure rules --------------------------------------------------------------------------------


def required_size(manifests: Iterable[Manifest]) -> dict[str, int]:
    """Per pack id, the least size the pack must have: the end of the last chunk any manifest
    locates in it, plus the footer and at least one byte of trailer."""
    need: dict[str, int] = {}
    for manifest in manifests:
        for pack in manifest.body.packs:
            end = max(offset + length for _, offset, length, _ in pack.chunks)
            need[pack.id] = max(need.get(pack.id, 0), end + FOOTER_SIZE + 1)
    return need


def affected_files(
    manifests: Iterable[Manifest],
    *,
    packs: frozenset[str] = frozenset(),
    chunks: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[Affected, ...]:
    """Every (snapshot, file) that uses one of ``packs`` or one of ``chunks`` (``(pack id,
    chunk id)`` pairs), in snapshot then path order."""
    out: list[Affected] = []
    for manifest in sorted(manifests, key=lambda m: m.snapshot_id):
        for entry in manifest.entries:
            if not isinstance(entry, FileEntry):
                continue
            for chunk_id in entry.chunks:
                location = manifest.chunks[chunk_id]
                if location.pack_id in packs or (location.pack_id, chunk_id) in chunks:
                    out.append(Affected(manifest.snapshot_id, entry.path))
                    break
    return tuple(out)


def pack_users(manifests: Iterable[Manifest]) -> dict[str, list[Manifest]]:
    """Per pack id, the manifests that use it."""
    out: dict[str, list[Manifest]] = {}
    for manifest in manifests:
        for pack in manifest.body.packs:
            out.setdefault(pack.id, []).append(manifest)
    return out


def pack_position(pack_id: str) -> float:
    """Where a pack lies on [0, 1): the first 52 bits of its id as a fraction (exact in a
    float, so never rounded up to 1)."""
    return int(pack_id[:13], 16) / 16**13


@dataclass(frozen=True, slots=True)
class SubsetWindow:
    """The packs a ``--read-data-subset`` run reads: positions in ``[start, end)``."""

    percent: float
    index: int
    count: int
    start: float
    end: float

    def contains(self, pack_id: str) -> bool:
        return self.start <= pack_position(pack_id) < self.end

    def describe(self) -> str:
        return (
            f"packs at positions [{self.start:.4f}, {self.end:.4f}): window {self.index + 1} of "
            f"{self.count} ({self.percent:g} %); the window moves every UTC day, so every pack "
            f"is read once in {self.count} days"
        )


def subset_window(percent: float, now: datetime) -> SubsetWindow:
    """The window read on ``now``'s UTC day (module docstring)."""
    if not 0 < percent <= 100:
        raise ValueError("the read-data subset is a percentage in (0, 100]")
    count = math.ceil(100 / percent - 1e-9)
    day = (now.astimezone(UTC).date() - datetime(1970, 1, 1, tzinfo=UTC).date()).days
    index = day % count
    width = percent / 100
    return SubsetWindow(percent, index, count, index * width, min(1.0, (index + 1) * width))


@dataclass(frozen=True, slots=True)
class UsedChunk:
    """A chunk some manifest locates in a pack."""

    chunk_id: str
    offset: int
    length: int
    raw_length: int


def used_chunks(manifests: Iterable[Manifest]) -> dict[str, dict[int, UsedChunk]]:
    """Per pack id, every chunk some manifest locates in it (once per offset)."""
    out: dict[str, dict[int, UsedChunk]] = {}
    for manifest in manifests:
        for pack in manifest.body.packs:
            chunks = out.setdefault(pack.id, {})
            for chunk_id, offset, length, raw in pack.chunks:
                chunks.setdefault(offset, UsedChunk(chunk_id, offset, length, raw))
    return out


def verify_pack(
    pack_id: str, data: bytes, chunks: Iterable[UsedChunk]
) -> tuple[str | None, list[tuple[str, str]]]:
    """Check a downloaded pack: a message if the pack as a whole is damaged (name, footer,
    trailer), and ``(chunk id, message)`` for every used chunk that does not decompress to its
    hash and size. Chunks are checked at the offsets the manifests give, so a damaged trailer
    does not hide which chunks are intact."""
    key = pack_key(pack_id)
    whole: str | None = None
    if hashlib.sha256(data).hexdigest() != pack_id:
        whole = "the pack's bytes do not match its name (corrupt or truncated)"
    else:
        try:
            decode_pack(data, key)
        except IntegrityError as error:
            whole = error.message
    bad: list[tuple[str, str]] = []
    view = memoryview(data)
    for chunk in chunks:
        frame = view[chunk.offset : chunk.offset + chunk.length]
        try:
            if len(frame) != chunk.length:
                raise IntegrityError(f"chunk {chunk.chunk_id} lies beyond the end of pack {key}")
            decompress_chunk(frame, chunk.chunk_id, chunk.raw_length, f"pack {key}")
        except IntegrityError as error:
            bad.append((chunk.chunk_id, error.message))
    return whole, bad


# --- the driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_store` found. ``clean`` when there is no problem."""

    snapshots: int
    latest_id: str | None
    used_packs: int
    used_bytes: int
    read_data: bool
    subset: SubsetWindow | None
    packs_read: int
    bytes_read: int
    chunks_verified: int
    problems: tuple[Problem, ...]
    reclaimable_packs: int
    reclaimable_bytes: int
    unknown_keys: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return not self.problems

    @property
    def affected_snapshots(self) -> tuple[str, ...]:
        return tuple(sorted({a.snapshot_id for p in self.problems for a in p.affected}))


@dataclass
class _Findings:
    problems: list[Problem] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


async def _load_manifests(
    store: ObjectStore, sleep: Sleep, concurrency: int, findings: _Findings
) -> dict[str, Manifest]:
    ids: list[str] = []
    async for info in store.list(MANIFESTS_PREFIX):
        snapshot_id = info.key[len(MANIFESTS_PREFIX) :]
        if is_snapshot_id(snapshot_id):
            ids.append(snapshot_id)
        else:
            findings.unknown.append(info.key)
    gate = asyncio.Semaphore(concurrency)
    loaded: dict[str, Manifest] = {}

    async def one(snapshot_id: str) -> None:
        key = _manifest_key(snapshot_id)
        async with gate:
            try:
                found = await get_retrying(store, key, sleep)
            except NotFound:
                return  # forgotten since it was listed
            try:
                manifest = await asyncio.to_thread(decode_manifest, found.data, key, snapshot_id)
            except IntegrityError as error:
                findings.problems.append(
                    Problem("manifest", key, error.message, (Affected(snapshot_id),))
                )
                return
        loaded[snapshot_id] = manifest

    await asyncio.gather(*(one(s) for s in ids))
    return loaded


async def _exists(store: ObjectStore, key: str) -> ObjectInfo | None:
    try:
        return await store.head(key)
    except NotFound:
        return None


async def check_store(
    store: ObjectStore,
    *,
    clock: Clock,
    read_data: bool = False,
    subset_percent: float | None = None,
    concurrency: int = 4,
) -> CheckReport:
    """Check the bucket (module docstring). ``subset_percent`` implies ``read_data``."""
    sleep = clock.sleep
    findings = _Findings()
    latest_id: str | None = None
    try:
        latest = await read_latest(store, sleep=sleep)
        latest_id = latest.snapshot_id if latest is not None else None
    except IntegrityError as error:
        findings.problems.append(Problem("latest", LATEST_KEY, error.message))
    manifests = await _load_manifests(store, sleep, concurrency, findings)
    broken = {a.snapshot_id for p in findings.problems for a in p.affected}
    if (
        latest_id is not None
        and latest_id not in manifests
        and latest_id not in broken
        and await _exists(store, _manifest_key(latest_id)) is None
    ):
        findings.problems.append(
            Problem(
                "latest",
                LATEST_KEY,
                f"names snapshot {latest_id}, whose manifest does not exist; the next backup "
                "is taken in full and replaces it",
                (Affected(latest_id),),
            )
        )

    sizes: dict[str, ObjectInfo] = {}
    async for listed in store.list(DATA_PREFIX):
        pack_id = pack_id_of_key(listed.key)
        if pack_id is None:
            findings.unknown.append(listed.key)
        else:
            sizes[pack_id] = listed
    need = required_size(manifests.values())
    users_of = pack_users(manifests.values())
    bad_packs: set[str] = set()
    for pack_id, least in sorted(need.items()):
        info = sizes.get(pack_id) or await _exists(store, pack_key(pack_id))
        users = users_of[pack_id]
        if info is None:
            # Gone with every manifest that used it (forget, then prune, during this check)?
            still = [m for m in users if await _exists(store, _manifest_key(m.snapshot_id))]
            if still:
                bad_packs.add(pack_id)
                findings.problems.append(
                    Problem(
                        "pack-missing",
                        pack_key(pack_id),
                        f"pack {pack_key(pack_id)} is missing",
                        affected_files(still, packs=frozenset({pack_id})),
                    )
                )
            continue
        sizes[pack_id] = info
        if info.size < least:
            bad_packs.add(pack_id)
            findings.problems.append(
                Problem(
                    "pack-short",
                    info.key,
                    f"pack {info.key} has {info.size} bytes, fewer than the {least} its "
                    "chunks need (truncated)",
                    affected_files(users, packs=frozenset({pack_id})),
                )
            )

    window = subset_window(subset_percent, clock.wall()) if subset_percent is not None else None
    reading = read_data or window is not None
    packs_read = bytes_read = chunks_verified = 0
    if reading:
        chunks = used_chunks(manifests.values())
        selected = [
            p for p in sorted(need) if p not in bad_packs and (window is None or window.contains(p))
        ]
        gate = asyncio.Semaphore(concurrency)

        async def read_one(pack_id: str) -> None:
            nonlocal packs_read, bytes_read, chunks_verified
            key = pack_key(pack_id)
            todo = list(chunks[pack_id].values())
            async with gate:
                try:
                    found = await get_retrying(store, key, sleep)
                except NotFound:
                    found = None
                if found is not None:
                    whole, bad = await asyncio.to_thread(verify_pack, pack_id, found.data, todo)
            users = users_of[pack_id]
            if found is None:
                findings.problems.append(
                    Problem(
                        "pack-missing",
                        key,
                        f"pack {key} is missing",
                        affected_files(users, packs=frozenset({pack_id})),
                    )
                )
                return
            packs_read += 1
            bytes_read += len(found.data)
            chunks_verified += len(todo)
            for chunk_id, message in bad:
                findings.problems.append(
                    Problem(
                        "chunk-corrupt",
                        key,
                        message,
                        affected_files(users, chunks=frozenset({(pack_id, chunk_id)})),
                    )
                )
            if whole is not None:
                findings.problems.append(
                    Problem(
                        "pack-corrupt",
                        key,
                        f"pack {key}: {whole}"
                        + ("" if bad else " (every chunk the snapshots use is intact)"),
                        tuple(Affected(m.snapshot_id) for m in sorted(users, key=_snapshot_id)),
                    )
                )

        await asyncio.gather(*(read_one(p) for p in selected))

    unused = [info for pack_id, info in sizes.items() if pack_id not in need]
    problems = tuple(sorted(findings.problems, key=lambda p: (p.key, p.kind, p.message)))
    report = CheckReport(
        snapshots=len(manifests) + len(broken),
        latest_id=latest_id,
        used_packs=len(need),
        used_bytes=sum(sizes[p].size for p in need if p in sizes),
        read_data=reading,
        subset=window,
        packs_read=packs_read,
        bytes_read=bytes_read,
        chunks_verified=chunks_verified,
        problems=problems,
        reclaimable_packs=len(unused),
        reclaimable_bytes=sum(i.size for i in unused),
        unknown_keys=tuple(sorted(findings.unknown)),
    )
    log.info(
        "check.completed",
        extra={
            "fields": {
                "snapshots": report.snapshots,
                "problems": len(problems),
                "packs_read": packs_read,
                "reclaimable_packs": report.reclaimable_packs,
            }
        },
    )
    return report


def _snapshot_id(manifest: Manifest) -> str:
    return manifest.snapshot_id


__all__ = [
    "Affected",
    "CheckReport",
    "Problem",
    "SubsetWindow",
    "UsedChunk",
    "affected_files",
    "check_store",
    "pack_position",
    "required_size",
    "subset_window",
    "used_chunks",
    "verify_pack",
]
