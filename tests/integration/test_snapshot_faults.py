"""The write order under faults: a fence that closes mid-upload, failed and stalled uploads,
cancellation, a LATEST moved by another writer, a LATEST swap whose answer was lost, and the
best-effort mode. Whatever fails, LATEST names a complete snapshot."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import SYSTEM_CLOCK, FakeClock
from mushroom_backup.errors import FenceClosed, LatestMoved, StoreError
from mushroom_backup.lease.fenced import FencedStore
from mushroom_backup.snapshot import read_latest, restore_snapshot, take_snapshot
from mushroom_backup.store import ObjectStore
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.integration.snapshot_trees import OPTIONS, WRITER, drive, make_tree, picture
else:
    from snapshot_trees import OPTIONS, WRITER, drive, make_tree, picture


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    root.mkdir()
    make_tree(root)
    return root


def _is_data(key: str) -> bool:
    return key.startswith("data/")


def _manifests(store: MemoryStore) -> list[str]:
    return [k for k in store.keys if k.startswith("manifests/")]


async def _state(store: ObjectStore) -> tuple[bytes, object]:
    found = await store.get("LATEST")
    return found.data, found.version


class ManualFence:
    """A fence whose deadline the test sets by hand."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def write_deadline(self) -> float | None:
        return self.deadline


async def _first_snapshot(store: ObjectStore, source: Path) -> str:
    result = await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    (source / "base" / "16384" / "16400").write_bytes(b"changed since the first snapshot" * 500)
    return result.snapshot_id


async def test_fence_closing_mid_upload_abandons_the_snapshot(source: Path) -> None:
    memory = MemoryStore()
    first = await _first_snapshot(memory, source)
    before = await _state(memory)
    manifests = _manifests(memory)

    clock = FakeClock()
    faulty = FaultyStore(memory)
    stall = faulty.stall("put", key=_is_data)  # every pack upload hangs
    fence = ManualFence(clock.monotonic() + 10)
    fenced = FencedStore(faulty, fence, clock)
    task = asyncio.create_task(
        take_snapshot(fenced, source, options=OPTIONS, writer=WRITER, clock=clock)
    )
    await stall.entered.wait()
    assert stall.waiting >= 1
    clock.advance(10)  # the write deadline passes with the uploads in flight
    with pytest.raises(FenceClosed):
        await task
    assert stall.waiting == 0  # every stalled upload was cancelled, nothing waits for it
    assert await _state(memory) == before
    assert _manifests(memory) == manifests
    assert not any(op == "put" and not _is_data(key) for op, key in faulty.calls)
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == first


async def test_a_closed_fence_refuses_every_write(source: Path) -> None:
    memory = MemoryStore()
    await _first_snapshot(memory, source)
    before = await _state(memory)
    faulty = FaultyStore(memory)
    fenced = FencedStore(faulty, ManualFence(None), FakeClock())
    with pytest.raises(FenceClosed):
        await take_snapshot(fenced, source, options=OPTIONS, writer=WRITER, clock=FakeClock())
    assert await _state(memory) == before
    assert [key for op, key in faulty.calls if op == "put"] == []  # nothing was sent


async def test_a_failed_upload_abandons_the_snapshot_and_cancels_the_others(source: Path) -> None:
    memory = MemoryStore()
    await _first_snapshot(memory, source)
    before = await _state(memory)
    manifests = _manifests(memory)
    faulty = FaultyStore(memory)
    stall = faulty.stall("put", nth=2, key=_is_data)  # later uploads hang ...

    def refused(key: str) -> StoreError:
        return StoreError(f"403 AccessDenied for {key!r}", key=key, retryable=False)

    faulty.fail("put", key=_is_data, error=refused)  # ... and the first one fails for good
    with pytest.raises(StoreError, match="AccessDenied"):
        await take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    assert stall.waiting == 0
    assert await _state(memory) == before
    assert _manifests(memory) == manifests


async def test_retryable_upload_errors_are_retried(source: Path) -> None:
    memory = MemoryStore()
    faulty = FaultyStore(memory)
    faulty.fail("put", key=_is_data, times=2)  # two 503s, then the service recovers
    # ... and then one upload's answer is lost (a rule counts the calls that reach it: the
    # first call after the two refused ones)
    faulty.lose_answer("put", key=_is_data)
    clock = FakeClock()
    result = await drive(
        clock, take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=clock)
    )
    data_puts = [key for op, key in faulty.calls if op == "put" and _is_data(key)]
    assert len(data_puts) == result.new_packs + 3  # two refused, one landed twice
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == result.snapshot_id
    target = source.parent / "restored"
    await restore_snapshot(memory, "latest", target)
    assert picture(target) == picture(source)


