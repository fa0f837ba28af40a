"""forget, prune and check against an in-memory bucket with a fake clock: what they delete, what
they refuse, the fence, the store's clock, and what check reports."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.cli.maintenance import under_lease
from mushroom_backup.clock import FakeClock
from mushroom_backup.config import Settings
from mushroom_backup.errors import FenceClosed, IntegrityError, LeaseHeld, StoreError
from mushroom_backup.lease.bucket import BucketLease
from mushroom_backup.lease.fenced import FencedStore
from mushroom_backup.snapshot import (
    LatestRecord,
    SnapshotResult,
    restore_snapshot,
    take_snapshot,
)
from mushroom_backup.snapshot.check import check_store
from mushroom_backup.snapshot.manifest import (
    FileEntry,
    decode_latest,
    decode_manifest,
    encode_latest,
    manifest_key,
)
from mushroom_backup.snapshot.pack import pack_id_of_key
from mushroom_backup.snapshot.prune import PruneResult, prune
from mushroom_backup.snapshot.retention import RetentionPolicy, apply_retention
from mushroom_backup.store import OVERWRITE, ObjectStore
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from tests.unit.retention.retention_support import (
        OPTIONS,
        WRITER,
        ManualFence,
        base_files,
        content,
        data_keys,
        picture,
        write_tree,
    )
else:
    from retention_support import (
        OPTIONS,
        WRITER,
        ManualFence,
        base_files,
        content,
        data_keys,
        picture,
        write_tree,
    )

START = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
GRACE = timedelta(hours=3)


def apply_version(root: Path, version: int) -> None:
    write_tree(
        root,
        {
            "base/1/1259": content(6 * 4096 + 100, f"table-{version}"),
            f"pg_wal/{version:024d}": content(4096, f"wal-{version}"),
        },
    )
    previous = root / "pg_wal" / f"{version - 1:024d}"
    previous.unlink(missing_ok=True)


class Bucket:
    """A memory bucket whose object times come from the test's fake clock, and a source."""

    def __init__(self, root: Path) -> None:
        self.clock = FakeClock(wall=START)
        self.store = MemoryStore(now=self.clock.wall)
        self.source = root / "source"
        self.source.mkdir()
        write_tree(self.source, base_files())
        self.versions = 0

    def change(self) -> None:
        """Rewrite the table and move to the next WAL segment, as a database does."""
        self.versions += 1
        apply_version(self.source, self.versions)

    async def snapshot(self, store: ObjectStore | None = None) -> SnapshotResult:
        return await take_snapshot(
            store or self.store, self.source, options=OPTIONS, writer=WRITER, clock=self.clock
        )

    async def abandoned(self) -> set[str]:
        """A snapshot that uploads its packs and then fails to write its manifest; returns the
        orphaned pack keys."""
        before = data_keys(self.store.keys)
        faulty = FaultyStore(self.store)
        faulty.fail("put", key=lambda k: k.startswith("manifests/"), error=_refused)
        with pytest.raises(StoreError, match="AccessDenied"):
            await self.snapshot(faulty)
        orphans = data_keys(self.store.keys) - before
        assert orphans
        return orphans

    def manifests(self) -> list[str]:
        return [k.removeprefix("manifests/") for k in self.store.keys if k.startswith("manifests/")]

    async def prune(self, grace: timedelta) -> PruneResult:
        """Prune under a real bucket lease (its LEASE write is the store's fresh stamp)."""

        async def work(store: ObjectStore) -> PruneResult:
            return await prune(store, clock=self.clock, grace=grace)

        return await under_lease(Settings(), work, what="prune", clock=self.clock, store=self.store)


def _refused(key: str) -> StoreError:
    return StoreError(f"403 AccessDenied for {key!r}", key=key, retryable=False)


@pytest.fixture
def bucket(tmp_path: Path) -> Bucket:
    return Bucket(tmp_path)


