"""Manifest and LATEST: round trips, the header-only read, and strict validation."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import zstandard

from mushroom_backup.errors import IntegrityError, UnsafePath
from mushroom_backup.snapshot.manifest import (
    ChunkingParams,
    ChunkLocation,
    DirEntry,
    FileEntry,
    LatestRecord,
    Manifest,
    ManifestBody,
    ManifestHeader,
    SourceInfo,
    Summary,
    SymlinkEntry,
    WriterInfo,
    canonical_json,
    decode_header,
    decode_latest,
    decode_manifest,
    encode_latest,
    encode_manifest,
    pack_table,
)

SNAP = "20261129T101500.123Z-3f9a1c2e"
KEY = f"manifests/{SNAP}"
C1, C2, C3 = ("1" * 64, "2" * 64, "3" * 64)
P1, P2 = ("a" * 64, "b" * 64)
WHERE = {
    C1: ChunkLocation(P1, 0, 40, 100),
    C2: ChunkLocation(P1, 40, 30, 100),
    C3: ChunkLocation(P2, 0, 10, 7),
}
WRITER = WriterInfo(instance_id="inst-1", exclusion="conditional", node_id=3)


def _file(path: str, chunks: tuple[str, ...], size: int, **extra: Any) -> FileEntry:
    return FileEntry(
        type="file",
        path=path,
        mode=0o640,
        mtime_ns=1_700_000_000_000_000_000,
        size=size,
        sha256="f" * 64,
        chunks=chunks,
        inode=42,
        dev=2049,
        ctime_ns=1_700_000_000_000_000_001,
        uid=1000,
        gid=1000,
        **extra,
    )


def make_manifest() -> Manifest:
    entries: tuple[FileEntry | DirEntry | SymlinkEntry, ...] = (
        DirEntry(type="dir", path="base", mode=0o700, mtime_ns=5, uid=0, gid=0),
        _file("base/16384", (C1, C2, C1), 300),
        _file("base/caf\udce9", (C3,), 7, unstable=True),
        _file("base/empty", (), 0),
        SymlinkEntry(type="symlink", path="current", target="../x", mtime_ns=6, uid=0, gid=0),
    )
    summary = Summary(
        files=3,
        dirs=1,
        symlinks=1,
        bytes=307,
        bytes_read=307,
        files_read=3,
        files_reused=0,
        new_chunks=3,
        new_packs=2,
        new_bytes_stored=80,
        unstable_files=1,
        skipped=0,
        duration_s=0.5,
    )
    header = ManifestHeader(
        format="mushroom-backup/manifest",
        version=1,
        snapshot_id=SNAP,
        parent_id=None,
        created_at=datetime(2026, 11, 29, 10, 15, 0, 123000, tzinfo=UTC),
        source=SourceInfo(host="db1", path="/var/lib/db"),
        writer=WRITER,
        chunking=ChunkingParams(
            algorithm="fixed",
            chunk_size=512 * 1024,
            hash="sha256",
            compression="zstd",
            level=3,
            pack_size=8 << 20,
        ),
        summary=summary,
    )
    return Manifest(
        header, ManifestBody(entries=entries, packs=pack_table(entries, WHERE.__getitem__))
    )


def _lines(data: bytes) -> list[dict[str, Any]]:
    text = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    header, used = decode_header(data, KEY)
    assert header is not None
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[used:])
    return [json.loads(text), json.loads(body)]


def _encode(header: dict[str, Any], body: dict[str, Any]) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return compressor.compress(canonical_json(header) + b"\n") + compressor.compress(
        canonical_json(body) + b"\n"
    )


def test_round_trip() -> None:
    manifest = make_manifest()
    data = encode_manifest(manifest)
    decoded = decode_manifest(data, KEY, SNAP)
    assert decoded.header == manifest.header
    assert decoded.body == manifest.body
    assert decoded.chunks == WHERE
    assert encode_manifest(decoded) == data  # canonical: the same bytes again


def test_encoding_is_two_json_lines_with_a_compact_chunk_table() -> None:
    header, body = _lines(encode_manifest(make_manifest()))
    assert header["snapshot_id"] == SNAP
    assert header["writer"] == {"exclusion": "conditional", "instance_id": "inst-1", "node_id": 3}
    assert "parent_id" not in header  # None fields are left out
    assert body["packs"] == [
        {"id": P1, "chunks": [[C1, 0, 40, 100], [C2, 40, 30, 100]]},
        {"id": P2, "chunks": [[C3, 0, 10, 7]]},
    ]
    assert body["entries"][1]["chunks"] == [C1, C2, C1]
    assert "unstable" not in body["entries"][1]  # default left out
    assert body["entries"][2]["unstable"] is True


def test_the_header_reads_from_a_prefix() -> None:
    data = encode_manifest(make_manifest())
    header, used = decode_header(data, KEY)
    assert header is not None
    assert header.summary.files == 3
    assert decode_header(data[:used], KEY)[0] == header
    assert decode_header(data[: used - 1], KEY) == (None, 0)


Mutation = Callable[[dict[str, Any], dict[str, Any]], None]


def _set(part: int, path: tuple[Any, ...], value: Any) -> Mutation:
    def mutate(header: dict[str, Any], body: dict[str, Any]) -> None:
        target: Any = (header, body)[part]
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (_set(0, ("version",), 2), IntegrityError, "format version 2"),
        (_set(0, ("snapshot_id",), "../../etc"), IntegrityError, "invalid at snapshot_id"),
        (_set(0, ("surprise",), 1), IntegrityError, "invalid at surprise: Extra inputs"),
        (_set(0, ("summary", "files"), "3"), IntegrityError, "invalid at summary.files"),
        (_set(0, ("created_at",), "2026-11-29T10:15:00"), IntegrityError, "timezone"),
        (_set(0, ("chunking", "algorithm"), "cdc"), IntegrityError, "chunking.algorithm"),
        (_set(1, ("entries", 1, "mode"), 0o10000), IntegrityError, "entries.1.file.mode"),
        (_set(1, ("entries", 1, "sha256"), "F" * 64), IntegrityError, "sha256"),
        (_set(1, ("entries", 1, "size"), True), IntegrityError, "size"),
        (_set(1, ("entries", 1, "type"), "fifo"), IntegrityError, "entries.1"),
        (_set(1, ("entries", 1, "path"), "/etc/shadow"), UnsafePath, "absolute"),
        (_set(1, ("entries", 1, "path"), "base/../../x"), UnsafePath, "'..'"),
        (_set(1, ("entries", 0, "type"), "symlink"), IntegrityError, "entries.0.symlink"),
        (_set(1, ("entries", 1, "size"), 301), IntegrityError, "add up to 300 bytes"),
        (_set(1, ("entries", 1, "chunks"), ["9" * 64]), IntegrityError, "not in the chunk table"),
        (_set(1, ("packs", 1, "chunks", 0, 2), 0), IntegrityError, "packs.1.chunks.0.2"),
        (_set(1, ("packs", 1, "id"), "nope"), IntegrityError, "packs.1.id"),
        (_set(1, ("packs",), []), IntegrityError, "not in the chunk table"),
    ],
)
def test_strict_validation(mutate: Mutation, error: type[Exception], message: str) -> None:
    header, body = _lines(encode_manifest(make_manifest()))
    mutate(header, body)
    with pytest.raises(error, match=message) as raised:
        decode_manifest(_encode(header, body), KEY)
    assert KEY in str(raised.value)


def test_an_entry_below_a_symlink_is_an_unsafe_path() -> None:
    header, body = _lines(encode_manifest(make_manifest()))
    escape = copy.deepcopy(body["entries"][3])
    escape["path"] = "current/passwd"
    body["entries"].append(escape)
    with pytest.raises(UnsafePath, match="through the symlink 'current'"):
        decode_manifest(_encode(header, body), KEY)


def test_unsorted_entries_and_duplicated_chunks_are_refused() -> None:
    header, body = _lines(encode_manifest(make_manifest()))
    body["entries"][1], body["entries"][2] = body["entries"][2], body["entries"][1]
    with pytest.raises(IntegrityError, match="not sorted"):
        decode_manifest(_encode(header, body), KEY)
    header, body = _lines(encode_manifest(make_manifest()))
    body["packs"][1]["chunks"].append(body["packs"][0]["chunks"][0])
    with pytest.raises(IntegrityError, match="lists a chunk twice"):
        decode_manifest(_encode(header, body), KEY)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated inside its header"),
        (b"not zstd at all", "not a zstd stream"),
        (zstandard.ZstdCompressor().compress(b"{not json"), "header is not JSON"),
    ],
)
def test_garbage_is_an_integrity_error(data: bytes, message: str) -> None:
    with pytest.raises(IntegrityError, match=message):
        decode_manifest(data, KEY)


def test_truncated_body_and_wrong_id() -> None:
    data = encode_manifest(make_manifest())
    for cut in (1, 4, 10):  # the checksum alone, or some content too
        with pytest.raises(IntegrityError, match="truncated inside its body"):
            decode_manifest(data[:-cut], KEY)
    with pytest.raises(IntegrityError, match="unexpected bytes after its body"):
        decode_manifest(data + b"x", KEY)
    damaged = bytearray(data)
    damaged[-2] ^= 0xFF  # the body frame's checksum
    with pytest.raises(IntegrityError, match="body is corrupt"):
        decode_manifest(bytes(damaged), KEY)
    with pytest.raises(IntegrityError, match="not itself"):
        decode_manifest(data, KEY, "20261129T101500.123Z-00000000")


def test_latest_round_trip_and_validation() -> None:
    record = LatestRecord(
        format="mushroom-backup/latest",
        snapshot_id=SNAP,
        manifest=KEY,
        created_at=datetime(2026, 11, 29, 10, 15, tzinfo=UTC),
        written_at=datetime(2026, 11, 29, 10, 16, tzinfo=UTC),
        writer=WRITER,
    )
    data = encode_latest(record)
    assert decode_latest(data) == record
    assert json.loads(data)["manifest"] == KEY
    wrong = json.loads(data)
    wrong["manifest"] = "manifests/other"
    with pytest.raises(IntegrityError, match="but manifest"):
        decode_latest(json.dumps(wrong).encode())
    with pytest.raises(IntegrityError, match="not a valid pointer"):
        decode_latest(b"{}")
    with pytest.raises(IntegrityError, match="not a valid pointer"):
        decode_latest(b"\xff")
