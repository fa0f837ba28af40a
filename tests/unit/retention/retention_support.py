"""Helpers for the retention tests: hand-made manifests for the pure rules, and small source
trees, snapshots and byte-for-byte pictures for the drivers."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from mushroom_backup.snapshot import BackupOptions, WriterInfo
from mushroom_backup.snapshot.manifest import (
    ChunkingParams,
    ChunkLocation,
    DirEntry,
    FileEntry,
    Manifest,
    ManifestBody,
    ManifestHeader,
    SourceInfo,
    Summary,
    SymlinkEntry,
    pack_table,
)

CHUNK = 4096
#: Small chunks and packs: a few dozen KiB make many chunks and several packs.
OPTIONS = BackupOptions(chunk_size=CHUNK, pack_size=4 * CHUNK, upload_concurrency=2, workers=2)
WRITER = WriterInfo(instance_id="retention-test", exclusion="conditional", host="test-host")


# --- hand-made manifests -----------------------------------------------------------------------


def file_entry(path: str, chunks: tuple[str, ...], size: int) -> FileEntry:
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
    )


def manifest(
    snapshot_id: str,
    files: Mapping[str, tuple[str, ...]],
    where: Mapping[str, ChunkLocation],
) -> Manifest:
    """A valid manifest of ``files`` (path -> chunk ids) whose chunks lie where ``where``
    says. Each file's size is the sum of its chunks' raw lengths."""
    entries: tuple[FileEntry | DirEntry | SymlinkEntry, ...] = tuple(
        file_entry(path, chunks, sum(where[c].raw_length for c in chunks))
        for path, chunks in sorted(files.items())
    )
    summary = Summary(
        files=len(entries),
        dirs=0,
        symlinks=0,
        bytes=0,
        bytes_read=0,
        files_read=0,
        files_reused=0,
        new_chunks=0,
        new_packs=0,
        new_bytes_stored=0,
        unstable_files=0,
        skipped=0,
        duration_s=0.0,
    )
    header = ManifestHeader(
        format="mushroom-backup/manifest",
        version=1,
        snapshot_id=snapshot_id,
        created_at=datetime(2026, 11, 29, tzinfo=UTC),
        source=SourceInfo(host="db1", path="/var/lib/db"),
        writer=WRITER,
        chunking=ChunkingParams(
            algorithm="fixed",
            chunk_size=CHUNK,
            hash="sha256",
            compression="zstd",
            level=3,
            pack_size=4 * CHUNK,
        ),
        summary=summary,
    )
    return Manifest(
        header, ManifestBody(entries=entries, packs=pack_table(entries, where.__getitem__))
    )


# --- source trees ------------------------------------------------------------------------------


def content(size: int, seed: str) -> bytes:
    """``size`` bytes, different for every seed, about half compressible."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest() + bytes(32)
        counter += 1
    return bytes(out[:size])


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (relative path -> bytes) under ``root``, creating directories."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def base_files() -> dict[str, bytes]:
    """A small data directory: a multi-chunk table, a WAL segment, small files."""
    return {
        "PG_VERSION": b"16\n",
        "base/1/1259": content(6 * CHUNK + 100, "table"),
        "base/1/1260": content(3 * CHUNK, "index"),
        "pg_wal/000000010000000000000001": content(2 * CHUNK, "wal-1"),
        "global/pg_control": content(512, "control"),
    }


def picture(root: Path) -> dict[str, tuple[object, ...]]:
    """Per relative path: type and content hash (files), target (symlinks)."""
    seen: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            seen[rel] = ("symlink", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            seen[rel] = ("dir",)
        else:
            seen[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


def data_keys(keys: Iterable[str]) -> set[str]:
    return {k for k in keys if k.startswith("data/")}


class ManualFence:
    """A fence whose deadline the test sets by hand."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def write_deadline(self) -> float | None:
        return self.deadline
