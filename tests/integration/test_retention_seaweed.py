"""Retention and integrity on SeaweedFS (real S3 on 127.0.0.1, real compare-and-swap):

* a week of simulated snapshots forgotten by policy and pruned (through the CLI), then every
  kept snapshot restores byte for byte and ``check --read-data`` is clean;
* prune racing a snapshot in progress, interleaved deterministically with stalls: paused between
  its pack uploads and its manifest, and reusing old orphan packs between prune's mark and
  sweep -- nothing the new snapshot references is deleted, and it restores;
* a pack deleted by hand makes ``check`` exit 5 naming the affected files; a flipped byte makes
  ``check --read-data`` do the same.

Object times are the server's real clock here, so a test that needs packs older than the grace
period waits a few seconds for them to age (it is the age being tested, not a synchronisation).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner

from mushroom_backup.cli.main import cli
from mushroom_backup.cli.maintenance import under_lease
from mushroom_backup.clock import SystemClock
from mushroom_backup.config import Settings
from mushroom_backup.errors import StoreError
from mushroom_backup.snapshot import (
    BackupOptions,
    FileEntry,
    SnapshotResult,
    WriterInfo,
    load_manifest,
    read_latest,
    restore_snapshot,
    take_snapshot,
)
from mushroom_backup.snapshot.check import check_store
from mushroom_backup.snapshot.prune import PruneResult, prune
from mushroom_backup.store import OVERWRITE, ObjectStore, open_store
from mushroom_backup.store.faults import FaultyStore

T = TypeVar("T")
CHUNK = 4096
OPTIONS = BackupOptions(chunk_size=CHUNK, pack_size=4 * CHUNK, upload_concurrency=3, workers=2)
WRITER = WriterInfo(instance_id="retention-it", exclusion="conditional", host="test-host")


class SimClock(SystemClock):
    """The real clock, whose wall reading can be moved into the past: snapshots taken "a week
    ago" get ids and times from then, while sleeps and the store's clock stay real."""

    def __init__(self, wall: datetime) -> None:
        self.offset = wall - datetime.now(UTC)

    def wall(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def set_wall(self, wall: datetime) -> None:
        self.offset = wall - datetime.now(UTC)


def content(size: int, seed: str) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest() + bytes(32)
        counter += 1
    return bytes(out[:size])


class Source:
    """A small database directory that changes between snapshots (the table is rewritten in
    part, the WAL moves on to a new segment and the old one is recycled)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        self._write("PG_VERSION", b"16\n")
        self._write("global/pg_control", content(600, "control"))
        self._write("base/1/1260", content(5 * CHUNK, "index"))
        self.change()

    def _write(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def change(self) -> None:
        self.version += 1
        v = self.version
        # the first half of the table keeps its pages, the second half is rewritten
        self._write("base/1/1259", content(4 * CHUNK, "table-head") + content(4 * CHUNK, f"t{v}"))
        self._write(f"pg_wal/{v:024d}", content(2 * CHUNK + 17, f"wal{v}"))
        (self.root / "pg_wal" / f"{v - 1:024d}").unlink(missing_ok=True)

    def picture(self) -> dict[str, str]:
        return picture(self.root)


def picture(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def arun(work: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(work)


async def snapshot(store: ObjectStore, source: Path, clock: SystemClock) -> SnapshotResult:
    return await take_snapshot(store, source, options=OPTIONS, writer=WRITER, clock=clock)


async def restored(url: str, snapshot_id: str, target: Path) -> dict[str, str]:
    async with open_store(url) as store:
        await restore_snapshot(store, snapshot_id, target)
    return picture(target)


def expected_kept(times: dict[str, datetime], last: int, daily: int, weekly: int) -> set[str]:
    """restic's rule, written out independently for this test's simple policy."""
    newest_first = sorted(times, key=lambda s: (times[s], s), reverse=True)
    kept = set(newest_first[:last])

    def day(t: datetime) -> object:
        return t.date()

    def iso_week(t: datetime) -> object:
        return t.isocalendar()[:2]

    buckets: list[tuple[int, Callable[[datetime], object]]] = [(daily, day), (weekly, iso_week)]
    for count, bucket in buckets:
        seen: list[object] = []
        for snapshot_id in newest_first:
            b = bucket(times[snapshot_id])
            if b not in seen and len(seen) < count:
                seen.append(b)
                kept.add(snapshot_id)
    return kept


def test_a_week_of_snapshots_forgotten_by_policy_pruned_and_restored(
    seaweed_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Source(tmp_path / "source")
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    clock = SimClock(midnight - timedelta(days=7) + timedelta(hours=1))
    pictures: dict[str, dict[str, str]] = {}
    times: dict[str, datetime] = {}

    async def a_week() -> None:
        async with open_store(seaweed_url) as store:
            for n in range(7 * 4):  # every 6 hours, 01:00 to 19:00 UTC, for seven days
                clock.set_wall(midnight - timedelta(days=7) + timedelta(hours=1 + 6 * n))
                source.change()
                result = await snapshot(store, source.root, clock)
                pictures[result.snapshot_id] = source.picture()
                times[result.snapshot_id] = clock.wall()

    arun(a_week())
    last_upload = time.monotonic()
    ids = sorted(pictures)
    keep = expected_kept(times, last=4, daily=3, weekly=2)
    assert 6 <= len(keep) <= 8

    code, out, err = invoke(
        "forget",
        "--store",
        seaweed_url,
        "--keep-last",
        "4",
        "--keep-daily",
        "3",
        "--keep-weekly",
        "2",
        "--json",
    )
    assert code == 0, err
    body = json.loads(out)
    assert {s["id"] for s in body["snapshots"] if s["keep"]} == keep
    assert set(body["deleted"]) == set(ids) - keep
    assert body["latest"] == ids[-1]

    # The forgotten snapshots' packs must age past the grace period (3 s > the 2 s TTL).
    monkeypatch.setenv("MUSHROOM_BACKUP_LEASE_TTL", "2")
    time.sleep(max(0.0, last_upload + 4.5 - time.monotonic()))
    code, out, err = invoke("prune", "--store", seaweed_url, "--grace", "3s", "--json")
    assert code == 0, err
    pruned = json.loads(out)
    assert pruned["deleted_packs"] > 0
    assert pruned["deleted_bytes"] > 0
    assert pruned["broken_snapshots"] == []
    assert pruned["manifests"] == len(keep)

    for snapshot_id in sorted(keep):
        target = tmp_path / "restore" / snapshot_id
        assert arun(restored(seaweed_url, snapshot_id, target)) == pictures[snapshot_id]

    code, out, err = invoke("check", "--store", seaweed_url, "--read-data", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["clean"] is True
    assert report["snapshots"] == len(keep)
    assert report["packs_read"] == report["used_packs"] > 0
    assert report["reclaimable"]["packs"] == 0


def _is_manifest(key: str) -> bool:
    return key.startswith("manifests/")


async def _prune_under_lease(store: ObjectStore, grace: timedelta) -> PruneResult:
    async def work(fenced: ObjectStore) -> PruneResult:
        return await prune(fenced, clock=SystemClock(), grace=grace)

    return await under_lease(Settings(), work, what="prune", store=store)


def test_prune_racing_a_snapshot_paused_before_its_manifest(
    seaweed_url: str, tmp_path: Path
) -> None:
    source = Source(tmp_path / "source")
    clock = SystemClock()

    async def race() -> tuple[SnapshotResult, SnapshotResult, set[str], PruneResult]:
        async with open_store(seaweed_url) as store:
            first = await snapshot(store, source.root, clock)
            source.change()
            before = {i.key async for i in store.list("data/")}
            faulty = FaultyStore(store)
            gate = faulty.stall("put", key=_is_manifest)
            writer = asyncio.create_task(snapshot(faulty, source.root, clock))
            await gate.entered.wait()  # its packs are stored, its manifest not yet
            uploaded = {i.key async for i in store.list("data/")} - before
            result = await _prune_under_lease(store, timedelta(seconds=30))
            gate.release()
            second = await writer
            return first, second, uploaded, result

    first, second, uploaded, result = arun(race())
    assert uploaded
    assert result.deleted == ()
    assert result.young_packs == len(uploaded)
    assert second.parent_id == first.snapshot_id

    async def after() -> None:
        async with open_store(seaweed_url) as store:
            latest = await read_latest(store)
            assert latest is not None
            assert latest.snapshot_id == second.snapshot_id
            report = await check_store(store, clock=clock, read_data=True)
            assert report.clean

    arun(after())
    target = tmp_path / "restored"
    assert arun(restored(seaweed_url, second.snapshot_id, target)) == source.picture()


def test_prune_racing_a_snapshot_that_reuses_old_orphans_between_mark_and_sweep(
    seaweed_url: str, tmp_path: Path
) -> None:
    source = Source(tmp_path / "source")
    clock = SystemClock()

    async def setup() -> set[str]:
        async with open_store(seaweed_url) as store:
            await snapshot(store, source.root, clock)
            source.change()
            before = {i.key async for i in store.list("data/")}
            faulty = FaultyStore(store)
            faulty.fail(
                "put",
                key=_is_manifest,
                error=lambda k: StoreError("403 AccessDenied", key=k, retryable=False),
            )
            with pytest.raises(StoreError):
                await snapshot(faulty, source.root, clock)
            return {i.key async for i in store.list("data/")} - before

    orphans = arun(setup())
    assert orphans
    time.sleep(2.5)  # the orphans age past a 1 s grace period (the server stamps whole seconds)

    async def race() -> tuple[SnapshotResult, PruneResult]:
        async with open_store(seaweed_url) as store:
            faulty = FaultyStore(store)
            sweep = faulty.stall("list", key="manifests/", nth=2, times=1)
            pruning = asyncio.create_task(_prune_under_lease(faulty, timedelta(seconds=1)))
            await sweep.entered.wait()  # marked: the orphans are old and unused
            second = await snapshot(store, source.root, clock)  # the same packs, found present
            sweep.release()
            return second, await pruning

    second, result = arun(race())
    assert second.new_packs == len(orphans)
    assert set(result.spared) == orphans
    assert result.deleted == ()
    target = tmp_path / "restored"
    assert arun(restored(seaweed_url, second.snapshot_id, target)) == source.picture()
    code, _, err = invoke("check", "--store", seaweed_url, "--read-data")
    assert code == 0, err


def test_a_pack_deleted_by_hand_makes_check_exit_5_naming_the_files(
    seaweed_url: str, tmp_path: Path
) -> None:
    source = Source(tmp_path / "source")

    async def two_snapshots() -> list[str]:
        async with open_store(seaweed_url) as store:
            first = await snapshot(store, source.root, SystemClock())
            source.change()
            second = await snapshot(store, source.root, SystemClock())
            return [first.snapshot_id, second.snapshot_id]

    ids = arun(two_snapshots())
    code, _, err = invoke("check", "--store", seaweed_url, "--read-data")
    assert code == 0, err

    async def first_pack_of_the_second() -> tuple[str, set[str]]:
        async with open_store(seaweed_url) as store:
            manifest = await load_manifest(store, ids[1])
            table = next(e for e in manifest.entries if e.path == "base/1/1259")
            assert isinstance(table, FileEntry)
            pack_id = manifest.chunks[table.chunks[-1]].pack_id  # a rewritten page's pack
            files = {
                e.path
                for e in manifest.entries
                if isinstance(e, FileEntry)
                and any(manifest.chunks[c].pack_id == pack_id for c in e.chunks)
            }
            await store.delete(f"data/{pack_id[:2]}/{pack_id}")
            return pack_id, files

    pack_id, files = arun(first_pack_of_the_second())
    code, out, err = invoke("check", "--store", seaweed_url)
    assert code == 5
    lines = [line for line in out.splitlines() if line.startswith("snapshot ")]
    assert {line.split(" file ")[1].split(":")[0].strip("'") for line in lines} >= files
    assert all(pack_id in line for line in lines)
    assert any(line.startswith(f"snapshot {ids[1]} file 'base/1/1259'") for line in lines)
    assert "problem(s)" in err


def test_a_flipped_byte_makes_check_read_data_exit_5(seaweed_url: str, tmp_path: Path) -> None:
    source = Source(tmp_path / "source")

    async def damage() -> str:
        async with open_store(seaweed_url) as store:
            result = await snapshot(store, source.root, SystemClock())
            key = sorted([i.key async for i in store.list("data/")])[0]
            data = bytearray((await store.get(key)).data)
            data[10] ^= 0x40
            await store.put(key, bytes(data), OVERWRITE)
            return result.snapshot_id

    snapshot_id = arun(damage())
    code, _, err = invoke("check", "--store", seaweed_url)
    assert code == 0, err  # same size: only reading the data shows it
    code, out, _ = invoke("check", "--store", seaweed_url, "--read-data", "--json")
    assert code == 5
    body = json.loads(out)
    kinds = {p["kind"] for p in body["problems"]}
    assert kinds == {"chunk-corrupt", "pack-corrupt"}
    chunk = next(p for p in body["problems"] if p["kind"] == "chunk-corrupt")
    assert chunk["affected"]
    assert all(a["snapshot"] == snapshot_id and a["file"] for a in chunk["affected"])
