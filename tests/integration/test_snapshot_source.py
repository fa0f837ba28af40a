"""Reading the source: special files, excludes, unreadable and vanished entries, and files that
change while they are read."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mushroom_backup.clock import SYSTEM_CLOCK
from mushroom_backup.errors import SnapshotError
from mushroom_backup.snapshot import (
    BackupOptions,
    FileEntry,
    SnapshotResult,
    load_manifest,
    read_latest,
    reader,
    restore_snapshot,
    scan,
    take_snapshot,
)
from mushroom_backup.snapshot import backup as backup_module
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.integration.snapshot_trees import CHUNK, OPTIONS, WRITER, pattern, picture
else:
    from snapshot_trees import CHUNK, OPTIONS, WRITER, pattern, picture


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "data" / "pg_stat_tmp").mkdir(parents=True)
    (root / "data" / "small").write_bytes(b"small file\n")
    (root / "data" / "large").write_bytes(pattern(5 * CHUNK + 10, 1))
    (root / "data" / "pg_stat_tmp" / "stats").write_bytes(b"volatile")
    (root / "data" / "x.tmp").write_bytes(b"scratch")
    (root / "keep.tmp.txt").write_bytes(b"kept")
    return root


@pytest.fixture
def snapshot_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("mushroom_backup.snapshot")
    caplog.handler.setLevel(logging.DEBUG)
    logger.addHandler(caplog.handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)


async def _backup(store: MemoryStore, source: Path, **options: Any) -> SnapshotResult:
    return await take_snapshot(
        store, source, options=replace(OPTIONS, **options), writer=WRITER, clock=SYSTEM_CLOCK
    )


async def test_special_files_are_skipped_with_a_warning(source: Path, tmp_path: Path) -> None:
    os.mkfifo(source / "data" / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(source / "sock"))
    try:
        store = MemoryStore()
        result = await take_snapshot(
            store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
        )
    finally:
        server.close()
    assert sorted((w.kind, w.path) for w in result.warnings) == [
        ("special-file", "data/fifo"),
        ("special-file", "sock"),
    ]
    assert "FIFO" in next(w.message for w in result.warnings if w.path == "data/fifo")
    manifest = await load_manifest(store, result.snapshot_id)
    paths = [e.path for e in manifest.entries]
    assert "data/fifo" not in paths
    assert "sock" not in paths
    assert manifest.header.summary.skipped == 2


async def test_excludes_leave_out_names_paths_and_subtrees(source: Path, tmp_path: Path) -> None:
    store = MemoryStore()
    result = await take_snapshot(
        store,
        source,
        options=BackupOptions(excludes=("*.tmp", "/data/pg_stat_tmp"), chunk_size=CHUNK),
        writer=WRITER,
        clock=SYSTEM_CLOCK,
    )
    manifest = await load_manifest(store, result.snapshot_id)
    assert [e.path for e in manifest.entries] == [
        "data",
        "data/large",
        "data/small",
        "keep.tmp.txt",
    ]


def _deny(monkeypatch: pytest.MonkeyPatch, victim: Path, module_function: str) -> None:
    """Make ``os.<function>`` fail with EACCES for ``victim`` (tests may run as root, which
    permissions alone would not stop)."""
    original = getattr(os, module_function)

    def denied(path: object, *args: object, **kwargs: object) -> object:
        if os.fspath(path) == str(victim):  # type: ignore[call-overload]
            raise PermissionError(13, "Permission denied", str(victim))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(os, module_function, denied)


@pytest.mark.parametrize("name", ["small", "large"])
async def test_an_unreadable_file_is_an_error_naming_it(
    source: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    victim = source / "data" / name
    _deny(monkeypatch, victim, "open")
    store = MemoryStore()
    with pytest.raises(SnapshotError, match=f"cannot read {victim}: Permission denied.*--skip"):
        await _backup(store, source)
    assert await read_latest(store) is None
    assert [k for k in store.keys if not k.startswith("data/")] == []  # no manifest, no LATEST
    result = await _backup(store, source, skip_unreadable=True)
    assert [(w.kind, w.path) for w in result.warnings] == [("unreadable", f"data/{name}")]
    manifest = await load_manifest(store, result.snapshot_id)
    assert f"data/{name}" not in [e.path for e in manifest.entries]


async def test_an_unreadable_directory_is_an_error_naming_it(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = source / "data" / "pg_stat_tmp"
    _deny(monkeypatch, victim, "scandir")
    store = MemoryStore()
    with pytest.raises(SnapshotError, match=r"cannot read directory .*pg_stat_tmp"):
        await _backup(store, source)
    result = await _backup(store, source, skip_unreadable=True)
    assert [(w.kind, w.path) for w in result.warnings] == [("unreadable", "data/pg_stat_tmp")]
    manifest = await load_manifest(store, result.snapshot_id)
    paths = [e.path for e in manifest.entries]
    assert "data/pg_stat_tmp" in paths  # kept, empty
    assert "data/pg_stat_tmp/stats" not in paths


async def test_a_file_that_vanished_since_the_scan_is_left_out(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_scan = scan.scan_tree

    def scan_then_delete(*args: object, **kwargs: object) -> scan.ScanResult:
        result = real_scan(*args, **kwargs)  # type: ignore[arg-type]
        (source / "data" / "small").unlink()
        (source / "data" / "large").unlink()
        return result

    monkeypatch.setattr(backup_module, "scan_tree", scan_then_delete)
    store = MemoryStore()
    result = await _backup(store, source)
    assert sorted((w.kind, w.path) for w in result.warnings) == [
        ("vanished", "data/large"),
        ("vanished", "data/small"),
    ]


async def test_a_small_file_that_grew_past_a_chunk_is_read_whole(
    source: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_scan = scan.scan_tree
    grown = pattern(3 * CHUNK + 5, 9)

    def scan_then_grow(*args: object, **kwargs: object) -> scan.ScanResult:
        result = real_scan(*args, **kwargs)  # type: ignore[arg-type]
        (source / "data" / "small").write_bytes(grown)
        return result

    monkeypatch.setattr(backup_module, "scan_tree", scan_then_grow)
    store = MemoryStore()
    await _backup(store, source)
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target)
    assert (target / "data" / "small").read_bytes() == grown


@pytest.mark.parametrize(("name", "chunks"), [("small", 1), ("large", 6)])
async def test_a_file_changing_while_read_is_read_again(
    source: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    snapshot_log: pytest.LogCaptureFixture,
    name: str,
    chunks: int,
) -> None:
    victim = source / "data" / name
    seen: list[int] = []

    def writer_appends_once(path: str, attempt: int) -> None:
        if path == str(victim):
            seen.append(attempt)
            if attempt == 1:
                with victim.open("ab") as handle:
                    handle.write(b"+")  # a concurrent writer, between read and re-check

    monkeypatch.setattr(reader, "after_read", writer_appends_once)
    store = MemoryStore()
    result = await _backup(store, source)
    assert seen == [1, 2]
    assert result.warnings == ()
    manifest = await load_manifest(store, result.snapshot_id)
    entry = next(e for e in manifest.entries if e.path == f"data/{name}")
    assert isinstance(entry, FileEntry)
    assert not entry.unstable
    assert len(entry.chunks) == chunks
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target)
    assert (target / "data" / name).read_bytes() == victim.read_bytes()
    assert (target / "data" / name).read_bytes().endswith(b"+")
    assert "snapshot.file_changed_while_read" in snapshot_log.messages


@pytest.mark.parametrize("name", ["small", "large"])
async def test_a_file_that_never_settles_is_stored_flagged_or_fails(
    source: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    victim = source / "data" / name

    def writer_never_stops(path: str, attempt: int) -> None:
        if path == str(victim):
            with victim.open("ab") as handle:
                handle.write(b"+")

    monkeypatch.setattr(reader, "after_read", writer_never_stops)
    store = MemoryStore()
    with pytest.raises(SnapshotError, match=f"{victim} kept changing .*3 attempts"):
        await _backup(store, source, fail_on_unstable=True)
    assert await read_latest(store) is None
    result = await _backup(store, source)
    assert [(w.kind, w.path) for w in result.warnings] == [("unstable", f"data/{name}")]
    manifest = await load_manifest(store, result.snapshot_id)
    entry = next(e for e in manifest.entries if e.path == f"data/{name}")
    assert isinstance(entry, FileEntry)
    assert entry.unstable
    assert manifest.header.summary.unstable_files == 1
    # stored as last read: it restores, and verifies, as the bytes that were read
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target)
    assert (target / "data" / name).read_bytes() == victim.read_bytes()[:-1]
    # an unstable file is read again next time even if it looks unchanged
    monkeypatch.undo()
    again = await _backup(store, source)
    assert again.files_read == 1


async def test_picture_of_a_source_with_every_kind_round_trips(
    source: Path, tmp_path: Path
) -> None:
    (source / "link").symlink_to("data/small")
    store = MemoryStore()
    await _backup(store, source)
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target)
    assert picture(target) == picture(source)