async def _restores(
    bucket: Bucket, snapshot_id: str, target: Path
) -> dict[str, tuple[object, ...]]:
    await restore_snapshot(bucket.store, snapshot_id, target)
    return picture(target)


# --- forget ------------------------------------------------------------------------------------


async def _daily(bucket: Bucket, days: int) -> list[str]:
    ids = []
    for _ in range(days):
        bucket.change()
        ids.append((await bucket.snapshot()).snapshot_id)
        bucket.clock.advance(86400)
    return ids


async def test_forget_deletes_the_manifests_the_policy_forgets(bucket: Bucket) -> None:
    ids = await _daily(bucket, 5)
    packs = data_keys(bucket.store.keys)
    latest = await bucket.store.get("LATEST")
    result = await apply_retention(bucket.store, RetentionPolicy(last=2), clock=bucket.clock)
    assert result.deleted == tuple(ids[:3])
    assert bucket.manifests() == ids[3:]
    assert [d.reasons for d in result.kept] == [("last",), ("last", "latest")]
    assert (await bucket.store.get("LATEST")).version == latest.version  # never written
    assert data_keys(bucket.store.keys) == packs  # forget deletes manifests only


async def test_forget_dry_run_deletes_nothing(bucket: Bucket) -> None:
    ids = await _daily(bucket, 3)
    result = await apply_retention(
        bucket.store, RetentionPolicy(last=1), clock=bucket.clock, dry_run=True
    )
    assert result.deleted == ()
    assert [d.snapshot_id for d in result.forgotten] == ids[:2]
    assert bucket.manifests() == ids


async def test_forget_never_deletes_what_latest_names_at_the_moment_of_deleting(
    bucket: Bucket,
) -> None:
    ids = await _daily(bucket, 3)
    faulty = FaultyStore(bucket.store)
    # reads of LATEST: listing, planning, then one right before each delete -- hold that one
    stall = faulty.stall("get", key="LATEST", nth=3, times=1)
    task = asyncio.create_task(apply_retention(faulty, RetentionPolicy(last=1), clock=bucket.clock))
    await stall.entered.wait()
    # meanwhile LATEST comes to name the oldest snapshot (a stale writer's swap, say)
    current = await bucket.store.get("LATEST")
    record = decode_latest(current.data)
    moved = LatestRecord(
        format=record.format,
        snapshot_id=ids[0],
        manifest=manifest_key(ids[0]),
        created_at=record.created_at,
        written_at=record.written_at,
        writer=record.writer,
    )
    await bucket.store.put("LATEST", encode_latest(moved), OVERWRITE)
    stall.release()
    result = await task
    assert result.spared == (ids[0],)
    assert result.deleted == (ids[1],)
    assert bucket.manifests() == [ids[0], ids[2]]
    spared = next(d for d in result.decisions if d.snapshot_id == ids[0])
    assert spared.keep
    assert spared.reasons == ("latest",)


async def test_forget_through_a_closed_fence_deletes_nothing(bucket: Bucket) -> None:
    ids = await _daily(bucket, 3)
    fenced = FencedStore(bucket.store, ManualFence(None), bucket.clock)
    with pytest.raises(FenceClosed):
        await apply_retention(fenced, RetentionPolicy(last=1), clock=bucket.clock)
    assert bucket.manifests() == ids


# --- prune -------------------------------------------------------------------------------------


async def test_prune_deletes_only_unused_packs_older_than_the_grace_period(
    bucket: Bucket, tmp_path: Path
) -> None:
    kept = await bucket.snapshot()
    used = data_keys(bucket.store.keys)
    bucket.change()
    old_orphans = await bucket.abandoned()
    bucket.clock.advance(2 * 3600)
    bucket.change()
    young_orphans = await bucket.abandoned()
    bucket.clock.advance(1.5 * 3600)  # old ones 3.5 h old, young ones 1.5 h: grace is 3 h

    result = await bucket.prune(grace=GRACE)
    assert set(result.deleted) == old_orphans
    assert result.deleted_bytes > 0
    assert result.young_packs == len(young_orphans)
    assert data_keys(bucket.store.keys) == used | young_orphans
    assert "LEASE" not in bucket.store.keys  # released
    assert await _restores(bucket, kept.snapshot_id, tmp_path / "r") == _source_at(bucket, 0)
    report = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    assert report.clean
    assert report.reclaimable_packs == len(young_orphans)


