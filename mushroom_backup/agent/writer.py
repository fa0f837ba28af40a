"""The writer: take the bucket lease, take snapshots through the write fence, give it back.

* :func:`acquire_lease` -- one acquire, or keep trying for ``wait_s`` seconds (looking again
  after :func:`next_look`); a refusal names the holder and, when it is the ``run`` service on
  this very host, says how to trigger that service instead (:func:`held_message`).
* :func:`next_look` -- a pure rule: how long a contender waits before looking at a held lease
  again: a third of the TTL (1..10 s), or less, until just after the record it read goes stale.
* :class:`SnapshotRunner` -- runs one snapshot as a task over a
  :class:`~mushroom_backup.lease.fenced.FencedStore`, so every write starts only while the
  lease's write deadline holds and an in-flight write is cancelled at it. When the lease is
  lost, :meth:`SnapshotRunner.lease_lost` cancels the task at once and the snapshot raises
  :class:`~mushroom_backup.errors.LeaseLost`; a cancellation of the caller itself stays a
  cancellation. A ``LATEST`` swap refused because another writer moved it marks the lease
  lost. Whatever happens, a snapshot either completes (manifest, then ``LATEST``) or is
  abandoned with ``LATEST`` untouched.
* :func:`backup_now` -- the one-shot: acquire, keep renewed, one snapshot, release.

Not here: the service loop (:mod:`.service`), the snapshot format (:mod:`..snapshot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from .. import log
from ..clock import SYSTEM_CLOCK, Clock
from ..config import Settings
from ..errors import FenceClosed, LatestMoved, LeaseHeld, LeaseLost, StoreError, UsageError
from ..lease.bucket import BucketLease, LeaseCondition, LeaseView, describe, read_lease
from ..lease.fenced import Fence, FencedStore
from ..lease.record import LeaseWatch, new_instance_id
from ..snapshot.backup import BackupOptions, SnapshotResult, take_snapshot
from ..snapshot.manifest import WriterInfo
from ..snapshot.progress import ProgressSink
from ..snapshot.retention import ForgetResult, RetentionPolicy, apply_retention
from ..store import ObjectStore, open_store
from .identity import CombinedFence

T = TypeVar("T")
_log = log.get("agent")


@dataclass(frozen=True)
class ClusterStamp:
    """What a manifest records of the process lease, in a cluster."""

    node_id: int
    boot_incarnation: str
    process_term: int


def backup_options(settings: Settings) -> BackupOptions:
    b = settings.backup
    return BackupOptions(
        excludes=tuple(b.excludes),
        skip_unreadable=b.skip_unreadable,
        chunk_size=b.chunk_size,
        compression_level=b.compression_level,
        upload_concurrency=b.upload_concurrency,
        pack_size=b.pack_size,
    )


def lease_retry_interval(ttl_s: int) -> float:
    """How often a contender looks at a held lease again: a third of the TTL, 1..10 s."""
    return min(10.0, max(1.0, ttl_s / 3))


#: A contender never looks again sooner than this after a look (seconds).
MIN_LOOK_S = 0.05


def next_look(view: LeaseView | None, ttl_s: int, now: datetime) -> float:
    """Seconds until a contender that was refused looks at the lease again.

    :func:`lease_retry_interval` at most; sooner when the record it read (``view``, read at
    ``now`` on the contender's wall clock) is fresh and not suspect and goes stale before
    that: then just after it goes stale, so that a dead holder is replaced as soon as its
    lease expires. Never less than :data:`MIN_LOOK_S`."""
    retry = lease_retry_interval(ttl_s)
    if view is None or view.record is None:
        return retry
    state = describe(view, now)
    if state.condition is not LeaseCondition.FRESH or state.expires_in_s is None:
        return retry
    return max(MIN_LOOK_S, min(retry, state.expires_in_s + MIN_LOOK_S))


def _runs_the_service(pid: int) -> bool | None:
    """Whether process ``pid`` on this host is ``mushroom-backup ... run``; None when that
    cannot be told (no /proc, the process is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    if not any("mushroom" in part for part in argv):
        return False
    return "run" in argv


async def held_message(store: ObjectStore, held: LeaseHeld) -> str:
    """Why we cannot write, and what to do: a service on this host is triggered, not raced."""
    try:
        view = await read_lease(store)
    except StoreError:
        view = None
    record = view.record if view is not None else None
    if record is not None and record.instance_id != held.instance_id:
        record = None  # it changed since: name only what the acquire saw
    if record is not None and record.host and record.host == socket.gethostname():
        service = _runs_the_service(record.pid) if record.pid else None
        if service is not False:
            pid = f" (pid {record.pid})" if record.pid else ""
            return (
                f"the mushroom-backup service on this host{pid} holds the lease "
                f"({record.instance_id}); trigger a snapshot there instead: "
                "systemctl kill -s USR1 mushroom-backup"
                + (f" (or: kill -USR1 {record.pid})" if record.pid else "")
            )
        return (
            f"another mushroom-backup process on this host (pid {record.pid}) holds the "
            f"lease ({record.instance_id}); wait for it to finish, or use --wait-lease SECONDS"
        )
    where = f" on host {record.host}" if record is not None and record.host else ""
    return (
        f"the backup prefix's lease is held by another instance ({held.instance_id}{where}); "
        "wait for it to finish, or use --wait-lease SECONDS"
    )


async def acquire_lease(
    store: ObjectStore,
    settings: Settings,
    *,
    clock: Clock = SYSTEM_CLOCK,
    wait_s: float | None = None,
    instance_id: str | None = None,
) -> BucketLease:
    """Take the lease, trying again for up to ``wait_s`` seconds while another instance holds
    it. Raises :class:`LeaseHeld` (with the holder and what to do) when it stays held."""
    me = instance_id or new_instance_id()
    watch = LeaseWatch()
    give_up = clock.monotonic() + (wait_s or 0.0)
    while True:
        try:
            return await BucketLease.acquire(
                store, ttl_s=settings.lease.ttl_s, instance_id=me, watch=watch, clock=clock
            )
        except LeaseHeld as held:
            remaining = give_up - clock.monotonic()
            if remaining <= 0:
                raise LeaseHeld(held.instance_id, await held_message(store, held)) from None
            try:
                view = await read_lease(store)
            except StoreError:
                view = None
            pause = next_look(view, settings.lease.ttl_s, clock.wall())
            _log.info(
                "lease.waiting",
                extra={"fields": {"holder": held.instance_id, "remaining_s": round(remaining)}},
            )
            await clock.sleep(min(pause, remaining))


@dataclass
class SnapshotRunner:
    """Runs snapshots under a held lease; see the module docstring."""

    store: ObjectStore
    lease: BucketLease
    settings: Settings
    clock: Clock = SYSTEM_CLOCK
    cluster: ClusterStamp | None = None
    #: Another fence every write must also pass (the process lease, in a cluster).
    extra_fence: Fence | None = None
    on_fence_closed: Callable[[], None] | None = None
    _task: asyncio.Task[SnapshotResult] | None = field(default=None, init=False)
    _lost: LeaseLost | None = field(default=None, init=False)

    def writer(self) -> WriterInfo:
        return WriterInfo(
            instance_id=self.lease.instance_id,
            exclusion=str(self.lease.exclusion),
            host=socket.gethostname(),
            pid=os.getpid(),
            node_id=self.cluster.node_id if self.cluster else None,
            boot_incarnation=self.cluster.boot_incarnation if self.cluster else None,
            process_term=self.cluster.process_term if self.cluster else None,
        )

    def lease_lost(self, lost: LeaseLost) -> None:
        """The lease is gone: cancel the snapshot in flight now (nothing waits for it)."""
        self._lost = lost
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def fenced_store(self) -> FencedStore:
        """The store as this holder may write it: every write passes the bucket lease's fence
        and, in a cluster, the process lease's too."""
        fence: Fence = self.lease
        if self.extra_fence is not None:
            fence = CombinedFence((self.lease, self.extra_fence))
        return FencedStore(self.store, fence, self.clock)

    async def forget(self, policy: RetentionPolicy) -> ForgetResult:
        """Apply the retention policy under the held lease, every delete fenced."""
        if self._lost is not None or self.lease.lost:
            raise self._lost or LeaseLost(None)
        return await apply_retention(self.fenced_store(), policy, clock=self.clock)

    async def snapshot(self, source: Path, progress: ProgressSink | None = None) -> SnapshotResult:
        """One snapshot through the fence. Raises LeaseLost / FenceClosed (exit 4) when it is
        abandoned because of the lease; ``LATEST`` is then untouched."""
        if self._lost is not None or self.lease.lost:
            raise self._lost or LeaseLost(None)
        fenced = self.fenced_store()
        self._task = asyncio.create_task(
            take_snapshot(
                fenced,
                source,
                options=backup_options(self.settings),
                writer=self.writer(),
                clock=self.clock,
                progress=progress,
            ),
            name="snapshot",
        )
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            cancelled_here = current is not None and current.cancelling() > 0
            if self._lost is not None and self._task.cancelled() and not cancelled_here:
                raise LeaseLost(
                    self._lost.instance_id,
                    f"{self._lost.message}; the snapshot in flight was abandoned and LATEST "
                    "still names the previous snapshot",
                ) from None
            self._task.cancel()
            raise
        except LatestMoved:
            self.lease.mark_lost()
            raise
        except FenceClosed:
            if self.on_fence_closed is not None:
                self.on_fence_closed()
            raise
        finally:
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
            self._task = None


def require_source_dir(settings: Settings) -> Path:
    """The configured source, which must be an existing directory (else a usage error, exit
    2, saying how to give one)."""
    source = settings.require_source()
    if not source.is_dir():
        what = "is not a directory" if source.exists() else "does not exist"
        raise UsageError(
            f"the source {source} {what}: pass --source DIR, or set MUSHROOM_BACKUP_SOURCE "
            "or source = ... in the config file"
        )
    return source


async def run_under_lease(
    settings: Settings,
    work: Callable[[ObjectStore, BucketLease], Coroutine[Any, Any, T]],
    *,
    what: str,
    wait_lease_s: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    store: ObjectStore | None = None,
) -> T:
    """The one-shot commands' frame (``backup now``, ``forget``, ``prune``): take the bucket
    lease (waiting up to ``wait_lease_s``), run ``work(store, lease)`` as a task while keeping
    the lease renewed, release the lease. ``work`` writes only through a fenced store. A lost
    lease cancels ``work`` at once and raises LeaseLost (exit 4) saying ``what`` was stopped."""
    owned = store is None
    target = store or open_store(settings.require_store(), conditional=settings.lease.conditional)
    try:
        lease = await acquire_lease(target, settings, clock=clock, wait_s=wait_lease_s)
        lost: list[LeaseLost] = []
        task: asyncio.Task[T] | None = None

        def on_lost(error: LeaseLost) -> None:
            lost.append(error)
            if task is not None and not task.done():
                task.cancel()

        try:
            async with lease.keep_renewed(on_lost=on_lost):
                task = asyncio.create_task(work(target, lease), name=what)
                try:
                    return await task
                except asyncio.CancelledError:
                    if lost and task.cancelled():
                        raise LeaseLost(
                            lost[0].instance_id,
                            f"{lost[0].message}; {what} was stopped",
                        ) from None
                    raise
        finally:
            try:
                await lease.release()
            except StoreError as error:
                _log.warning(
                    "lease.release_failed",
                    extra={"fields": {"error": error.message, "expires_in_s": lease.ttl_s}},
                )
    finally:
        if owned:
            await target.close()


async def backup_now(
    settings: Settings,
    *,
    clock: Clock = SYSTEM_CLOCK,
    wait_lease_s: float | None = None,
    progress: ProgressSink | None = None,
    store: ObjectStore | None = None,
) -> SnapshotResult:
    """Acquire the lease, take one snapshot while keeping it renewed, release it. A lost lease
    abandons the snapshot (LATEST untouched) with LeaseLost."""
    source = require_source_dir(settings)

    async def snapshot(target: ObjectStore, lease: BucketLease) -> SnapshotResult:
        return await SnapshotRunner(target, lease, settings, clock).snapshot(source, progress)

    return await run_under_lease(
        settings,
        snapshot,
        what="the snapshot (abandoned: LATEST still names the previous one)",
        wait_lease_s=wait_lease_s,
        clock=clock,
        store=store,
    )


__all__ = [
    "ClusterStamp",
    "SnapshotRunner",
    "acquire_lease",
    "backup_now",
    "backup_options",
    "held_message",
    "lease_retry_interval",
    "next_look",
    "require_source_dir",
    "run_under_lease",
]
