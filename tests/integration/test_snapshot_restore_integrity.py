"""Restore refuses what would escape its target and reports corruption (exit 5) naming the
file and the object, leaving nothing half-written under a final name."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import SYSTEM_CLOCK
from mushroom_backup.errors import IntegrityError, SnapshotError, UnsafePath
from mushroom_backup.snapshot import (
    FileEntry,
    Manifest,
    SymlinkEntry,
    load_manifest,
    restore_snapshot,
    take_snapshot,
)
from mushroom_backup.snapshot.manifest import DirEntry, ManifestBody, encode_manifest, manifest_key
from mushroom_backup.snapshot.pack import pack_key
from mushroom_backup.store import OVERWRITE
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.integration.snapshot_trees import OPTIONS, WRITER, leftovers, make_tree, picture
else:
    from snapshot_trees import OPTIONS, WRITER, leftovers, make_tree, picture

Entries = tuple[FileEntry | DirEntry | SymlinkEntry, ...]
BIG = "base/16384/16400"  # ten chunks and a bit


@pytest.fixture
async def backed_up(tmp_path: Path) -> tuple[MemoryStore, str, Path]:
    source = tmp_path / "source"
    source.mkdir()
    make_tree(source)
    store = MemoryStore()
    result = await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    return store, result.snapshot_id, source


async def _rewrite(
    store: MemoryStore, snapshot_id: str, change: Callable[[Entries], Entries]
) -> None:
    """Replace a snapshot's entries as a hand-edited manifest would (no validation)."""
    manifest = await load_manifest(store, snapshot_id)
    body = ManifestBody.model_construct(entries=change(manifest.entries), packs=manifest.body.packs)
    data = encode_manifest(Manifest(manifest.header, body))
    await store.put(manifest_key(snapshot_id), data, OVERWRITE)


def _file(entries: Entries, path: str) -> FileEntry:
    found = next(e for e in entries if e.path == path)
    assert isinstance(found, FileEntry)
    return found


@pytest.mark.parametrize(
    ("bad_path", "why"),
    [
        ("../escaped", "'..'"),
        ("base/../../escaped", "'..'"),
        ("/tmp/escaped-absolute", "absolute"),
        ("", "empty"),
        ("base//x", "not normalised"),
    ],
)
async def test_paths_that_escape_are_refused_before_anything_is_written(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path, bad_path: str, why: str
) -> None:
    store, snapshot_id, _ = backed_up
    await _rewrite(
        store,
        snapshot_id,
        lambda entries: (
            *entries,
            _file(entries, "PG_VERSION").model_copy(update={"path": bad_path}),
        ),
    )
    target = tmp_path / "restored"
    with pytest.raises(UnsafePath, match=why) as raised:
        await restore_snapshot(store, "latest", target)
    assert raised.value.exit_code == 5
    assert manifest_key(snapshot_id) in str(raised.value)
    assert not target.exists()
    assert not (tmp_path / "escaped").exists()
    with pytest.raises(UnsafePath):
        await restore_snapshot(store, "latest", None, verify_only=True)


async def test_a_path_through_a_symlink_of_the_manifest_is_refused(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path
) -> None:
    store, snapshot_id, _ = backed_up
    outside = tmp_path / "outside"
    outside.mkdir()

    def escape(entries: Entries) -> Entries:
        link = SymlinkEntry(
            type="symlink", path="zz", target=str(outside), mtime_ns=0, uid=0, gid=0
        )
        payload = _file(entries, "PG_VERSION").model_copy(update={"path": "zz/passwd"})
        return (*entries, link, payload)

    await _rewrite(store, snapshot_id, escape)
    with pytest.raises(UnsafePath, match="through the symlink 'zz'"):
        await restore_snapshot(store, "latest", tmp_path / "restored")
    assert list(outside.iterdir()) == []


async def test_an_existing_symlink_in_the_target_is_never_written_through(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path
) -> None:
    store, _, _ = backed_up
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "restored"
    target.mkdir()
    (target / "base").symlink_to(outside)  # the snapshot has a directory "base"
    with pytest.raises(UnsafePath, match=r"'base'.*symlink"):
        await restore_snapshot(store, "latest", target, force=True)
    assert list(outside.iterdir()) == []


async def _pack_of(
    store: MemoryStore, snapshot_id: str, path: str, index: int
) -> tuple[str, int, int]:
    manifest = await load_manifest(store, snapshot_id)
    location = manifest.chunks[_file(manifest.entries, path).chunks[index]]
    return pack_key(location.pack_id), location.offset, location.length


