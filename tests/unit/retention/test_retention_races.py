"""Prune racing writers, interleaved deterministically with stalls on an in-memory bucket and a
fake clock. Whatever the interleaving, prune never deletes a pack that a snapshot which is -- or
can still become -- ``LATEST`` uses, and every snapshot restores byte for byte.

* a snapshot paused between its pack uploads and its manifest while prune runs;
* a stale holder whose upload is still in flight when prune takes the lease over, and lands
  after prune ran;
* a snapshot that finds an old orphan pack already present and writes its manifest between
  prune's mark and its sweep (the sweep-time listing spares the pack);
* a writer that ignores the lease and writes its manifest while prune is deleting: prune
  reports the broken snapshot instead of staying silent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.cli.maintenance import _fail_on_broken, under_lease
from mushroom_backup.clock import FakeClock
from mushroom_backup.config import Settings
from mushroom_backup.errors import FenceClosed, IntegrityError, StoreError
from mushroom_backup.lease.bucket import BucketLease
from mushroom_backup.lease.fenced import FencedStore
from mushroom_backup.snapshot import SnapshotResult, read_latest, restore_snapshot, take_snapshot
from mushroom_backup.snapshot.check import check_store
from mushroom_backup.snapshot.prune import PruneResult, prune
from mushroom_backup.store.base import (
    OVERWRITE,
    ObjectInfo,
    ObjectStore,
    PutMode,
    StoredObject,
    Version,
)
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.unit.retention.retention_support import (
        OPTIONS,
        WRITER,
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
        base_files,
        content,
        data_keys,
        picture,
        write_tree,
    )

GRACE = timedelta(hours=3)
TTL = 30


def _is_manifest(key: str) -> bool:
    return key.startswith("manifests/")


def _is_pack(key: str) -> bool:
    return key.startswith("data/")


class World:
    """One bucket, one fake clock that also stamps the objects, one source directory."""

    def __init__(self, root: Path) -> None:
        self.clock = FakeClock(wall=datetime(2026, 11, 20, 3, 0, tzinfo=UTC))
        self.store = MemoryStore(now=self.clock.wall)
        self.root = root
        self.source = root / "source"
        write_tree(self.source, base_files())
        self.version = 0

    def change(self, chunks: int = 6) -> None:
        self.version += 1
        write_tree(self.source, {"base/1/1259": content(chunks * 4096 + 100, f"t-{self.version}")})

    async def snapshot(self, store: ObjectStore | None = None) -> SnapshotResult:
        return await take_snapshot(
            store or self.store, self.source, options=OPTIONS, writer=WRITER, clock=self.clock
        )

    async def abandoned(self) -> set[str]:
        """Upload a snapshot's packs, then fail its manifest: the packs are orphans."""
        before = data_keys(self.store.keys)
        faulty = FaultyStore(self.store)
        faulty.fail("put", key=_is_manifest, error=_refused)
        with pytest.raises(StoreError):
            await self.snapshot(faulty)
        return data_keys(self.store.keys) - before

    async def prune(self, store: ObjectStore | None = None) -> PruneResult:
        """Prune under the bucket lease, as the CLI does."""

        async def work(fenced: ObjectStore) -> PruneResult:
            return await prune(fenced, clock=self.clock, grace=GRACE)

        settings = Settings.model_validate({"lease": {"ttl_s": TTL}})
        return await under_lease(
            settings, work, what="prune", clock=self.clock, store=store or self.store
        )

    async def restores_as_source(self, snapshot_id: str) -> bool:
        target = self.root / f"restore-{snapshot_id}"
        await restore_snapshot(self.store, snapshot_id, target)
        return picture(target) == picture(self.source)

    async def check_is_clean(self) -> bool:
        report = await check_store(self.store, clock=self.clock, read_data=True)
        return report.clean


def _refused(key: str) -> StoreError:
    return StoreError(f"403 AccessDenied for {key!r}", key=key, retryable=False)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_prune_while_a_snapshot_waits_to_write_its_manifest(world: World) -> None:
    first = await world.snapshot()
    world.change()
    old_orphans = await world.abandoned()
    world.clock.advance(4 * 3600)  # those orphans are now older than the grace period
    world.change()
    before = data_keys(world.store.keys)

    faulty = FaultyStore(world.store)
    gate = faulty.stall("put", key=_is_manifest)
    writer = asyncio.create_task(world.snapshot(faulty))
    await gate.entered.wait()  # every pack uploaded; the manifest not yet written
    uploaded = data_keys(world.store.keys) - before
    assert uploaded

    result = await world.prune()
    assert set(result.deleted) == old_orphans  # the old orphans go ...
    assert uploaded <= data_keys(world.store.keys)  # ... the writer's fresh packs stay
    assert result.young_packs == len(uploaded)

    gate.release()
    second = await writer
    assert second.parent_id == first.snapshot_id
    latest = await read_latest(world.store)
    assert latest is not None
    assert latest.snapshot_id == second.snapshot_id
    assert await world.restores_as_source(second.snapshot_id)
    assert await world.check_is_clean()


