"""Restore's writer lanes: files written in parallel, a failure on one lane still leaves
nothing half-written under a final name and no temporary file anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import SYSTEM_CLOCK
from mushroom_backup.errors import IntegrityError
from mushroom_backup.snapshot import FileEntry, load_manifest, restore_snapshot, take_snapshot
from mushroom_backup.snapshot import restore as restore_module
from mushroom_backup.snapshot.pack import pack_key
from mushroom_backup.store import OVERWRITE
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.integration.snapshot_trees import OPTIONS, WRITER, leftovers, make_tree, picture
else:
    from snapshot_trees import OPTIONS, WRITER, leftovers, make_tree, picture

BIG = "base/16384/16400"  # ten chunks and a bit


async def _backed_up(tmp_path: Path) -> tuple[MemoryStore, str, Path]:
    source = tmp_path / "source"
    source.mkdir()
    make_tree(source)
    store = MemoryStore()
    result = await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    return store, result.snapshot_id, source


@pytest.mark.parametrize(("workers", "run_chunks"), [(1, 2), (2, 1), (4, 3), (4, 64)])
async def test_every_lane_count_restores_the_same_tree(
    tmp_path: Path, workers: int, run_chunks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restore_module, "MAX_RUN_BYTES", run_chunks * OPTIONS.chunk_size)
    store, _, source = await _backed_up(tmp_path)
    target = tmp_path / "restored"
    await restore_snapshot(store, "latest", target, workers=workers, download_concurrency=2)
    assert picture(target) == picture(source)
    assert leftovers(target) == []


@pytest.mark.parametrize("workers", [1, 4])
async def test_a_failure_on_one_lane_removes_every_file_in_progress(
    tmp_path: Path, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs of two chunks: the big file's first chunks are on a lane, in a temporary file,
    # when its eighth fails its hash.
    monkeypatch.setattr(restore_module, "MAX_RUN_BYTES", 2 * OPTIONS.chunk_size)
    store, snapshot_id, source = await _backed_up(tmp_path)
    manifest = await load_manifest(store, snapshot_id)
    big = next(e for e in manifest.entries if e.path == BIG)
    assert isinstance(big, FileEntry)
    location = manifest.chunks[big.chunks[7]]
    key = pack_key(location.pack_id)
    data = bytearray((await store.get(key)).data)
    data[location.offset + location.length // 2] ^= 0x55
    await store.put(key, bytes(data), OVERWRITE)

    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match=f"restoring '{BIG}' from pack {key}: chunk"):
        await restore_snapshot(store, "latest", target, workers=workers, download_concurrency=1)
    assert not (target / BIG).exists()
    assert leftovers(target) == []
    for restored in target.rglob("*"):
        if restored.is_file() and not restored.is_symlink():
            assert restored.read_bytes() == (source / restored.relative_to(target)).read_bytes()
