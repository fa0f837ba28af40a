"""What only the local directory store promises beyond the shared contract: key rules, the
on-disk layout, versions that change even for identical bytes, no partial or temp file ever
visible, blocking calls off the event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from mushroom_backup.errors import AlreadyExists, NotFound, PreconditionFailed, StoreError
from mushroom_backup.store import CREATE, OVERWRITE, Update
from mushroom_backup.store.local import HEADER_LEN, MAGIC, RESERVED, LocalStore


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> LocalStore:
    return LocalStore(root)


BAD_KEYS = [
    ("", "it is empty"),
    ("/etc/passwd", "it is absolute"),
    ("a//b", "empty path segment"),
    ("a/", "empty path segment"),
    ("../escape", "'.' or '..'"),
    ("a/../../escape", "'.' or '..'"),
    ("a/./b", "'.' or '..'"),
    ("..", "'.' or '..'"),
    ("a\0b", "NUL"),
    (f"{RESERVED}/lock", "reserved"),
    ("x" * 256, "longer than 255 bytes"),
]


@pytest.mark.parametrize(("key", "why"), BAD_KEYS)
async def test_keys_that_are_not_safe_relative_paths_are_refused(
    store: LocalStore, root: Path, key: str, why: str
) -> None:
    for attempt in (
        store.put(key, b"x"),
        store.put(key, b"x", CREATE),
        store.get(key),
        store.head(key),
        store.delete(key),
    ):
        with pytest.raises(StoreError) as refused:
            await attempt
        assert type(refused.value) is StoreError
        assert why in refused.value.message
        assert "cannot be stored in a local directory" in refused.value.message
    assert not (root.parent / "escape").exists()


@pytest.mark.parametrize("key", ["a b", "ünïcode/ключ", ".hidden", "x.y-z_1", "a" * 255])
async def test_unusual_but_safe_keys_are_stored(store: LocalStore, key: str) -> None:
    await store.put(key, b"ok", CREATE)
    assert (await store.get(key)).data == b"ok"
    assert [i.key async for i in store.list()] == [key]


async def test_identical_bytes_still_get_a_new_version_on_every_write(store: LocalStore) -> None:
    v1 = await store.put("LEASE", b"same", CREATE)
    v2 = await store.put("LEASE", b"same", Update(v1))
    v3 = await store.put("LEASE", b"same", OVERWRITE)

    assert len({v1, v2, v3}) == 3
    with pytest.raises(PreconditionFailed):
        await store.put("LEASE", b"same", Update(v1))  # no ABA: the old version stays stale


async def test_an_object_is_one_file_under_the_root_with_a_version_header(
    store: LocalStore, root: Path
) -> None:
    version = await store.put("data/ab/cdef", b"chunk bytes", CREATE)

    raw = (root / "data" / "ab" / "cdef").read_bytes()
    assert raw[:HEADER_LEN].startswith(MAGIC)
    assert raw[HEADER_LEN:] == b"chunk bytes"
    assert f'"{raw[len(MAGIC) : HEADER_LEN - 1].decode()}"' == version.etag
    assert (await store.head("data/ab/cdef")).size == len(b"chunk bytes")


async def test_no_temp_file_is_left_or_listed_after_writes(store: LocalStore, root: Path) -> None:
    v = await store.put("LATEST", b"1", CREATE)
    with pytest.raises(AlreadyExists):
        await store.put("LATEST", b"2", CREATE)
    await store.put("LATEST", b"3", Update(v))
    with pytest.raises(PreconditionFailed):
        await store.put("LATEST", b"4", Update(v))

    assert list((root / RESERVED / "tmp").iterdir()) == []
    assert [i.key async for i in store.list()] == ["LATEST"]


async def test_a_crashed_writer_s_temp_file_is_invisible(store: LocalStore, root: Path) -> None:
    await store.put("LATEST", b"complete", CREATE)
    (root / RESERVED / "tmp" / ".tmp-crashed").write_bytes(MAGIC + b"0" * 32 + b"\npart")

    assert [i.key async for i in store.list()] == ["LATEST"]
    assert (await store.get("LATEST")).data == b"complete"


async def test_a_write_that_fails_midway_leaves_the_old_object_whole(
    store: LocalStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = await store.put("LATEST", b"old and whole", CREATE)

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        await store.put("LATEST", b"new", Update(v1))
    monkeypatch.undo()

    got = await store.get("LATEST")
    assert (got.data, got.version) == (b"old and whole", v1)
    assert list((root / RESERVED / "tmp").iterdir()) == []


async def test_files_and_directories_are_fsynced_off_the_event_loop(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_in: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced_in.append(threading.get_ident())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    v = await store.put("LATEST", b"1", CREATE)
    await store.put("LATEST", b"2", Update(v))

    assert len(synced_in) >= 4  # temp file and directory, for each write
    assert threading.get_ident() not in synced_in


async def test_a_key_cannot_also_be_a_directory_of_keys(store: LocalStore) -> None:
    await store.put("a", b"object", CREATE)
    await store.put("b/c", b"object", CREATE)

    with pytest.raises(StoreError, match="is an object, not a directory of keys"):
        await store.put("a/x", b"y", CREATE)
    with pytest.raises(StoreError, match="is an object, not a directory of keys"):
        await store.put("a/x", b"y", OVERWRITE)
    for mode in (CREATE, OVERWRITE):
        with pytest.raises(StoreError, match="it is a directory of other keys"):
            await store.put("b", b"y", mode)
    with pytest.raises(NotFound):
        await store.get("b")


async def test_listing_is_in_byte_order_of_the_whole_key(store: LocalStore) -> None:
    for key in ["a/b", "a-c", "a0", "a/a/z", "A", "a.d"]:
        await store.put(key, b"x")

    assert [i.key async for i in store.list()] == ["A", "a-c", "a.d", "a/a/z", "a/b", "a0"]


async def test_foreign_files_are_refused_by_reads_and_skipped_by_listing(
    store: LocalStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.put("LATEST", b"ours")
    (root / "README.txt").write_text("put here by hand")

    with pytest.raises(StoreError, match="not an object written by mushroom-backup"):
        await store.get("README.txt")
    with caplog.at_level(logging.WARNING, logger="mushroom_backup.store.local"):
        assert [i.key async for i in store.list()] == ["LATEST"]
    assert "local_store_foreign_file" in caplog.messages


async def test_a_store_whose_directory_does_not_exist_yet(store: LocalStore, root: Path) -> None:
    assert [i async for i in store.list()] == []
    with pytest.raises(NotFound):
        await store.get("LEASE")
    await store.delete("LEASE")
    assert not await asyncio.to_thread(root.exists)  # reads and deletes create nothing

    await store.put("LEASE", b"first", CREATE)
    assert (await store.get("LEASE")).data == b"first"


def test_a_relative_root_is_refused() -> None:
    with pytest.raises(StoreError, match="absolute path"):
        LocalStore("relative/dir")
