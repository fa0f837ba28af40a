"""Prune: delete the packs no manifest uses, without ever deleting one a snapshot needs -- even
while writers that can still exist are writing.

:func:`plan_prune` (pure) decides from a listing, the packs the manifests use and an explicit
``now``; :func:`prune` lists, decides, and deletes through the store it is given -- the caller
holds the bucket lease and passes a :class:`~mushroom_backup.lease.fenced.FencedStore`, so every
delete starts only while the lease's write deadline holds, and one still in flight at the
deadline is cancelled.

The rule
--------
A pack ``data/xx/ID`` is deleted only if **both**

1. **no manifest present at sweep time uses it** -- every manifest listed before the deletes
   start is loaded, and before each batch of deletes ``manifests/`` is listed again and every
   manifest that appeared since (newer than the mark) is loaded and its packs are taken out of
   the batch; the manifest ``LATEST`` names must be among them, else nothing is deleted; and
2. **it is older than the grace period** (default 24 h): ``now - last_modified > grace``,
   where ``last_modified`` is what the store's listing says (the store's clock) and ``now`` is
   our wall clock, but never later than the newest ``last_modified`` the store reported for
   anything (the ``LEASE`` this holder just renewed is among them). So ages are measured on
   both clocks and the younger reading wins: a store clock behind ours cannot make a fresh
   upload look old, and neither can ours running ahead.

Anything that is not a well-formed pack key under ``data/`` is never deleted (it is reported).
A manifest that cannot be read, or a ``LATEST`` that names no manifest, stops prune before it
deletes anything: it cannot know what that snapshot needs.

Why this is safe (the writers that can still exist)
---------------------------------------------------
Prune runs only while holding the bucket lease, so the only other writers are (a) a *stale
holder* -- one whose lease expired, with requests sent before its write deadline still in
flight -- and (b) in best-effort mode, a real second writer. Four facts of the format:

F1. A snapshot writes its packs, then its manifest, then ``LATEST``, each step only after the
    previous one returned.
F2. A manifest uses only packs its writer uploaded (or found present) and packs its parent's
    manifest uses -- the parent being the snapshot ``LATEST`` named when it started.
F3. A holder starts no write after its write deadline, 2/3 of a TTL after its last confirmed
    renewal; nobody can take the lease over before a full TTL (clock skew up to the remaining
    third is absorbed). So every request a stale holder will ever send was sent before prune
    acquired the lease.
F4. ``LATEST`` moves only by compare-and-swap against the version the writer read when it
    started, and ``forget`` never deletes the snapshot ``LATEST`` names.

Claim: prune never deletes a pack used by a manifest that ``LATEST`` names, now or later.

* A manifest ``LATEST`` comes to name later was written before the swap was sent (F1), and the
  swap was sent before prune acquired the lease (F3). So that manifest was stored before prune
  listed anything, prune loads it, and keeps every pack it uses -- however old, including packs
  its writer found already present (an abandoned snapshot's identical bytes).
* The manifest ``LATEST`` names now is loaded, or prune deletes nothing.
* A stale holder's manifest that lands after prune listed (sent before its deadline, delivered
  late) can never become ``LATEST``: the swap would be a new write after its deadline (F3).
  Its packs are young and kept by the grace period; if it reused packs its parent used and the
  parent has been forgotten since, ``LATEST`` moved, so its swap is refused anyway (F4).

The lease alone makes prune safe; **the grace period is what keeps it safe when the lease's
assumptions fail**: a writer in best-effort mode, a holder whose clock stepped further than the
fence absorbs or whose VM froze between its check and its send, a store whose listing lags
behind its writes. Such a writer's own uploads are fresh, and the grace period keeps them until
its manifest lands. It must exceed the lease TTL (how long a writer that lost the lease without
knowing it keeps uploading) plus the lifetime of a request (an object's ``last_modified`` may be
as early as the moment its upload began): the default 24 h leaves hours of margin, and the CLI
refuses a grace period shorter than the TTL. The listing before each batch of deletes narrows
what is left to one batch, and the listing after the deletes reports any manifest that
appeared and uses a deleted pack (:attr:`PruneResult.broken_snapshots`, exit 5) rather than
staying silent.

Best-effort mode (no conditional writes) weakens this as it weakens the lease: two writers can
overlap for real, and one that found an old unused pack present while prune deletes it loses
that pack. Do not run prune while another instance may write; prune logs ``prune.best_effort``.

Partly used packs
-----------------
A pack is deleted only when *no* chunk in it is used; a pack some of whose chunks are still
used is kept whole and **never rewritten**. Rewriting would mean uploading a smaller pack under
a new name and then changing every manifest that points into the old one -- but manifests are
immutable, create-only objects named by their snapshot id, and ``LATEST`` names them: replacing
them would break the write order every safety argument above rests on. The cost is space: the
unused chunks of partly used packs (database pages overwritten since) stay until every snapshot
using the pack is forgotten. :attr:`PruneResult.partly_unused_bytes` reports it; smaller
``pack_size`` makes it smaller at the price of more requests. With the usual policies the
packs of old snapshots become wholly unused as the snapshots age out, so the waste is bounded
by what the kept snapshots' packs share with forgotten ones.

Not promised: that a stale holder's object landing after prune ran is removed (the next prune
removes it once it is older than the grace period); deleting unknown keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..clock import Clock
from ..errors import IntegrityError, NotFound
from ..retry import retrying
from ..store.base import ObjectInfo, ObjectStore
from .catalog import get_retrying, read_latest
from .ids import is_snapshot_id
from .manifest import LATEST_KEY, MANIFESTS_PREFIX, Manifest, decode_manifest, manifest_key
from .pack import DATA_PREFIX, pack_id_of_key

log = logging.getLogger("mushroom_backup.snapshot.prune")

Sleep = Callable[[float], Awaitable[None]]

DEFAULT_GRACE = timedelta(hours=24)
DELETE_BATCH = 256
#: The bucket lease's key (snapshot/ does not import lease/): its holder renewed it moments
#: ago, so its last_modified is a fresh reading of the store's clock.
LEASE_KEY = "LEASE"


# --- what the manifests use --------------------------------------------------------------------


@dataclass
class PackUsage:
    """Which bytes of which packs the manifests loaded so far use: pack id -> offset -> stored
    length of each chunk used (a chunk used by many snapshots counts once)."""

    chunks: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, manifest: Manifest) -> None:
        for pack in manifest.body.packs:
            used = self.chunks.setdefault(pack.id, {})
            for _chunk_id, offset, length, _raw in pack.chunks:
                used[offset] = length

    def __contains__(self, pack_id: object) -> bool:
        return pack_id in self.chunks

    def used_bytes(self, pack_id: str) -> int:
        return sum(self.chunks.get(pack_id, {}).values())


def store_now(wall: datetime, observed: Iterable[datetime | None]) -> datetime:
    """The moment object ages are measured from: ``wall`` (our clock), but never later than
    the newest modification time the store reported (a lower bound of the store's clock)."""
    stamps = [s for s in observed if s is not None]
    return min(wall, max(stamps)) if stamps else wall


@dataclass(frozen=True)
class PrunePlan:
    """What to do with every object under ``data/``.

    ``delete``: unused packs older than the grace period. ``young``: unused packs within it, or
    without a modification time (kept). ``used``: packs some manifest uses; ``partly_used`` those
    of them with chunks no manifest uses, with the unused bytes (trailer included).
    ``unknown``: keys under ``data/`` that are not pack keys (never deleted). ``missing``: pack
    ids manifests use that the listing lacks (``check`` reports them)."""

    delete: tuple[ObjectInfo, ...]
    young: tuple[ObjectInfo, ...]
    used: tuple[ObjectInfo, ...]
    partly_used: tuple[tuple[ObjectInfo, int], ...]
    unknown: tuple[str, ...]
    missing: tuple[str, ...]


def plan_prune(
    objects: Iterable[ObjectInfo],
    usage: PackUsage,
    *,
    now: datetime,
    grace: timedelta,
) -> PrunePlan:
    """Sort the listed objects (module docstring, "The rule")."""
    delete: list[ObjectInfo] = []
    young: list[ObjectInfo] = []
    used: list[ObjectInfo] = []
    partly: list[tuple[ObjectInfo, int]] = []
    unknown: list[str] = []
    listed: set[str] = set()
    for info in objects:
        pack_id = pack_id_of_key(info.key)
        if pack_id is None:
            unknown.append(info.key)
            continue
        listed.add(pack_id)
        if pack_id in usage:
            used.append(info)
            unused = info.size - usage.used_bytes(pack_id)
            if unused > 0:
                partly.append((info, unused))
        elif info.last_modified is not None and now - info.last_modified > grace:
            delete.append(info)
        else:
            young.append(info)
    missing = sorted(set(usage.chunks) - listed)
    return PrunePlan(
        tuple(delete), tuple(young), tuple(used), tuple(partly), tuple(unknown), tuple(missing)
    )


# --- the driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune` found and did. ``deleted`` are pack keys (with ``dry_run``: those it
    would delete); ``spared`` were planned for deletion but a manifest that appeared before the
    sweep uses them; ``broken_snapshots`` appeared after the sweep and use a deleted pack."""

    dry_run: bool
    grace: timedelta
    now: datetime
    manifests: int
    late_manifests: int
    packs: int
    pack_bytes: int
    used_packs: int
    used_bytes: int
    deleted: tuple[str, ...]
    deleted_bytes: int
    spared: tuple[str, ...]
    young_packs: int
    young_bytes: int
    partly_used_packs: int
    partly_unused_bytes: int
    unknown_keys: tuple[str, ...]
    missing_packs: tuple[str, ...]
    broken_snapshots: tuple[str, ...]


class _Manifests:
    """Every manifest loaded so far, and what they use."""

    def __init__(self, store: ObjectStore, sleep: Sleep, concurrency: int) -> None:
        self.store = store
        self.sleep = sleep
        self.gate = asyncio.Semaphore(concurrency)
        self.loaded: dict[str, Manifest] = {}
        self.usage = PackUsage()
        self.observed: list[datetime | None] = []

    async def refresh(self) -> list[Manifest]:
        """List ``manifests/`` and load every manifest not loaded yet; returns those."""
        new: list[str] = []
        async for info in self.store.list(MANIFESTS_PREFIX):
            self.observed.append(info.last_modified)
            snapshot_id = info.key[len(MANIFESTS_PREFIX) :]
            if is_snapshot_id(snapshot_id) and snapshot_id not in self.loaded:
                new.append(snapshot_id)
        found = await asyncio.gather(*(self._load(s) for s in new))
        return [m for m in found if m is not None]

    async def ensure(self, snapshot_id: str) -> bool:
        """Load one manifest if it is not loaded yet; False if it does not exist."""
        if snapshot_id in self.loaded:
            return True
        return await self._load(snapshot_id) is not None

    async def _load(self, snapshot_id: str) -> Manifest | None:
        key = manifest_key(snapshot_id)
        async with self.gate:
            try:
                found = await get_retrying(self.store, key, self.sleep)
            except NotFound:
                return None  # forgotten since it was listed
            try:
                manifest = await asyncio.to_thread(decode_manifest, found.data, key, snapshot_id)
            except IntegrityError as error:
                raise IntegrityError(
                    f"prune deletes nothing while a manifest cannot be read: {error.message}. "
                    "Run `mushroom-backup check`; if that snapshot is beyond repair, "
                    f"`mushroom-backup forget {snapshot_id}` and prune again"
                ) from None
        self.loaded[snapshot_id] = manifest
        self.usage.add(manifest)
        return manifest


async def _latest_loaded(manifests: _Manifests, sleep: Sleep) -> str | None:
    latest = await read_latest(manifests.store, sleep=sleep)
    if latest is None:
        return None
    if not await manifests.ensure(latest.snapshot_id):
        raise IntegrityError(
            f"{LATEST_KEY} names snapshot {latest.snapshot_id}, whose manifest does not exist; "
            "prune deletes nothing. Run `mushroom-backup check`, then take a backup (it "
            f"replaces {LATEST_KEY}) and prune again"
        )
    return latest.snapshot_id


async def _store_clock(store: ObjectStore) -> list[datetime | None]:
    stamps: list[datetime | None] = []
    for key in (LEASE_KEY, LATEST_KEY):
        with contextlib.suppress(NotFound):
            stamps.append((await store.head(key)).last_modified)
    return stamps


async def prune(
    store: ObjectStore,
    *,
    clock: Clock,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    concurrency: int = 8,
    batch: int = DELETE_BATCH,
) -> PruneResult:
    """Delete the packs no manifest uses and older than ``grace`` (module docstring). The
    caller holds the bucket lease and passes a fenced store; ``dry_run`` deletes nothing."""
    if grace < timedelta(0):
        raise ValueError("the grace period must not be negative")
    if batch < 1 or concurrency < 1:
        raise ValueError("batch and concurrency must be at least 1")
    sleep = clock.sleep
    if not store.conditional and not dry_run:
        log.warning(
            "prune.best_effort",
            extra={
                "fields": {
                    "detail": "conditional writes are off: a second writer may overlap; "
                    "do not run prune while another instance may write"
                }
            },
        )
    # Mark: data first, then manifests, so that a pack and its manifest written in between
    # show up as a used pack (or a young one), never as an old unused one.
    objects = [info async for info in store.list(DATA_PREFIX)]
    manifests = _Manifests(store, sleep, concurrency)
    await manifests.refresh()
    await _latest_loaded(manifests, sleep)
    marked = len(manifests.loaded)
    observed = [o.last_modified for o in objects] + manifests.observed
    observed += await _store_clock(store)
    now = store_now(clock.wall(), observed)
    plan = plan_prune(objects, manifests.usage, now=now, grace=grace)
    log.info(
        "prune.planned",
        extra={
            "fields": {
                "packs": len(objects),
                "manifests": marked,
                "delete": len(plan.delete),
                "young": len(plan.young),
                "grace_s": grace.total_seconds(),
                "dry_run": dry_run,
            }
        },
    )

    deleted: list[ObjectInfo] = []
    spared: list[str] = []
    if not dry_run:
        gate = asyncio.Semaphore(concurrency)

        async def remove(info: ObjectInfo) -> None:
            async def call() -> None:
                await store.delete(info.key)

            async with gate:
                await retrying(call, what=f"delete {info.key}", sleep=sleep)

        pending = list(plan.delete)
        for start in range(0, len(pending), batch):
            # Sweep: whatever a manifest present now uses is spared, however old.
            await manifests.refresh()
            await _latest_loaded(manifests, sleep)
            todo = []
            for info in pending[start : start + batch]:
                if pack_id_of_key(info.key) in manifests.usage:
                    spared.append(info.key)
                else:
                    todo.append(info)
            await asyncio.gather(*(remove(info) for info in todo))
            deleted.extend(todo)
            log.info(
                "prune.deleted",
                extra={"fields": {"packs": len(todo), "bytes": sum(i.size for i in todo)}},
            )
    else:
        deleted = list(plan.delete)

    broken: list[str] = []
    if not dry_run and deleted:
        gone = {pack_id_of_key(info.key) for info in deleted}
        for manifest in await manifests.refresh():
            if any(pack.id in gone for pack in manifest.body.packs):
                broken.append(manifest.snapshot_id)
        for snapshot_id in broken:
            log.error(
                "prune.late_manifest_broken",
                extra={
                    "fields": {
                        "snapshot_id": snapshot_id,
                        "detail": "a writer ignored the lease: its snapshot appeared after the "
                        "sweep and uses a deleted pack",
                    }
                },
            )

    used_bytes = sum(i.size for i in plan.used)
    return PruneResult(
        dry_run=dry_run,
        grace=grace,
        now=now,
        manifests=len(manifests.loaded),
        late_manifests=len(manifests.loaded) - marked,
        packs=len(objects) - len(plan.unknown),
        pack_bytes=sum(i.size for i in objects if pack_id_of_key(i.key) is not None),
        used_packs=len(plan.used),
        used_bytes=used_bytes,
        deleted=tuple(i.key for i in deleted),
        deleted_bytes=sum(i.size for i in deleted),
        spared=tuple(spared),
        young_packs=len(plan.young),
        young_bytes=sum(i.size for i in plan.young),
        partly_used_packs=len(plan.partly_used),
        partly_unused_bytes=sum(unused for _, unused in plan.partly_used),
        unknown_keys=plan.unknown,
        missing_packs=plan.missing,
        broken_snapshots=tuple(broken),
    )


__all__ = [
    "DEFAULT_GRACE",
    "PackUsage",
    "PrunePlan",
    "PruneResult",
    "plan_prune",
    "prune",
    "store_now",
]