def _assert_nothing_half_written(target: Path, path: str, source: Path) -> None:
    """The damaged file is absent, no temp file is left, and every file that is under its
    final name is complete."""
    assert not (target / path).exists()
    assert leftovers(target) == []
    for restored in target.rglob("*"):
        if restored.is_file() and not restored.is_symlink():
            original = source / restored.relative_to(target)
            assert restored.read_bytes() == original.read_bytes()


async def test_a_corrupted_chunk_is_reported_naming_file_and_pack(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path
) -> None:
    store, snapshot_id, source = backed_up
    key, offset, length = await _pack_of(store, snapshot_id, BIG, 3)
    data = bytearray((await store.get(key)).data)
    data[offset + length // 2] ^= 0x55
    await store.put(key, bytes(data), OVERWRITE)
    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match=f"restoring '{BIG}' from pack {key}: chunk") as raised:
        await restore_snapshot(store, "latest", target)
    assert raised.value.exit_code == 5
    _assert_nothing_half_written(target, BIG, source)
    with pytest.raises(IntegrityError, match=BIG):
        await restore_snapshot(store, "latest", None, verify_only=True)


async def test_a_missing_pack_is_reported_naming_file_and_pack(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path
) -> None:
    store, snapshot_id, source = backed_up
    key, _, _ = await _pack_of(store, snapshot_id, BIG, 5)
    await store.delete(key)
    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match=rf"pack {key} is missing"):
        await restore_snapshot(store, "latest", target)
    _assert_nothing_half_written(target, BIG, source)


async def test_a_truncated_pack_is_reported_naming_file_and_pack(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path
) -> None:
    store, snapshot_id, source = backed_up
    key, offset, length = await _pack_of(store, snapshot_id, BIG, 9)
    data = (await store.get(key)).data
    await store.put(key, data[: offset + length - 1], OVERWRITE)
    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match=rf"restoring '{BIG}': pack {key} is truncated"):
        await restore_snapshot(store, "latest", target)
    _assert_nothing_half_written(target, BIG, source)


@pytest.mark.parametrize(
    "edit",
    [
        {"sha256": "0" * 64},
        "swap two chunks",
    ],
)
async def test_a_whole_file_hash_mismatch_is_reported(
    backed_up: tuple[MemoryStore, str, Path], tmp_path: Path, edit: object
) -> None:
    store, snapshot_id, source = backed_up

    def change(entries: Entries) -> Entries:
        big = _file(entries, BIG)
        if isinstance(edit, dict):
            update = edit
        else:
            chunks = list(big.chunks)
            chunks[0], chunks[1] = chunks[1], chunks[0]
            update = {"chunks": tuple(chunks)}
        return tuple(big.model_copy(update=update) if e is big else e for e in entries)

    await _rewrite(store, snapshot_id, change)
    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match=f"restoring '{BIG}': the restored content"):
        await restore_snapshot(store, "latest", target)
    _assert_nothing_half_written(target, BIG, source)
    with pytest.raises(IntegrityError, match=BIG):
        await restore_snapshot(store, "latest", None, verify_only=True)


async def test_unknown_snapshot_and_empty_store(tmp_path: Path) -> None:
    store = MemoryStore()
    with pytest.raises(SnapshotError, match="no snapshot"):
        await restore_snapshot(store, "latest", tmp_path / "t")
    with pytest.raises(SnapshotError, match="not a snapshot id"):
        await restore_snapshot(store, "../../etc", tmp_path / "t")
    with pytest.raises(SnapshotError, match=r"there is no snapshot 20261129T101500\.123Z-3f9a1c2e"):
        await restore_snapshot(store, "20261129T101500.123Z-3f9a1c2e", tmp_path / "t")
    assert not (tmp_path / "t").exists()


async def test_read_only_files_and_directories_restore(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "ro" / "inner").mkdir(parents=True)
    (source / "ro" / "inner" / "f").write_bytes(b"data")
    os.chmod(source / "ro" / "inner" / "f", 0o444)
    os.chmod(source / "ro" / "inner", 0o555)
    os.chmod(source / "ro", 0o500)
    store = MemoryStore()
    await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target)
    assert picture(target) == picture(source)
    for root in (source, target):  # let pytest clean up
        os.chmod(root / "ro", 0o755)
        os.chmod(root / "ro" / "inner", 0o755)
