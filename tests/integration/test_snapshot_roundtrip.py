"""Backup and restore against every store (memory, local, moto, SeaweedFS): byte-for-byte
round trips with modes, mtimes and symlinks, change detection, dedup, listing, verify-only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import SYSTEM_CLOCK
from mushroom_backup.errors import UsageError
from mushroom_backup.snapshot import (
    BackupOptions,
    FileEntry,
    list_snapshots,
    load_manifest,
    read_latest,
    restore_snapshot,
    take_snapshot,
)
from mushroom_backup.store import ObjectStore, open_store
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.integration.snapshot_trees import (
        CHUNK,
        OPTIONS,
        WRITER,
        leftovers,
        make_tree,
        pattern,
        picture,
        set_mtimes,
    )
else:
    from snapshot_trees import (
        CHUNK,
        OPTIONS,
        WRITER,
        leftovers,
        make_tree,
        pattern,
        picture,
        set_mtimes,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    root.mkdir()
    make_tree(root)
    return root


async def test_backup_restore_round_trip_on_every_store(
    any_store_url: str, source: Path, tmp_path: Path
) -> None:
    async with open_store(any_store_url) as store:
        result = await take_snapshot(
            store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
        )
        assert result.files == 9
        assert result.symlinks == 4
        assert result.dirs == 8
        assert result.warnings == ()
        assert result.new_packs >= 2  # small packs: the data spans several
        target = tmp_path / "restored"
        restored = await restore_snapshot(store, "latest", target)
        assert restored.snapshot_id == result.snapshot_id
        assert restored.files == 9
        assert picture(target) == picture(source)
        assert leftovers(target) == []
        # verify-only reads and checks it all, and writes nothing
        checked = await restore_snapshot(store, result.snapshot_id, None, verify_only=True)
        assert checked.bytes == result.bytes_scanned
        assert checked.bytes_downloaded > 0


async def test_unchanged_rebackup_uploads_only_manifest_and_latest(
    source: Path, tmp_path: Path
) -> None:
    for inner in (MemoryStore(), open_store((tmp_path / "local").as_uri())):
        store = FaultyStore(inner)
        first = await take_snapshot(
            store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
        )
        store.calls.clear()
        second = await take_snapshot(
            store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
        )
        puts = [key for op, key in store.calls if op == "put"]
        assert puts == [second.manifest_key, "LATEST"]
        assert second.parent_id == first.snapshot_id
        assert second.files_reused == second.files == 9
        assert second.bytes_read == 0
        assert second.new_chunks == second.new_packs == second.new_bytes_stored == 0
        assert second.dedup_ratio == 1.0
        manifest = await load_manifest(store, second.snapshot_id)
        previous = await load_manifest(store, first.snapshot_id)
        assert manifest.body.entries == previous.body.entries
        assert manifest.chunks == previous.chunks


async def _backup(store: ObjectStore, source: Path, options: BackupOptions = OPTIONS) -> object:
    return await take_snapshot(store, source, options=options, writer=WRITER, clock=SYSTEM_CLOCK)


@pytest.mark.parametrize(
    ("offset", "chunks"),
    [
        (5 * 128 * 1024, 1),  # aligned to a chunk: exactly that chunk is new
        (5 * 128 * 1024 + 96 * 1024, 2),  # straddles a boundary: two chunks
    ],
)
async def test_a_small_in_place_change_uploads_about_one_chunk(
    tmp_path: Path, offset: int, chunks: int
) -> None:
    chunk = 128 * 1024
    options = BackupOptions(chunk_size=chunk, pack_size=4 * chunk, workers=2)
    source = tmp_path / "db"
    source.mkdir()
    big = source / "table"
    big.write_bytes(os.urandom(32 * chunk))  # incompressible: stored bytes = raw bytes
    store = FaultyStore(MemoryStore())
    await take_snapshot(store, source, options=options, writer=WRITER, clock=SYSTEM_CLOCK)
    with big.open("r+b") as handle:
        handle.seek(offset)
        handle.write(os.urandom(64 * 1024))
    store.calls.clear()
    result = await take_snapshot(store, source, options=options, writer=WRITER, clock=SYSTEM_CLOCK)
    assert result.files_read == 1
    assert result.new_chunks == chunks
    assert result.new_packs == 1
    data_puts = [key for op, key in store.calls if op == "put" and key.startswith("data/")]
    assert len(data_puts) == 1
    overhead = 16 * 1024  # pack trailer, manifest, LATEST
    assert chunks * chunk < result.bytes_uploaded < chunks * chunk + overhead
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target)
    assert (target / "table").read_bytes() == big.read_bytes()


async def test_dedup_within_and_across_snapshots(source: Path, tmp_path: Path) -> None:
    store = MemoryStore()
    first = await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    manifest = await load_manifest(store, first.snapshot_id)
    used = [c for e in manifest.entries if isinstance(e, FileEntry) for c in e.chunks]
    # zero chunks and the duplicated file are stored once
    assert first.new_chunks == len(set(used)) < len(used)
    # a copy of an existing file is read but adds no chunk
    (source / "copy").write_bytes((source / "base/16384/16400").read_bytes())
    second = await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    assert second.files_read == 1
    assert second.new_chunks == 0
    assert second.new_packs == 0


async def test_listing_is_oldest_first_and_marks_latest(source: Path) -> None:
    store = MemoryStore()
    assert await list_snapshots(store) == []
    assert await read_latest(store) is None
    ids = []
    for round_ in range(3):
        (source / "PG_VERSION").write_bytes(f"{round_}\n".encode())
        result = await take_snapshot(
            store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
        )
        ids.append(result.snapshot_id)
    store_calls = FaultyStore(store)
    infos = await list_snapshots(store_calls)
    assert [i.snapshot_id for i in infos] == ids
    assert [i.is_latest for i in infos] == [False, False, True]
    assert infos[0].files == 9
    assert infos[0].size == infos[1].size
    assert infos[0].new_bytes > infos[1].new_bytes > 0
    assert infos[2].writer_instance == "test-instance"
    assert infos[2].header.parent_id == ids[1]
    # one ranged read per manifest (the header frame), plus LATEST and the listing
    assert sorted(op for op, _ in store_calls.calls) == [
        "get",
        "get_range",
        "get_range",
        "get_range",
        "list",
    ]
    latest = await read_latest(store)
    assert latest is not None
    assert latest.snapshot_id == ids[2]


async def test_non_empty_target_is_refused_without_force(source: Path, tmp_path: Path) -> None:
    store = MemoryStore()
    await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    target = tmp_path / "restored"
    target.mkdir()
    (target / "keep.txt").write_bytes(b"mine")
    (target / "PG_VERSION").write_bytes(b"old")
    with pytest.raises(UsageError, match="not empty"):
        await restore_snapshot(store, "latest", target)
    assert (target / "PG_VERSION").read_bytes() == b"old"
    await restore_snapshot(store, "latest", target, force=True)
    assert (target / "PG_VERSION").read_bytes() == b"16\n"
    assert (target / "keep.txt").read_bytes() == b"mine"  # left alone
    expected = picture(source)
    got = picture(target)
    del got["keep.txt"]
    assert got == expected


async def test_verify_only_writes_nothing(source: Path, tmp_path: Path) -> None:
    store = MemoryStore()
    await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    target = tmp_path / "never-created"
    result = await restore_snapshot(store, "latest", target, verify_only=True)
    assert result.verify_only
    assert result.files == 9
    assert not target.exists()


async def test_files_appended_and_rewritten_between_snapshots(tmp_path: Path) -> None:
    """A log that grows and a table rewritten in place restore exactly, over several
    snapshots that share chunks."""
    source = tmp_path / "src"
    source.mkdir()
    log = source / "wal"
    table = source / "table"
    log.write_bytes(pattern(3 * CHUNK + 100, 10))
    table.write_bytes(pattern(8 * CHUNK, 11))
    store = MemoryStore()
    ids = []
    for round_ in range(3):
        with log.open("ab") as handle:
            handle.write(pattern(CHUNK + 7, 20 + round_))
        with table.open("r+b") as handle:
            handle.seek(round_ * CHUNK + 5)
            handle.write(b"changed %d" % round_)
        set_mtimes(source)
        result = await take_snapshot(
            store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
        )
        ids.append((result.snapshot_id, picture(source)))
        if round_ > 0:  # the log's old tail chunk and its one new chunk, the table's chunk
            assert result.new_chunks == 3
    for snapshot_id, expected in ids:
        target = tmp_path / snapshot_id
        await restore_snapshot(store, snapshot_id, target)
        assert picture(target) == expected
