"""Pack objects: many compressed chunks in one immutable, self-describing data object.

Layout of ``data/{id[:2]}/{id}`` (``id`` = SHA-256 of the whole object, lowercase hex)::

    frame_0 frame_1 ... frame_n-1     one zstd frame per chunk (content size in the header)
    trailer                           one zstd frame (with checksum) of canonical JSON:
                                      {"format": "mushroom-backup/pack", "version": 1,
                                       "chunks": [[sha256, offset, length, raw_length], ...]}
    trailer_length                    8 bytes, unsigned little-endian: the trailer's length
    magic                             8 bytes: b"MBPACK\\x00\\x01"

``sha256`` is the hash of the chunk's *uncompressed* bytes (its chunk id), ``offset``/``length``
locate its frame in the pack, ``raw_length`` is its uncompressed size. Frames follow each
other without gaps, in trailer order, starting at offset 0.

Promises
--------
* A pack names itself: its key is the SHA-256 of its bytes, so an object whose bytes do not hash
  to its name is corrupt, and two writers of the same pack write identical bytes (a create-only
  write that finds it present has nothing more to do).
* A pack can be read without any manifest: the last 16 bytes give the trailer, the trailer
  gives every chunk (``check`` and a future ``rebuild-index`` rely on this).
* Decoding refuses anything malformed with an :class:`~mushroom_backup.errors.IntegrityError`
  that names the object.
* A chunk id is checked against the bytes it decompresses to by whoever reads it
  (:func:`decompress_chunk`): nothing here trusts the stored bytes.

Not promised: any order of chunks beyond "as they were added"; a maximum pack size (a pack is
sealed once it reaches its target, so it can exceed it by up to one chunk).
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import zstandard

from ..errors import IntegrityError

PACK_MAGIC = b"MBPACK\x00\x01"
_FOOTER = struct.Struct("<Q8s")
FOOTER_SIZE = _FOOTER.size
PACK_FORMAT = "mushroom-backup/pack"
PACK_VERSION = 1
DATA_PREFIX = "data/"
_TRAILER_LEVEL = 3
_MAX_TRAILER = 64 << 20
_HEX = frozenset("0123456789abcdef")


def is_hex_digest(text: object) -> bool:
    """Whether ``text`` is a lowercase hex SHA-256 digest."""
    return isinstance(text, str) and len(text) == 64 and _HEX.issuperset(text)


def pack_key(pack_id: str) -> str:
    """The store key of a pack: ``data/{id[:2]}/{id}``."""
    return f"{DATA_PREFIX}{pack_id[:2]}/{pack_id}"


def pack_id_of_key(key: str) -> str | None:
    """The pack id a store key names, or None if the key is not a pack's."""
    parts = key.split("/")
    if (
        len(parts) == 3
        and parts[0] + "/" == DATA_PREFIX
        and is_hex_digest(parts[2])
        and parts[1] == parts[2][:2]
    ):
        return parts[2]
    return None


# --- chunks ------------------------------------------------------------------------------------

_local = threading.local()


def compress_chunk(data: bytes | memoryview, level: int) -> bytes:
    """One zstd frame of ``data`` (content size recorded), in a bytes object of exactly its
    size. Thread-safe: one compressor per thread and level; zstandard releases the GIL."""
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    frame = compressor.compress(data)
    # zstandard allocates the frame at its worst-case size (about len(data)) and keeps that
    # allocation: copy it out, so that a pack of frames holds its bytes only once.
    return bytes(memoryview(frame))


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def decompress_chunk(
    frame: bytes | memoryview, chunk_id: str, raw_length: int, where: str
) -> bytes:
    """The bytes of chunk ``chunk_id`` from its stored ``frame``, verified: exactly
    ``raw_length`` bytes whose SHA-256 is ``chunk_id``. Anything else is an IntegrityError
    that starts with ``where`` (e.g. "restoring 'a/b' from pack data/ab/ab12...")."""
    try:
        data = _decompressor().decompress(frame, max_output_size=raw_length)
    except zstandard.ZstdError as e:
        raise IntegrityError(f"{where}: chunk {chunk_id} does not decompress ({e})") from None
    if len(data) != raw_length:
        raise IntegrityError(
            f"{where}: chunk {chunk_id} decompressed to {len(data)} bytes, expected {raw_length}"
        )
    if hashlib.sha256(data).hexdigest() != chunk_id:
        raise IntegrityError(f"{where}: chunk {chunk_id} does not match its hash (corrupt data)")
    return data


# --- packs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PackedChunk:
    """Where one chunk's frame lies in its pack."""

    chunk_id: str
    offset: int
    length: int
    raw_length: int


@dataclass(frozen=True, slots=True)
class SealedPack:
    """A finished pack, ready to upload."""

    pack_id: str
    data: bytes
    chunks: tuple[PackedChunk, ...]

    @property
    def key(self) -> str:
        return pack_key(self.pack_id)