def _source_at(bucket: Bucket, version: int) -> dict[str, tuple[object, ...]]:
    """The picture of the source as it was after ``version`` changes (rebuilt aside)."""
    side = bucket.source.parent / f"expected-{version}"
    write_tree(side, base_files())
    for v in range(1, version + 1):
        apply_version(side, v)
    return picture(side)


async def test_forget_then_prune_keeps_every_kept_snapshot_restorable(
    bucket: Bucket, tmp_path: Path
) -> None:
    ids = await _daily(bucket, 6)
    before = len(data_keys(bucket.store.keys))
    await apply_retention(bucket.store, RetentionPolicy(last=2), clock=bucket.clock)
    result = await bucket.prune(grace=GRACE)
    # the old tables' packs went; the packs the kept snapshots share with them stayed
    assert 0 < len(result.deleted) < before
    assert result.used_packs == len(data_keys(bucket.store.keys))
    for version, snapshot_id in enumerate(ids[4:], start=5):
        target = tmp_path / snapshot_id
        assert await _restores(bucket, snapshot_id, target) == _source_at(bucket, version)
    report = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    assert report.clean
    assert report.reclaimable_packs == 0


async def test_prune_dry_run_deletes_nothing(bucket: Bucket) -> None:
    await bucket.snapshot()
    bucket.change()
    orphans = await bucket.abandoned()
    bucket.clock.advance(4 * 3600)
    keys = bucket.store.keys
    result = await prune(bucket.store, clock=bucket.clock, grace=GRACE, dry_run=True)
    # no LEASE was written: the newest stamp the store shows bounds "now"; nothing is that old
    assert result.deleted == ()
    await bucket.store.put("LEASE", b"fresh", OVERWRITE)
    result = await prune(bucket.store, clock=bucket.clock, grace=GRACE, dry_run=True)
    assert set(result.deleted) == orphans
    assert bucket.store.keys == sorted([*keys, "LEASE"])


async def test_prune_measures_age_on_the_store_clock(tmp_path: Path) -> None:
    """Our clock runs two days ahead of the store's: fresh orphans must not look old."""
    bucket = Bucket(tmp_path)
    skewed = MemoryStore(now=lambda: bucket.clock.wall() - timedelta(days=2))
    bucket.store = skewed
    await bucket.snapshot()
    bucket.change()
    orphans = await bucket.abandoned()
    bucket.clock.advance(60)
    result = await bucket.prune(grace=timedelta(hours=24))
    assert result.deleted == ()
    assert result.young_packs == len(orphans)
    assert result.now == bucket.clock.wall() - timedelta(days=2)


async def test_prune_refuses_to_delete_with_an_unreadable_manifest(bucket: Bucket) -> None:
    await bucket.snapshot()
    bucket.change()
    await bucket.abandoned()
    bucket.clock.advance(4 * 3600)
    await bucket.store.put(manifest_key("20261120T000000.000Z-deadbeef"), b"garbage", OVERWRITE)
    keys = bucket.store.keys
    with pytest.raises(IntegrityError, match="prune deletes nothing"):
        await bucket.prune(grace=GRACE)
    assert bucket.store.keys == keys


async def test_prune_refuses_when_latest_names_a_missing_manifest(bucket: Bucket) -> None:
    first = await bucket.snapshot()
    bucket.change()
    await bucket.abandoned()
    await bucket.store.delete(manifest_key(first.snapshot_id))
    bucket.clock.advance(4 * 3600)
    keys = bucket.store.keys
    with pytest.raises(IntegrityError, match="LATEST names snapshot"):
        await bucket.prune(grace=GRACE)
    assert bucket.store.keys == keys