class InFlight(ObjectStore):
    """Puts of matching keys are sent as requests the service has already received: they land
    when :meth:`land` is called, whatever happens to the caller meanwhile (cancelled at its
    write deadline, say)."""

    def __init__(self, inner: ObjectStore, match: Callable[[str], bool]) -> None:
        self.inner = inner
        self.url = inner.url
        self.match = match
        self.entered = asyncio.Event()
        self._gate = asyncio.Event()
        self.requests: list[asyncio.Task[Version]] = []
        self.stored = 0
        self._stored_more = asyncio.Condition()

    async def stored_at_least(self, count: int) -> None:
        """Wait until ``count`` puts that were not held have been stored."""
        async with self._stored_more:
            await self._stored_more.wait_for(lambda: self.stored >= count)

    def land(self) -> None:
        self._gate.set()

    async def _later(self, key: str, data: bytes, mode: PutMode) -> Version:
        await self._gate.wait()
        return await self.inner.put(key, data, mode)

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        if not self.match(key) or self._gate.is_set():
            version = await self.inner.put(key, data, mode)
            async with self._stored_more:
                self.stored += 1
                self._stored_more.notify_all()
            return version
        request = asyncio.ensure_future(self._later(key, data, mode))
        self.requests.append(request)
        self.entered.set()
        return await asyncio.shield(request)

    async def get(self, key: str) -> StoredObject:
        return await self.inner.get(key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self.inner.get_range(key, start, length)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        await self.inner.delete(key, if_match)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)


async def test_a_stale_holders_upload_landing_after_prune_took_over(world: World) -> None:
    first = await world.snapshot()
    world.change()
    old_orphans = await world.abandoned()
    world.clock.advance(4 * 3600)
    world.change(chunks=30)  # several packs
    stale = await BucketLease.acquire(
        world.store, ttl_s=TTL, instance_id="5" * 32, clock=world.clock
    )
    # The stale holder's first pack upload is in flight and stays there (a frozen VM, a slow
    # network); it never renews its lease again.
    seen: list[str] = []

    def first_pack(key: str) -> bool:
        if _is_pack(key):
            seen.append(key)
        return _is_pack(key) and len(seen) == 1

    inflight = InFlight(world.store, first_pack)
    writer = asyncio.create_task(world.snapshot(FencedStore(inflight, stale, world.clock)))
    await inflight.entered.wait()
    await inflight.stored_at_least(2)  # two more packs land meanwhile
    world.clock.advance(TTL * 2 / 3)  # its write deadline: the request is cancelled locally
    with pytest.raises(FenceClosed):
        await writer
    world.clock.advance(TTL / 3 + 1)  # a full TTL since its renewal: anyone may take over
    landed = set(seen[1:]) & data_keys(world.store.keys)
    assert landed

    result = await world.prune()
    assert set(result.deleted) == old_orphans  # old orphans go; the stale holder's are young
    assert landed <= data_keys(world.store.keys)
    inflight.land()  # the request the service had received lands now
    await asyncio.gather(*inflight.requests)
    assert set(seen) <= data_keys(world.store.keys)

    latest = await read_latest(world.store)
    assert latest is not None
    assert latest.snapshot_id == first.snapshot_id
    assert await world.check_is_clean()
    # back to the first snapshot's source, and restore it
    write_tree(world.source, {"base/1/1259": base_files()["base/1/1259"]})
    assert await world.restores_as_source(first.snapshot_id)

    # Once older than the grace period, the stale holder's packs are ordinary orphans.
    world.clock.advance(4 * 3600)
    later = await world.prune()
    assert set(seen) <= set(later.deleted)
    assert await world.check_is_clean()
    report = await check_store(world.store, clock=world.clock)
    assert report.reclaimable_packs == 0


async def test_a_manifest_written_between_mark_and_sweep_spares_the_packs_it_found(
    world: World,
) -> None:
    await world.snapshot()
    world.change()
    orphans = await world.abandoned()  # packs of this exact source state, never referenced
    world.clock.advance(4 * 3600)

    faulty = FaultyStore(world.store)
    sweep = faulty.stall("list", key="manifests/", nth=2, times=1)  # the sweep's listing
    pruning = asyncio.create_task(world.prune(faulty))
    await sweep.entered.wait()  # marked: the orphans are old, unused, planned for deletion

    # The same source state again: the same packs, found present by the create-only uploads.
    second = await world.snapshot()
    assert second.new_packs == len(orphans)
    assert data_keys(world.store.keys) >= orphans

    sweep.release()
    result = await pruning
    assert set(result.spared) == orphans
    assert result.deleted == ()
    assert result.late_manifests == 1
    assert await world.restores_as_source(second.snapshot_id)
    assert await world.check_is_clean()


async def test_a_writer_ignoring_the_lease_during_the_deletes_is_reported(world: World) -> None:
    await world.snapshot()
    world.change()
    orphans = await world.abandoned()
    world.clock.advance(4 * 3600)

    faulty = FaultyStore(world.store)
    deleting = faulty.stall("delete", key=_is_pack)
    pruning = asyncio.create_task(world.prune(faulty))
    await deleting.entered.wait()  # swept: the deletes are on their way
    second = await world.snapshot()  # no lease: finds the doomed packs present, uses them
    deleting.release()
    result = await pruning
    assert set(result.deleted) == orphans
    assert result.broken_snapshots == (second.snapshot_id,)
    with pytest.raises(IntegrityError, match=second.snapshot_id):
        _fail_on_broken(result)
    report = await check_store(world.store, clock=world.clock)
    assert {p.kind for p in report.problems} == {"pack-missing"}
    assert report.affected_snapshots == (second.snapshot_id,)