class PackBuilder:
    """Collects compressed chunks until the caller seals them into a pack. Not thread-safe:
    one owner adds and seals; sealing (which copies the frames into one object and hashes
    it) may run in a worker thread while nobody adds."""

    def __init__(self) -> None:
        self._frames: list[bytes] = []
        self._chunks: list[PackedChunk] = []
        self._ids: set[str] = set()
        self.size = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._ids

    def add(self, chunk_id: str, frame: bytes, raw_length: int) -> PackedChunk:
        """Append one chunk's frame. Adding an id already in this pack is a ValueError."""
        if chunk_id in self._ids:
            raise ValueError(f"chunk {chunk_id} is already in this pack")
        placed = PackedChunk(chunk_id, self.size, len(frame), raw_length)
        self._frames.append(frame)
        self._chunks.append(placed)
        self._ids.add(chunk_id)
        self.size += len(frame)
        return placed

    def seal(self) -> SealedPack:
        """The pack of everything added so far; the builder is empty afterwards."""
        if not self._chunks:
            raise ValueError("an empty pack cannot be sealed")
        chunks = tuple(self._chunks)
        trailer = encode_trailer(chunks)
        self._frames.append(trailer)
        self._frames.append(_FOOTER.pack(len(trailer), PACK_MAGIC))
        data = b"".join(self._frames)
        self._frames, self._chunks, self._ids, self.size = [], [], set(), 0
        return SealedPack(hashlib.sha256(data).hexdigest(), data, chunks)


def encode_trailer(chunks: Iterable[PackedChunk]) -> bytes:
    """The zstd frame (with checksum) of a pack's trailer JSON."""
    document = {
        "format": PACK_FORMAT,
        "version": PACK_VERSION,
        "chunks": [[c.chunk_id, c.offset, c.length, c.raw_length] for c in chunks],
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return zstandard.ZstdCompressor(level=_TRAILER_LEVEL, write_checksum=True).compress(text)


def trailer_length(footer: bytes, key: str) -> int:
    """The trailer length a pack's last :data:`FOOTER_SIZE` bytes give."""
    if len(footer) != FOOTER_SIZE:
        raise IntegrityError(f"pack {key} is truncated: it has no complete footer")
    length, magic = _FOOTER.unpack(footer)
    if magic != PACK_MAGIC:
        raise IntegrityError(f"pack {key} has no pack footer (wrong magic): not a pack or corrupt")
    if not 0 < length <= _MAX_TRAILER:
        raise IntegrityError(f"pack {key} has an impossible trailer length {length}")
    return int(length)


def decode_trailer(frame: bytes, key: str, frames_end: int) -> tuple[PackedChunk, ...]:
    """The chunks a pack's trailer lists, checked: frames lie back to back from offset 0 up to
    ``frames_end`` (where the trailer starts), ids are hex SHA-256 digests and unique."""
    try:
        document = json.loads(zstandard.ZstdDecompressor().decompress(frame))
    except (zstandard.ZstdError, ValueError) as e:
        raise IntegrityError(f"pack {key} has an unreadable trailer ({e})") from None
    if (
        not isinstance(document, dict)
        or document.get("format") != PACK_FORMAT
        or document.get("version") != PACK_VERSION
        or not isinstance(document.get("chunks"), list)
    ):
        raise IntegrityError(f"pack {key}: the trailer is not a version {PACK_VERSION} pack index")
    chunks: list[PackedChunk] = []
    seen: set[str] = set()
    expected_offset = 0
    for row in document["chunks"]:
        if (
            not isinstance(row, list)
            or len(row) != 4
            or not is_hex_digest(row[0])
            or not all(type(v) is int and v >= 0 for v in row[1:])
        ):
            raise IntegrityError(f"pack {key}: malformed trailer row {row!r}")
        chunk = PackedChunk(row[0], row[1], row[2], row[3])
        if chunk.offset != expected_offset or chunk.length == 0:
            raise IntegrityError(f"pack {key}: chunk {chunk.chunk_id} is not where it should be")
        if chunk.chunk_id in seen:
            raise IntegrityError(f"pack {key}: chunk {chunk.chunk_id} is listed twice")
        seen.add(chunk.chunk_id)
        expected_offset += chunk.length
        chunks.append(chunk)
    if expected_offset != frames_end:
        raise IntegrityError(f"pack {key}: the trailer does not account for all of its bytes")
    return tuple(chunks)


def decode_pack(data: bytes, key: str) -> tuple[PackedChunk, ...]:
    """The chunks of a whole pack held in memory, after checking that its bytes hash to its
    name (when ``key`` is a pack key) and that its footer and trailer are sound."""
    pack_id = pack_id_of_key(key)
    if pack_id is not None and hashlib.sha256(data).hexdigest() != pack_id:
        raise IntegrityError(f"pack {key} does not match its name (corrupt or truncated)")
    length = trailer_length(data[-FOOTER_SIZE:], key)
    trailer_start = len(data) - FOOTER_SIZE - length
    if trailer_start < 0:
        raise IntegrityError(f"pack {key} is truncated: shorter than its trailer")
    return decode_trailer(data[trailer_start : len(data) - FOOTER_SIZE], key, trailer_start)