async def test_a_delete_in_flight_at_the_deadline_is_cancelled(bucket: Bucket) -> None:
    await bucket.snapshot()
    bucket.change()
    orphans = await bucket.abandoned()
    bucket.clock.advance(4 * 3600)
    await bucket.store.put("LEASE", b"fresh", OVERWRITE)
    faulty = FaultyStore(bucket.store)
    stall = faulty.stall("delete")
    fence = ManualFence(bucket.clock.monotonic() + 10)
    task = asyncio.create_task(
        prune(FencedStore(faulty, fence, bucket.clock), clock=bucket.clock, grace=GRACE)
    )
    await stall.entered.wait()
    bucket.clock.advance(10)
    with pytest.raises(FenceClosed):
        await task
    assert stall.waiting == 0  # cancelled, nothing waits for it
    assert orphans <= data_keys(bucket.store.keys)


async def test_prune_and_forget_refuse_while_another_instance_holds_the_lease(
    bucket: Bucket,
) -> None:
    await bucket.snapshot()
    other = await BucketLease.acquire(
        bucket.store, ttl_s=30, instance_id="b" * 32, clock=bucket.clock
    )
    with pytest.raises(LeaseHeld):
        await bucket.prune(grace=GRACE)
    await other.release()


# --- check -------------------------------------------------------------------------------------


async def test_check_is_clean_and_reports_orphans_as_reclaimable(bucket: Bucket) -> None:
    await _daily(bucket, 2)
    bucket.change()
    orphans = await bucket.abandoned()
    report = await check_store(bucket.store, clock=bucket.clock)
    assert report.clean
    assert report.snapshots == 2
    assert report.packs_read == 0
    assert report.reclaimable_packs == len(orphans)
    full = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    assert full.clean
    assert full.packs_read == full.used_packs > 0
    assert full.chunks_verified > 0


async def test_check_names_every_file_a_missing_pack_affects(bucket: Bucket) -> None:
    ids = await _daily(bucket, 2)
    # the pack holding pg_control is used by both snapshots (unchanged file)
    manifest = await bucket.store.get(manifest_key(ids[1]))
    parsed = decode_manifest(manifest.data, manifest_key(ids[1]))
    control = next(e for e in parsed.entries if e.path == "global/pg_control")
    assert isinstance(control, FileEntry)
    pack_id = parsed.chunks[control.chunks[0]].pack_id
    files = {
        e.path
        for e in parsed.entries
        if isinstance(e, FileEntry) and any(parsed.chunks[c].pack_id == pack_id for c in e.chunks)
    }
    await bucket.store.delete(f"data/{pack_id[:2]}/{pack_id}")
    report = await check_store(bucket.store, clock=bucket.clock)
    assert not report.clean
    (problem,) = report.problems
    assert problem.kind == "pack-missing"
    assert {(a.snapshot_id, a.path) for a in problem.affected} >= {
        (ids[0], "global/pg_control"),
        (ids[1], "global/pg_control"),
    }
    assert {a.path for a in problem.affected if a.snapshot_id == ids[1]} == files
    assert report.affected_snapshots == tuple(ids)
    assert any("global/pg_control" in line for line in problem.lines())


async def test_check_read_data_finds_a_flipped_byte(bucket: Bucket) -> None:
    await bucket.snapshot()
    key = sorted(data_keys(bucket.store.keys))[0]
    damaged = bytearray((await bucket.store.get(key)).data)
    damaged[100] ^= 0x01
    await bucket.store.put(key, bytes(damaged), OVERWRITE)
    assert (await check_store(bucket.store, clock=bucket.clock)).clean  # sizes alone: fine
    report = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    kinds = sorted(p.kind for p in report.problems)
    assert kinds == ["chunk-corrupt", "pack-corrupt"]
    chunk = next(p for p in report.problems if p.kind == "chunk-corrupt")
    assert chunk.affected
    assert all(a.path for a in chunk.affected)