async def test_cancelling_a_snapshot_leaves_latest_untouched(source: Path) -> None:
    memory = MemoryStore()
    await _first_snapshot(memory, source)
    before = await _state(memory)
    manifests = _manifests(memory)
    faulty = FaultyStore(memory)
    stall = faulty.stall("put", key=_is_data)
    task = asyncio.create_task(
        take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    )
    await stall.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stall.waiting == 0
    assert await _state(memory) == before
    assert _manifests(memory) == manifests


async def test_latest_moved_by_another_writer_is_lease_lost(source: Path) -> None:
    bucket = f"latest-moved-{secrets.token_hex(4)}"
    memory = MemoryStore(bucket)
    first = await _first_snapshot(memory, source)
    ours = FaultyStore(memory)
    stall = ours.stall("put", key=lambda k: k.startswith("manifests/"))
    task = asyncio.create_task(
        take_snapshot(ours, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    )
    await stall.entered.wait()
    # Meanwhile another writer (a second client of the same bucket) completes a snapshot.
    other = await take_snapshot(
        MemoryStore(bucket),
        source,
        options=OPTIONS,
        writer=WRITER.model_copy(update={"instance_id": "the-other-one"}),
        clock=SYSTEM_CLOCK,
    )
    stall.release()
    with pytest.raises(LatestMoved, match="the-other-one") as raised:
        await task
    assert raised.value.exit_code == 4
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == other.snapshot_id != first
    # our manifest was stored, but nothing references it: an orphan for prune
    orphans = [k for k in _manifests(memory) if k not in (f"manifests/{first}", other.manifest_key)]
    assert len(orphans) == 1


async def test_a_latest_swap_whose_answer_was_lost_is_reconciled(source: Path) -> None:
    memory = MemoryStore()
    await _first_snapshot(memory, source)
    faulty = FaultyStore(memory)
    faulty.lose_answer("put", key="LATEST")
    result = await take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == result.snapshot_id
    assert [op for op, key in faulty.calls if key == "LATEST"] == ["get", "put", "get"]


async def test_a_latest_swap_that_did_not_land_is_tried_again(source: Path) -> None:
    memory = MemoryStore()
    await _first_snapshot(memory, source)
    faulty = FaultyStore(memory)
    faulty.fail("put", key="LATEST")  # a 503 before anything was written
    result = await take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == result.snapshot_id
    assert [op for op, key in faulty.calls if key == "LATEST"] == ["get", "put", "get", "put"]


async def test_a_manifest_write_whose_answer_was_lost_is_fine(source: Path) -> None:
    memory = MemoryStore()
    faulty = FaultyStore(memory)
    faulty.lose_answer("put", key=lambda k: k.startswith("manifests/"))
    clock = FakeClock()
    result = await drive(
        clock, take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=clock)
    )
    assert _manifests(memory) == [result.manifest_key]
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == result.snapshot_id


async def test_best_effort_mode_reads_then_overwrites(source: Path, tmp_path: Path) -> None:
    bucket = f"best-effort-{secrets.token_hex(4)}"
    memory = MemoryStore(bucket, conditional=False)
    first = await take_snapshot(memory, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    (source / "PG_VERSION").write_bytes(b"17\n")
    second = await take_snapshot(memory, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    assert second.parent_id == first.snapshot_id
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == second.snapshot_id
    target = tmp_path / "restored"
    await restore_snapshot(memory, "latest", target)
    assert picture(target) == picture(source)
    # a LATEST moved under a best-effort writer is still noticed when it is read back
    faulty = FaultyStore(memory)
    stall = faulty.stall("put", key=lambda k: k.startswith("manifests/"))
    (source / "PG_VERSION").write_bytes(b"18\n")
    task = asyncio.create_task(
        take_snapshot(faulty, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    )
    await stall.entered.wait()
    await take_snapshot(
        MemoryStore(bucket, conditional=False),
        source,
        options=OPTIONS,
        writer=WRITER,
        clock=SYSTEM_CLOCK,
    )
    stall.release()
    with pytest.raises(LatestMoved):
        await task


async def test_a_latest_naming_a_missing_manifest_does_not_stop_backups(source: Path) -> None:
    memory = MemoryStore()
    first = await _first_snapshot(memory, source)
    await memory.delete(f"manifests/{first}")
    result = await take_snapshot(memory, source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK)
    assert result.parent_id == first  # still the swap's expected version
    assert result.files_reused == 0  # nothing to compare with: everything was read
    latest = await read_latest(memory)
    assert latest is not None
    assert latest.snapshot_id == result.snapshot_id
