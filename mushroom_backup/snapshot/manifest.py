"""The manifest of a snapshot and the ``LATEST`` pointer: models, encoding, strict validation.

Encoding of ``manifests/{snapshot_id}``
---------------------------------------
Two zstd frames (each with a checksum) back to back; decompressed, they are two lines of
canonical JSON (keys sorted, no spaces, ASCII with ``\\uXXXX`` escapes), so
``zstd -dc | head -1`` shows the header and ``jq`` reads both lines:

1. the **header** (:class:`ManifestHeader`): format and version, snapshot id, parent id,
   ``created_at``, source host and path, the writer, the chunking parameters and the summary.
   Listing snapshots reads only this frame (a ranged GET of the first few KiB).
2. the **body** (:class:`ManifestBody`): ``entries`` sorted by path, and ``packs``: for each
   pack object the snapshot uses, the chunks it uses from it as
   ``[chunk sha256, offset, stored length, raw length]`` -- the snapshot's chunk table.

Entries (``type`` decides the fields): ``file`` -- path, mode, mtime_ns, size, sha256 of the
whole content, ``chunks`` (chunk ids in file order), and inode, dev, ctime_ns for change
detection, uid/gid, ``unstable`` when the file never stopped changing while it was read;
``dir`` -- path, mode, mtime_ns, uid/gid; ``symlink`` -- path, target, mtime_ns, uid/gid.
Names that are not valid UTF-8 are kept as Python's surrogate escapes (``\\udcXX``).

Validation (:func:`decode_manifest`) is strict: unknown fields, wrong types, a malformed id or
digest, an unsafe or duplicated path, an entry below a symlink, a chunk missing from the chunk
table, a file whose chunks do not add up to its size -- each is an
:class:`~mushroom_backup.errors.IntegrityError` (:class:`~mushroom_backup.errors.UnsafePath` for
paths) that names the manifest and what is wrong. A manifest is rejected, never repaired.

``LATEST`` is one canonical JSON object (:class:`LatestRecord`): ``snapshot_id``, ``manifest``
(its key), ``created_at`` of that snapshot, ``written_at`` and ``writer``. Its body differs for
every snapshot, so its ETag changes with every swap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pydantic
import zstandard
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ..errors import IntegrityError, UnsafePath
from .ids import SNAPSHOT_ID_PATTERN
from .paths import tree_problem

MANIFEST_FORMAT = "mushroom-backup/manifest"
MANIFEST_VERSION = 1
MANIFESTS_PREFIX = "manifests/"
LATEST_KEY = "LATEST"
LATEST_FORMAT = "mushroom-backup/latest"
_LEVEL = 6

Digest = Annotated[str, Field(strict=True, pattern=r"^[0-9a-f]{64}$")]
SnapshotId = Annotated[str, Field(strict=True, pattern=SNAPSHOT_ID_PATTERN)]
Count = Annotated[int, Field(strict=True, ge=0)]
Mode = Annotated[int, Field(strict=True, ge=0, le=0o7777)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def manifest_key(snapshot_id: str) -> str:
    return f"{MANIFESTS_PREFIX}{snapshot_id}"


# --- header ------------------------------------------------------------------------------------


class WriterInfo(_Model):
    """Who wrote a snapshot: the lease holder's instance id and exclusion kind
    (``conditional`` or ``best-effort``), and in a cluster the process-lease identity."""

    instance_id: StrictStr
    exclusion: StrictStr
    host: StrictStr | None = None
    pid: StrictInt | None = None
    node_id: StrictInt | None = None
    boot_incarnation: StrictStr | None = None
    process_term: StrictInt | None = None


class SourceInfo(_Model):
    host: StrictStr
    path: StrictStr


class ChunkingParams(_Model):
    """How files were cut, hashed and compressed (what a later backup must match to dedup)."""

    algorithm: Literal["fixed"]
    chunk_size: Annotated[int, Field(strict=True, gt=0)]
    hash: Literal["sha256"]
    compression: Literal["zstd"]
    level: StrictInt
    pack_size: Annotated[int, Field(strict=True, gt=0)]


class Summary(_Model):
    """Counts of one snapshot, so listing needs only the header.

    ``bytes`` is the total size of its files; ``bytes_read`` what was read from disk (changed
    files, re-reads included); ``new_chunks``/``new_packs`` and ``new_bytes_stored`` (the bytes
    of the new pack objects) what it added to the bucket; ``files_reused`` the files taken from
    the parent unread; ``unstable_files`` files stored while still changing; ``skipped`` entries
    left out with a warning (special files, unreadable or vanished ones)."""

    files: Count
    dirs: Count
    symlinks: Count
    bytes: Count
    bytes_read: Count
    files_read: Count
    files_reused: Count
    new_chunks: Count
    new_packs: Count
    new_bytes_stored: Count
    unstable_files: Count
    skipped: Count
    duration_s: Annotated[float, Field(ge=0)]


class ManifestHeader(_Model):
    format: Literal["mushroom-backup/manifest"]
    version: StrictInt
    snapshot_id: SnapshotId
    parent_id: SnapshotId | None = None
    created_at: AwareDatetime
    source: SourceInfo
    writer: WriterInfo
    chunking: ChunkingParams
    summary: Summary


# --- body --------------------------------------------------------------------------------------


class FileEntry(_Model):
    type: Literal["file"]
    path: StrictStr
    mode: Mode
    mtime_ns: StrictInt
    size: Count
    sha256: Digest
    chunks: tuple[Digest, ...]
    inode: Count
    dev: Count
    ctime_ns: StrictInt
    uid: Count
    gid: Count
    unstable: StrictBool = False


class DirEntry(_Model):
    type: Literal["dir"]
    path: StrictStr
    mode: Mode
    mtime_ns: StrictInt
    uid: Count
    gid: Count


class SymlinkEntry(_Model):
    type: Literal["symlink"]
    path: StrictStr
    target: Annotated[str, Field(strict=True, min_length=1)]
    mtime_ns: StrictInt
    uid: Count
    gid: Count


Entry = Annotated[FileEntry | DirEntry | SymlinkEntry, Field(discriminator="type")]
ChunkRow = tuple[Digest, Count, Annotated[int, Field(strict=True, gt=0)], Count]


class PackChunks(_Model):
    """The chunks a snapshot uses from one pack: ``[id, offset, length, raw_length]`` rows."""

    id: Digest
    chunks: tuple[ChunkRow, ...]


class ManifestBody(_Model):
    entries: tuple[Entry, ...]
    packs: tuple[PackChunks, ...]


@dataclass(frozen=True, slots=True)
class ChunkLocation:
    """Where a chunk is stored."""

    pack_id: str
    offset: int
    length: int
    raw_length: int


class Manifest:
    """A validated manifest: its header, body, and the chunk table as a mapping."""

    __slots__ = ("body", "chunks", "header")

    def __init__(self, header: ManifestHeader, body: ManifestBody) -> None:
        self.header = header
        self.body = body
        self.chunks: Mapping[str, ChunkLocation] = {
            row[0]: ChunkLocation(pack.id, row[1], row[2], row[3])
            for pack in body.packs
            for row in pack.chunks
        }

    @property
    def snapshot_id(self) -> str:
        return self.header.snapshot_id

    @property
    def entries(self) -> tuple[FileEntry | DirEntry | SymlinkEntry, ...]:
        return self.body.entries


def pack_table(
    entries: tuple[FileEntry | DirEntry | SymlinkEntry, ...],
    where: Callable[[str], ChunkLocation],
) -> tuple[PackChunks, ...]:
    """The ``packs`` table for ``entries``: every chunk they use, grouped by pack (sorted by
    pack id, then offset). ``where`` locates a chunk (KeyError for an unknown one)."""
    by_pack: dict[str, dict[str, ChunkLocation]] = {}
    for entry in entries:
        if isinstance(entry, FileEntry):
            for chunk_id in entry.chunks:
                location = where(chunk_id)
                by_pack.setdefault(location.pack_id, {})[chunk_id] = location
    return tuple(
        PackChunks(
            id=pack_id,
            chunks=tuple(
                (chunk_id, loc.offset, loc.length, loc.raw_length)
                for chunk_id, loc in sorted(chunks.items(), key=lambda kv: kv[1].offset)
            ),
        )
        for pack_id, chunks in sorted(by_pack.items())
    )


# --- encoding ----------------------------------------------------------------------------------


def canonical_json(document: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII (lone surrogates of undecodable names survive)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _frame(document: Any) -> bytes:
    compressor = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=True)
    return compressor.compress(canonical_json(document) + b"\n")


def encode_manifest(manifest: Manifest) -> bytes:
    """The stored bytes of a manifest (two zstd frames: header line, body line)."""
    header = manifest.header.model_dump(mode="json", exclude_none=True)
    body = manifest.body.model_dump(mode="json", exclude_defaults=True)
    return _frame(header) + _frame(body)


def _invalid(key: str, error: pydantic.ValidationError) -> IntegrityError:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {error.error_count() - 1} more problems)" if error.error_count() > 1 else ""
    return IntegrityError(
        f"manifest {key} is invalid at {where or 'top level'}: {first['msg']}{more}; "
        "it was not written by this version of mushroom-backup, or it is corrupt"
    )


def _json_line(data: bytes, key: str, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:
        raise IntegrityError(f"manifest {key}: the {what} is not JSON ({e})") from None


def decode_header(data: bytes, key: str) -> tuple[ManifestHeader | None, int]:
    """The header of a manifest from a prefix of its bytes, and how many bytes its frame took;
    ``(None, 0)`` if ``data`` ends inside the header frame (read more and try again)."""
    decoder = zstandard.ZstdDecompressor().decompressobj()
    try:
        text = decoder.decompress(data)
    except zstandard.ZstdError as e:
        raise IntegrityError(f"manifest {key} is not a zstd stream or is corrupt ({e})") from None
    if not decoder.eof:
        return None, 0
    used = len(data) - len(decoder.unused_data)
    try:
        header = ManifestHeader.model_validate(_json_line(text, key, "header"))
    except pydantic.ValidationError as e:
        raise _invalid(key, e) from None
    if header.version != MANIFEST_VERSION:
        raise IntegrityError(
            f"manifest {key} has format version {header.version}; this mushroom-backup reads "
            f"version {MANIFEST_VERSION} (upgrade mushroom-backup)"
        )
    return header, used


def decode_manifest(data: bytes, key: str, snapshot_id: str | None = None) -> Manifest:
    """A manifest from its stored bytes, validated as the module docstring says. If
    ``snapshot_id`` is given, the manifest must name it."""
    header, used = decode_header(data, key)
    if header is None:
        raise IntegrityError(f"manifest {key} is truncated inside its header")
    decoder = zstandard.ZstdDecompressor().decompressobj()
    try:
        text = decoder.decompress(data[used:])
    except zstandard.ZstdError as e:
        raise IntegrityError(f"manifest {key}: the body is corrupt ({e})") from None
    if not decoder.eof:
        raise IntegrityError(f"manifest {key} is truncated inside its body")
    if decoder.unused_data:
        raise IntegrityError(f"manifest {key} has unexpected bytes after its body")
    try:
        body = ManifestBody.model_validate(_json_line(text, key, "body"))
    except pydantic.ValidationError as e:
        raise _invalid(key, e) from None
    if snapshot_id is not None and header.snapshot_id != snapshot_id:
        raise IntegrityError(f"manifest {key} names snapshot {header.snapshot_id}, not itself")
    manifest = Manifest(header, body)
    check_manifest(manifest, key)
    return manifest


def check_manifest(manifest: Manifest, key: str) -> None:
    """The rules a well-typed manifest must also keep (module docstring). Raises UnsafePath for
    a path that could escape, IntegrityError for anything else."""
    entries = manifest.entries
    problem = tree_problem((e.path, e.type) for e in entries)
    if problem is not None:
        path, why = problem
        raise UnsafePath(f"manifest {key}: refusing path {path!r}: {why}")
    paths = [e.path for e in entries]
    if paths != sorted(paths):
        raise IntegrityError(f"manifest {key}: entries are not sorted by path")
    rows = sum(len(p.chunks) for p in manifest.body.packs)
    if rows != len(manifest.chunks):
        raise IntegrityError(f"manifest {key}: the chunk table lists a chunk twice")
    for entry in entries:
        if not isinstance(entry, FileEntry):
            continue
        total = 0
        for chunk_id in entry.chunks:
            location = manifest.chunks.get(chunk_id)
            if location is None:
                raise IntegrityError(
                    f"manifest {key}: file {entry.path!r} uses chunk {chunk_id}, "
                    "which is not in the chunk table"
                )
            total += location.raw_length
        if total != entry.size:
            raise IntegrityError(
                f"manifest {key}: the chunks of file {entry.path!r} add up to {total} bytes, "
                f"but its size is {entry.size}"
            )


# --- LATEST ------------------------------------------------------------------------------------


class LatestRecord(_Model):
    """The body of ``LATEST``: which complete snapshot is the newest."""

    format: Literal["mushroom-backup/latest"]
    snapshot_id: SnapshotId
    manifest: StrictStr
    created_at: AwareDatetime
    written_at: AwareDatetime
    writer: WriterInfo


def encode_latest(record: LatestRecord) -> bytes:
    return canonical_json(record.model_dump(mode="json", exclude_none=True))


def decode_latest(data: bytes) -> LatestRecord:
    """``LATEST`` from its bytes; anything malformed is an IntegrityError saying what to do."""
    try:
        record = LatestRecord.model_validate(json.loads(data))
    except (ValueError, pydantic.ValidationError) as e:
        detail = e.errors()[0]["msg"] if isinstance(e, pydantic.ValidationError) else str(e)
        raise IntegrityError(
            f"{LATEST_KEY} is not a valid pointer to a snapshot ({detail}); "
            "name a snapshot id instead of 'latest' (see `mushroom-backup snapshots`)"
        ) from None
    if record.manifest != manifest_key(record.snapshot_id):
        raise IntegrityError(
            f"{LATEST_KEY} names snapshot {record.snapshot_id} but manifest {record.manifest!r}"
        )
    return record