async def test_check_reports_a_bad_manifest_and_a_dangling_latest(bucket: Bucket) -> None:
    first = await bucket.snapshot()
    bad_id = "20261120T000000.000Z-deadbeef"
    await bucket.store.put(manifest_key(bad_id), b"garbage", OVERWRITE)
    await bucket.store.put("manifests/notes.txt", b"hello", OVERWRITE)
    await bucket.store.delete(manifest_key(first.snapshot_id))
    report = await check_store(bucket.store, clock=bucket.clock)
    by_kind = {p.kind: p for p in report.problems}
    assert set(by_kind) == {"manifest", "latest"}
    assert by_kind["manifest"].affected[0].snapshot_id == bad_id
    assert first.snapshot_id in by_kind["latest"].message
    assert report.unknown_keys == ("manifests/notes.txt",)
    assert report.reclaimable_packs > 0  # the deleted snapshot's packs


async def test_check_subset_reads_only_todays_window(bucket: Bucket) -> None:
    await _daily(bucket, 3)
    full = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    seen = 0
    for _ in range(4):  # 25 %: four days read every pack once
        report = await check_store(bucket.store, clock=bucket.clock, subset_percent=25)
        assert report.clean
        assert report.subset is not None
        used = [pack_id_of_key(k) for k in data_keys(bucket.store.keys)]
        assert report.packs_read == sum(report.subset.contains(p) for p in used if p)
        seen += report.packs_read
        bucket.clock.advance(86400)
    assert seen == full.packs_read


async def test_best_effort_mode_forgets_and_prunes_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = Bucket(tmp_path)
    bucket.store = MemoryStore(conditional=False, now=bucket.clock.wall)
    ids = await _daily(bucket, 3)
    bucket.change()
    orphans = await bucket.abandoned()
    bucket.clock.advance(4 * 3600)
    settings = Settings.model_validate({"lease": {"conditional": False}})

    async def work(store: ObjectStore) -> tuple[list[str], PruneResult]:
        assert not store.conditional
        forgot = await apply_retention(store, RetentionPolicy(last=1), clock=bucket.clock)
        return list(forgot.deleted), await prune(store, clock=bucket.clock, grace=GRACE)

    with caplog.at_level("WARNING", logger="mushroom_backup.snapshot.prune"):
        logger = logging.getLogger("mushroom_backup.snapshot.prune")
        logger.addHandler(caplog.handler)
        try:
            deleted, pruned = await under_lease(
                settings, work, what="forget", clock=bucket.clock, store=bucket.store
            )
        finally:
            logger.removeHandler(caplog.handler)
    assert deleted == ids[:2]
    assert orphans <= set(pruned.deleted)
    assert "prune.best_effort" in caplog.messages
    report = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    assert report.clean
    assert report.reclaimable_packs == 0


async def test_the_documented_repair_of_a_damaged_latest_snapshot(
    bucket: Bucket, tmp_path: Path
) -> None:
    """README, check: delete the damaged snapshot's manifest (and the corrupt pack) by hand;
    the next backup reads everything again and LATEST names a complete snapshot."""
    first = await bucket.snapshot()
    victim = sorted(data_keys(bucket.store.keys))[0]
    await bucket.store.delete(victim)
    assert not (await check_store(bucket.store, clock=bucket.clock)).clean
    inherited = await bucket.snapshot()  # unchanged files are reused: the damage is inherited
    report = await check_store(bucket.store, clock=bucket.clock)
    assert inherited.snapshot_id in report.affected_snapshots

    for snapshot_id in (first.snapshot_id, inherited.snapshot_id):
        await bucket.store.delete(manifest_key(snapshot_id))
    repaired = await bucket.snapshot()
    assert repaired.parent_id == inherited.snapshot_id  # LATEST pointed nowhere: read in full
    assert victim in bucket.store.keys  # uploaded again
    report = await check_store(bucket.store, clock=bucket.clock, read_data=True)
    assert report.clean
    assert await _restores(bucket, repaired.snapshot_id, tmp_path / "r") == _source_at(bucket, 0)
