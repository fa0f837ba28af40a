"""Pack encoding: frames, trailer, footer; every malformation is an IntegrityError naming the
object."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable

import pytest
import zstandard

from mushroom_backup.errors import IntegrityError
from mushroom_backup.snapshot.pack import (
    FOOTER_SIZE,
    PACK_MAGIC,
    PackBuilder,
    SealedPack,
    compress_chunk,
    decode_pack,
    decompress_chunk,
    pack_id_of_key,
    pack_key,
    trailer_length,
)

CHUNKS = [b"alpha" * 1000, bytes(5000), b"x", b"omega" * 300]


def _id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sealed() -> SealedPack:
    builder = PackBuilder()
    for data in CHUNKS:
        builder.add(_id(data), compress_chunk(data, 3), len(data))
    return builder.seal()


def test_round_trip_every_chunk_by_offset() -> None:
    pack = _sealed()
    assert pack.pack_id == _id(pack.data)
    assert pack.key == f"data/{pack.pack_id[:2]}/{pack.pack_id}"
    assert pack.data.endswith(PACK_MAGIC)
    chunks = decode_pack(pack.data, pack.key)
    assert chunks == pack.chunks
    assert [c.chunk_id for c in chunks] == [_id(d) for d in CHUNKS]
    for chunk, data in zip(chunks, CHUNKS, strict=True):
        frame = pack.data[chunk.offset : chunk.offset + chunk.length]
        assert decompress_chunk(frame, chunk.chunk_id, chunk.raw_length, "test") == data


def test_trailer_is_readable_json_without_manifests() -> None:
    pack = _sealed()
    length = trailer_length(pack.data[-FOOTER_SIZE:], pack.key)
    trailer = pack.data[-FOOTER_SIZE - length : -FOOTER_SIZE]
    document = json.loads(zstandard.ZstdDecompressor().decompress(trailer))
    assert document["format"] == "mushroom-backup/pack"
    assert document["version"] == 1
    assert [row[0] for row in document["chunks"]] == [_id(d) for d in CHUNKS]


def test_builder_is_empty_after_sealing_and_refuses_duplicates() -> None:
    builder = PackBuilder()
    builder.add(_id(b"a"), compress_chunk(b"a", 3), 1)
    assert _id(b"a") in builder
    with pytest.raises(ValueError, match="already in this pack"):
        builder.add(_id(b"a"), compress_chunk(b"a", 3), 1)
    builder.seal()
    assert len(builder) == 0
    assert builder.size == 0
    with pytest.raises(ValueError, match="empty pack"):
        builder.seal()


def _corrupt_trailer(document: object) -> bytes:
    """A pack whose trailer is replaced by ``document`` (frames and footer kept sound)."""
    pack = _sealed()
    length = trailer_length(pack.data[-FOOTER_SIZE:], pack.key)
    frames = pack.data[: -FOOTER_SIZE - length]
    trailer = zstandard.ZstdCompressor().compress(json.dumps(document).encode())
    return frames + trailer + struct.pack("<Q8s", len(trailer), PACK_MAGIC)


def _rows() -> list[list[object]]:
    return [[c.chunk_id, c.offset, c.length, c.raw_length] for c in _sealed().chunks]


def _with(row: int, column: int, value: object) -> list[list[object]]:
    rows = _rows()
    rows[row][column] = value
    return rows


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no complete footer"),
        (b"short", "no complete footer"),
        (b"x" * 64, "wrong magic"),
        (struct.pack("<Q8s", 0, PACK_MAGIC), "impossible trailer length"),
        (struct.pack("<Q8s", 1000, PACK_MAGIC), "shorter than its trailer"),
        (b"junk" + struct.pack("<Q8s", 4, PACK_MAGIC), "unreadable trailer"),
        (
            _corrupt_trailer({"format": "other", "version": 1, "chunks": []}),
            "not a version 1 pack index",
        ),
        (
            _corrupt_trailer({"format": "mushroom-backup/pack", "version": 1, "chunks": [[1]]}),
            "malformed trailer row",
        ),
        (
            _corrupt_trailer(
                {"format": "mushroom-backup/pack", "version": 1, "chunks": _with(1, 1, 7)}
            ),
            "not where it should be",
        ),
        (
            _corrupt_trailer(
                {"format": "mushroom-backup/pack", "version": 1, "chunks": _with(1, 0, "AB")}
            ),
            "malformed trailer row",
        ),
        (
            _corrupt_trailer(
                {"format": "mushroom-backup/pack", "version": 1, "chunks": _rows()[:-1]}
            ),
            "does not account for all of its bytes",
        ),
    ],
)
def test_malformed_packs(data: bytes, message: str) -> None:
    with pytest.raises(IntegrityError, match=message) as raised:
        decode_pack(data, "data/xx/not-a-pack-id")
    assert "data/xx/not-a-pack-id" in str(raised.value)


def test_a_pack_whose_bytes_do_not_match_its_name_is_corrupt() -> None:
    pack = _sealed()
    damaged = bytearray(pack.data)
    damaged[3] ^= 0xFF
    with pytest.raises(IntegrityError, match="does not match its name"):
        decode_pack(bytes(damaged), pack.key)


@pytest.mark.parametrize(
    ("mangle", "raw_length", "message"),
    [
        (lambda f: f[:-2], 5000, "does not decompress"),
        (lambda f: b"garbage" + f, 5000, "does not decompress"),
        (lambda f: f, 4999, "expected 4999"),
        (lambda f: compress_chunk(b"other" * 1000, 3), 5000, "does not match its hash"),
    ],
)
def test_decompress_chunk_verifies(
    mangle: Callable[[bytes], bytes], raw_length: int, message: str
) -> None:
    data = b"alpha" * 1000
    frame = mangle(compress_chunk(data, 3))
    with pytest.raises(IntegrityError, match=message) as raised:
        decompress_chunk(frame, _id(data), raw_length, "restoring 'f' from pack P")
    assert str(raised.value).startswith("restoring 'f' from pack P: chunk ")


@pytest.mark.parametrize(
    ("key", "pack_id"),
    [
        (pack_key("ab" + "0" * 62), "ab" + "0" * 62),
        ("data/ab/cd" + "0" * 62, None),  # prefix directory does not match
        ("data/ab", None),
        ("manifests/ab" + "0" * 62, None),
        ("data/AB/AB" + "0" * 62, None),
    ],
)
def test_pack_id_of_key(key: str, pack_id: str | None) -> None:
    assert pack_id_of_key(key) == pack_id
