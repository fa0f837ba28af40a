"""Helpers for the snapshot integration tests: a small source tree with every kind of entry,
a comparable picture of a tree, and small backup options (tests stay fast)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from mushroom_backup.clock import FakeClock
from mushroom_backup.snapshot import BackupOptions, WriterInfo

T = TypeVar("T")

CHUNK = 4096
#: Small chunks and packs, so that a few hundred KiB make many chunks and several packs.
OPTIONS = BackupOptions(chunk_size=CHUNK, pack_size=4 * CHUNK, upload_concurrency=3, workers=2)
WRITER = WriterInfo(instance_id="test-instance", exclusion="conditional", host="test-host")
BASE_MTIME_NS = 1_700_000_000_123_456_789


def pattern(size: int, seed: int) -> bytes:
    """``size`` bytes, different for every seed, half compressible."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        block = hashlib.sha256(f"{seed}/{counter}".encode()).digest()
        out += block + bytes(32)
        counter += 1
    return bytes(out[:size])


def make_tree(root: Path) -> None:
    """Nested dirs, an empty dir, empty/small/multi-chunk files (one with repeated chunks),
    symlinks (relative, absolute, dangling, to a dir), unusual modes and fixed mtimes."""
    (root / "base" / "16384").mkdir(parents=True)
    (root / "pg_wal").mkdir()
    (root / "empty_dir").mkdir()
    (root / "deep" / "a" / "b" / "c").mkdir(parents=True)
    files = {
        "PG_VERSION": b"16\n",
        "empty": b"",
        "base/16384/16400": pattern(10 * CHUNK + 123, 1),
        "base/16384/16401": bytes(6 * CHUNK) + pattern(CHUNK, 2),  # repeated zero chunks
        "base/16384/16402": pattern(CHUNK, 3),  # exactly one chunk
        "pg_wal/000000010000000000000001": pattern(3 * CHUNK, 4),
        "deep/a/b/c/leaf.txt": b"leaf\n" * 100,
        "deep/dup.txt": b"leaf\n" * 100,  # the same content as leaf.txt
        "caf\u00e9 \u2615.txt": b"unicode name\n",
    }
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    os.chmod(root / "PG_VERSION", 0o600)
    os.chmod(root / "pg_wal" / "000000010000000000000001", 0o400)
    os.chmod(root / "base" / "16384" / "16402", 0o755)
    (root / "current").symlink_to("pg_wal/000000010000000000000001")
    (root / "absolute-link").symlink_to("/etc/hostname")
    (root / "dangling").symlink_to("does/not/exist")
    (root / "dir-link").symlink_to("deep/a")
    os.chmod(root / "deep" / "a", 0o750)
    set_mtimes(root)


def set_mtimes(root: Path) -> None:
    """Distinct fixed mtimes everywhere, deepest first (so dirs keep theirs)."""
    paths = sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    for index, path in enumerate(paths):
        mtime = BASE_MTIME_NS + index * 1_000_000_007
        os.utime(path, ns=(mtime, mtime), follow_symlinks=False)


def picture(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything restore promises to reproduce, per relative path: type, mode, mtime_ns, and
    the content hash or link target."""
    seen: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            seen[rel] = ("symlink", os.readlink(path), st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode):
            seen[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            seen[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size, digest)
    return seen


def leftovers(root: Path) -> list[str]:
    """Temporary files restore left behind (there must be none)."""
    return [p.name for p in root.rglob(".mushroom-restore-*")]


async def drive(clock: FakeClock, work: Coroutine[Any, Any, T], step: float = 1.0) -> T:
    """Run ``work`` to completion, moving the fake clock on whenever something sleeps on it
    (retry pauses), so that tests with a FakeClock never wait for real time to pass."""
    task = asyncio.ensure_future(work)
    while not task.done():
        if clock.sleepers:
            clock.advance(step)
        await asyncio.wait({task}, timeout=0.01)
    return task.result()
