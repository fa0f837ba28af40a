"""``mushroom-backup run``: the long-running agent, one per database host.

Life cycle::

    start ──► standby ──(lease acquired)──► holding ──(lease lost)──► standby ...
                 ▲                             │
                 └──────── (SIGTERM/SIGINT) ───┴──► stopping: finish the snapshot in flight
                                                    within ``stop_grace_s`` or cancel it,
                                                    release the lease, exit 0

* **Standby**: while another instance holds a fresh lease, log who (instance id, and host and
  pid when the record has them) -- at INFO when the holder changes, at DEBUG on every further
  look -- and look again after :func:`~.writer.next_look`: a third of the TTL (1..10 s), or
  sooner, just after the moment the record we read goes stale. So a dead holder is replaced
  within about one TTL of its last renewal (at most one TTL plus one retry interval), and a
  lease released on shutdown is taken within one retry interval. Store failures are logged
  and retried with growing pauses. A stop interrupts an acquire in flight; whatever record of
  ours it may have written is handed back.
* **Holding**: the lease is renewed every ttl/3 in the background (transient failures retried
  only while the fence is open). Snapshots run when :class:`~.triggers.Triggers` says so: on
  the interval (counted from the snapshot ``LATEST`` names, so a new holder does not snapshot
  at once), after watched changes settle, or on SIGUSR1. Triggers that arrive during a snapshot
  coalesce into one follow-up. A lost lease cancels the snapshot in flight (nothing written
  after that point, ``LATEST`` untouched), is logged (``service.lease_lost``), and the service
  goes back to standby -- it never exits for a lost lease. A renewal request that hangs instead
  of failing counts as a loss too, once the write fence has stayed closed for a third of a TTL
  (a full TTL after the last confirmed renewal: a takeover is possible from then on) -- rather
  than after the store's own timeout. A snapshot that fails for any other reason is logged
  (``snapshot.failed``) and the next trigger tries again.
* **Signals**: SIGTERM/SIGINT stop: no new snapshot starts, the one in flight gets
  ``stop_grace_s`` to finish (a second SIGTERM/SIGINT cancels it at once), the lease is
  released (bounded by ``release_timeout_s``; otherwise it expires after its TTL), exit 0.
  SIGUSR1 requests a snapshot now -- while holding; a standby logs
  ``service.snapshot_request_ignored`` naming the holder instead. SIGHUP does *not* reload the
  configuration: it logs ``config.reload_unsupported`` saying to restart the unit.
* **Node identity** (cluster): when the process lease is lost (this incarnation was fenced),
  the snapshot in flight is cancelled at once, the bucket lease released, and ``run`` returns
  4 so that a restart makes a new incarnation.
* **systemd**: READY=1 once running, STATUS= on every state change, WATCHDOG=1 at half of
  ``WATCHDOG_USEC`` while the event loop is alive, STOPPING=1 as soon as a stop begins.

Log events (JSON fields in parentheses): ``service.started`` (instance_id, ...),
``service.standby`` (holder, holder_host, holder_pid, next_look_s), ``lease.acquired`` (from
:mod:`..lease.bucket`), ``snapshot.triggered`` (reason), ``snapshot.started`` /
``snapshot.completed`` (from :mod:`..snapshot.backup`), ``snapshot.abandoned`` /
``snapshot.failed`` (reason / error), ``service.lease_lost`` (reason), ``lease.released``,
``service.stopping``, ``service.stopped`` (exit_code), ``retention.applied`` (kept, forgotten)
/ ``retention.abandoned`` / ``retention.failed``.

After each successful snapshot the ``[retention]`` policy, when the config sets one, forgets the
snapshots it does not keep, through the same fence; ``prune`` stays its own command.

Not promised: an early retry of a failed snapshot (the next one is one interval after the
failed one started).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from .. import log
from ..clock import SYSTEM_CLOCK, Clock, run_until
from ..config import Settings
from ..errors import (
    EXIT_LEASE_LOST,
    FenceClosed,
    LeaseHeld,
    LeaseLost,
    MushroomError,
    StoreError,
)
from ..lease.bucket import BucketLease, LeaseView, LeaseWatch, read_lease, release_own_record
from ..lease.process.holder import ProcessLeaseHolder
from ..lease.record import new_instance_id
from ..snapshot.backup import SnapshotResult
from ..snapshot.catalog import read_latest
from ..snapshot.retention import RetentionPolicy, policy_from_settings
from ..store import ObjectStore, open_store
from . import metrics as metrics_module
from .notify import Notifier, watchdog_interval
from .triggers import Schedule, Triggers
from .writer import ClusterStamp, SnapshotRunner, lease_retry_interval, next_look

_log = log.get("agent.service")

T = TypeVar("T")

State = Literal["starting", "standby", "holding", "stopping"]

#: The longest pause between two acquire attempts while the store keeps failing.
MAX_STORE_BACKOFF_S = 300.0

_FENCE_STUCK = (
    "the write fence closed and no renewal was confirmed for a third of a TTL more (a renewal "
    "request is not answering); the lease is given up, as another instance may now take it"
)


def _fields(**fields: object) -> dict[str, dict[str, object]]:
    return {"fields": fields}


class Service:
    """The agent; see the module docstring. ``run()`` returns the process exit code.

    Test seams: ``clock`` (a :class:`~mushroom_backup.clock.FakeClock`), ``store`` (left open:
    it belongs to the caller), ``notifier`` (one that records), ``install_signal_handlers=False``
    (several services in one event loop; call :meth:`stop` and :meth:`request_snapshot`
    directly), and :attr:`state` ("starting", "standby", "holding", "stopping").
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        notifier: Notifier | None = None,
        store: ObjectStore | None = None,
        identity: ProcessLeaseHolder | None = None,
        stop_grace_s: float = 30.0,
        release_timeout_s: float = 10.0,
        install_signal_handlers: bool = True,
    ) -> None:
        self.settings = settings
        self.source = settings.require_source()
        self.clock = clock
        self.notifier = notifier or Notifier()
        self.metrics = metrics_module.Metrics()
        self.instance_id = new_instance_id()
        self.identity = identity
        #: The [retention] policy applied after each successful snapshot (None: keep all).
        self.retention = policy_from_settings(settings.retention)
        self.exit_code = 0
        self.stop_grace_s = stop_grace_s
        self.release_timeout_s = release_timeout_s
        self.install_signal_handlers = install_signal_handlers
        self.state: State = "starting"
        self._store = store
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._wake = asyncio.Event()
        self._runner: SnapshotRunner | None = None
        self._holder_seen: str | None = None
        schedule = settings.schedule
        self.triggers = Triggers(
            Schedule(schedule.interval_s, schedule.watch, schedule.debounce_s, schedule.min_gap_s)
        )
        self.last_snapshot: str | None = None

    # --- control (signal handlers, tests) ---------------------------------------------------

    def stop(self) -> None:
        """Stop taking snapshots, finish (within the grace) or cancel the one in flight,
        release the lease, return. A second call cancels the snapshot in flight at once."""
        if self._stopping.is_set():
            if not self._hurry.is_set():
                _log.warning(
                    "service.stop_hurried",
                    extra=_fields(reason="stopped again: the snapshot in flight is cancelled now"),
                )
            self._hurry.set()
            return
        _log.info("service.stopping", extra=_fields(instance_id=self.instance_id))
        self.notifier.stopping(
            "stopping: finishing or cancelling the snapshot in flight, then releasing the lease"
        )
        self.state = "stopping"
        self._stopping.set()
        self._wake.set()

    def request_snapshot(self) -> None:
        """SIGUSR1: a snapshot as soon as none is running -- while holding the lease. A
        standby cannot snapshot; it says who can."""
        if self.state != "holding":
            holder = self._holder_seen or "unknown"
            _log.warning(
                "service.snapshot_request_ignored",
                extra=_fields(
                    state=self.state,
                    holder=holder,
                    reason=f"this instance is in {self.state}, the lease is held by {holder}: "
                    "signal the holder instead (mushroom-backup lease status shows its host "
                    "and pid)",
                ),
            )
            return
        _log.info("service.snapshot_requested", extra=_fields(instance_id=self.instance_id))
        self.triggers.on_request()
        self._wake.set()

    def source_changed(self) -> None:
        self.triggers.on_change(self.clock.monotonic())
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # --- the main loop ---------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        handlers: list[signal.Signals] = []
        background: list[asyncio.Task[None]] = []
        server: asyncio.Server | None = None
        store: ObjectStore | None = self._store
        try:
            if self.install_signal_handlers:
                actions: dict[signal.Signals, Callable[[], None]] = {
                    signal.SIGTERM: self.stop,
                    signal.SIGINT: self.stop,
                    signal.SIGUSR1: self.request_snapshot,
                    signal.SIGHUP: self._reload_unsupported,
                }
                for sig, action in actions.items():
                    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                        loop.add_signal_handler(sig, action)
                        handlers.append(sig)
            if store is None:
                store = open_store(
                    self.settings.require_store(), conditional=self.settings.lease.conditional
                )
            if self.settings.metrics.listen:
                server = await metrics_module.serve(
                    self.metrics, self.settings.metrics.listen, self.clock
                )
                _log.info("metrics.listening", extra=_fields(listen=self.settings.metrics.listen))
            interval = watchdog_interval()
            if interval is not None:
                background.append(asyncio.create_task(self._watchdog(interval)))
            if self.settings.schedule.watch:
                background.append(asyncio.create_task(self._watch()))
            if self.identity is not None:
                background.append(asyncio.create_task(self._identity_watch(self.identity)))
            self.state = "standby"
            self.notifier.ready("standby: looking for the bucket lease")
            _log.info(
                "service.started",
                extra=_fields(
                    instance_id=self.instance_id,
                    store=store.url,
                    source=str(self.source),
                    ttl_s=self.settings.lease.ttl_s,
                    interval_s=self.settings.schedule.interval_s,
                    watch=self.settings.schedule.watch,
                ),
            )
            while not self.stopping:
                lease = await self._standby(store)
                if lease is None:
                    break
                await self._hold(store, lease)
            return self.exit_code
        finally:
            self.state = "stopping"
            if not self._stopping.is_set():
                self.notifier.stopping()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if server is not None:
                server.close()
                await server.wait_closed()
            if self._store is None and store is not None:
                await store.close()
            for sig in handlers:
                loop.remove_signal_handler(sig)
            self.notifier.close()
            _log.info(
                "service.stopped",
                extra=_fields(instance_id=self.instance_id, exit_code=self.exit_code),
            )

    def _reload_unsupported(self) -> None:
        _log.warning(
            "config.reload_unsupported",
            extra=_fields(
                reason="SIGHUP does not reload the configuration; restart the service to apply "
                "changes (systemctl restart mushroom-backup)"
            ),
        )

    async def _sleep_or_wake(self, until: float) -> None:
        """Sleep until ``until`` on the clock, or until something wakes the loop."""
        self._wake.clear()
        sleeper = asyncio.ensure_future(self.clock.sleep_until(until))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def _within(self, seconds: float, work: Awaitable[T]) -> T:
        """``await work``, cancelled after ``seconds`` on the clock (:class:`TimeoutError`)."""
        return await run_until(self.clock, self.clock.monotonic() + seconds, work)

    # --- standby ---------------------------------------------------------------------------

    async def _standby(self, store: ObjectStore) -> BucketLease | None:
        watch = LeaseWatch()
        failures = 0
        ttl_s = self.settings.lease.ttl_s
        self.state = "standby"
        while not self.stopping:
            try:
                lease = await self._acquire_unless_stopping(store, watch)
            except LeaseHeld as held:
                failures = 0
                view = await self._quiet_read(store)
                pause = self._standby_noted(held, view)
            except StoreError as error:
                failures += 1
                pause = min(
                    lease_retry_interval(ttl_s) * 2 ** min(failures, 8), MAX_STORE_BACKOFF_S
                )
                self.notifier.status(f"standby: store unavailable ({error.message})")
                _log.warning(
                    "service.store_unavailable",
                    extra=_fields(error=error.message, retry_in_s=round(pause, 1)),
                )
            except MushroomError as error:
                # PreconditionsIgnored and friends: no exclusion is possible; keep saying so.
                pause = max(lease_retry_interval(ttl_s), 60.0)
                self.notifier.status(f"standby: {error.message}")
                _log.error("service.cannot_acquire", extra=_fields(error=error.message))
            else:
                if lease is None:
                    return None
                self.metrics.lease_held = True
                self.metrics.exclusion = str(lease.exclusion)
                return lease
            await self._sleep_or_wake(self.clock.monotonic() + pause)
        return None

    async def _acquire_unless_stopping(
        self, store: ObjectStore, watch: LeaseWatch
    ) -> BucketLease | None:
        """One acquire attempt, abandoned if a stop arrives first (None). An abandoned attempt
        may have written a record naming us: it is handed back, within the release bound."""
        attempt = asyncio.ensure_future(
            BucketLease.acquire(
                store,
                ttl_s=self.settings.lease.ttl_s,
                instance_id=self.instance_id,
                watch=watch,
                clock=self.clock,
            )
        )
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({attempt, stopper}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        finally:
            stopper.cancel()
        if attempt.done():
            return attempt.result()
        attempt.cancel()
        await asyncio.wait({attempt})
        try:
            await self._within(self.release_timeout_s, release_own_record(store, self.instance_id))
        except (StoreError, TimeoutError) as error:
            _log.warning(
                "lease.release_failed",
                extra=_fields(error=str(error), expires_in_s=self.settings.lease.ttl_s),
            )
        return None

    def _standby_noted(self, held: LeaseHeld, view: LeaseView | None) -> float:
        """Log and report who holds the lease; return how long to wait before looking again."""
        record = view.record if view is not None else None
        if record is not None and record.instance_id != held.instance_id:
            record = None  # it changed between the two reads; name the one acquire saw
        host = record.host if record is not None else None
        pid = record.pid if record is not None else None
        pause = next_look(
            view if record is not None else None, self.settings.lease.ttl_s, self.clock.wall()
        )
        where = f" on {host}" if host else ""
        self.notifier.status(f"standby: lease held by {held.instance_id}{where}")
        fields = _fields(
            holder=held.instance_id, holder_host=host, holder_pid=pid, next_look_s=round(pause, 3)
        )
        if held.instance_id != self._holder_seen:
            _log.info("service.standby", extra=fields)
        else:
            _log.debug("service.standby", extra=fields)
        self._holder_seen = held.instance_id
        return pause

    async def _quiet_read(self, store: ObjectStore) -> LeaseView | None:
        try:
            return await read_lease(store)
        except StoreError:
            return None

    # --- holding ---------------------------------------------------------------------------

    async def _hold(self, store: ObjectStore, lease: BucketLease) -> None:
        lost: list[LeaseLost] = []

        def on_lost(error: LeaseLost) -> None:
            lost.append(error)
            self.metrics.renew_failures_total += 1
            if self._runner is not None:
                self._runner.lease_lost(error)
            self._wake.set()

        identity = self.identity
        runner = SnapshotRunner(
            store,
            lease,
            self.settings,
            self.clock,
            cluster=None
            if identity is None or identity.term is None
            else ClusterStamp(identity.node_id, str(identity.boot_incarnation), identity.term),
            extra_fence=identity,
            on_fence_closed=self._fence_closed,
        )
        self._runner = runner
        self._holder_seen = self.instance_id
        if not self.stopping:
            self.state = "holding"
        try:
            async with lease.keep_renewed(on_lost=on_lost):
                await self._seed_interval(store)
                self._status_holding()
                closed_since: float | None = None
                while not self.stopping and not lost and not lease.lost:
                    now = self.clock.monotonic()
                    fence = lease.write_deadline()
                    if fence is not None:
                        closed_since = None
                    elif closed_since is None:
                        closed_since = now
                    elif now - closed_since >= lease.renew_interval:
                        lease.mark_lost()
                        lost.append(LeaseLost(None, _FENCE_STUCK))
                        break
                    due = self.triggers.due(now)
                    if due.reason is None:
                        # Also wake when the fence would close, to notice a renewal that hangs.
                        wake = due.wake_at if fence is None else min(due.wake_at, fence)
                        if closed_since is not None:
                            wake = min(wake, closed_since + lease.renew_interval)
                        await self._sleep_or_wake(wake)
                        continue
                    await self._take_snapshot(runner, due.reason)
        finally:
            self._runner = None
            self.metrics.lease_held = False
            if not self.stopping:
                self.state = "standby"
            if lost or lease.lost:
                reason = lost[0].message if lost else "the bucket lease was lost"
                _log.warning(
                    "service.lease_lost",
                    extra=_fields(instance_id=self.instance_id, reason=reason),
                )
                self.notifier.status(f"standby: lost the lease ({reason})")
            else:
                await self._release(lease)

    async def _release(self, lease: BucketLease) -> None:
        try:
            await self._within(self.release_timeout_s, lease.release())
        except (StoreError, TimeoutError) as error:
            message = error.message if isinstance(error, StoreError) else str(error)
            _log.warning(
                "lease.release_failed",
                extra=_fields(error=message, expires_in_s=lease.ttl_s),
            )

    def _fence_closed(self) -> None:
        self.metrics.fence_closures_total += 1

    def _status_holding(self) -> None:
        last = f"; last snapshot {self.last_snapshot}" if self.last_snapshot else ""
        self.notifier.status(f"holding lease{last}")

    async def _seed_interval(self, store: ObjectStore) -> None:
        """Count the interval from the snapshot LATEST names, so a takeover does not snapshot
        at once when the previous holder just did."""
        try:
            info = await read_latest(store, sleep=self.clock.sleep)
        except MushroomError as error:
            _log.warning("service.latest_unreadable", extra=_fields(error=error.message))
            return
        if info is None:
            return
        created: datetime = info.created_at
        age = (self.clock.wall() - created).total_seconds()
        self.triggers.previous_snapshot_at(self.clock.monotonic() - max(0.0, age))
        self.last_snapshot = info.snapshot_id

    async def _take_snapshot(self, runner: SnapshotRunner, reason: str) -> None:
        started = self.clock.monotonic()
        self.triggers.started(started)
        self.notifier.status(f"holding lease; snapshot running ({reason})")
        _log.info("snapshot.triggered", extra=_fields(reason=reason))
        task = asyncio.create_task(runner.snapshot(self.source), name="service-snapshot")
        try:
            await self._until_done_or_stopped(task, runner)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            raise
        try:
            if task.cancelled():
                self._abandoned("the service is stopping: the snapshot was cancelled")
                return
            error = task.exception()
            if isinstance(error, LeaseLost | FenceClosed):
                self._abandoned(error.message)
            elif isinstance(error, MushroomError):
                self.metrics.snapshots_abandoned_total += 1
                _log.error("snapshot.failed", extra=_fields(error=error.message))
            elif error is not None:
                self.metrics.snapshots_abandoned_total += 1
                _log.error(
                    "snapshot.failed",
                    exc_info=error,
                    extra=_fields(error=f"unexpected {type(error).__name__}: {error}"),
                )
            else:
                self._completed(task.result(), started)
                if self.retention is not None and not self.stopping:
                    await self._forget(runner, self.retention)
        finally:
            if not self.stopping:
                self._status_holding()

    async def _forget(self, runner: SnapshotRunner, policy: RetentionPolicy) -> None:
        """The configured retention policy after a successful snapshot (forget only; prune is
        its own command). A failure is logged; the next snapshot tries again."""
        try:
            result = await runner.forget(policy)
        except (LeaseLost, FenceClosed) as error:
            _log.warning("retention.abandoned", extra=_fields(reason=error.message))
        except MushroomError as error:
            _log.error("retention.failed", extra=_fields(error=error.message))
        else:
            _log.info(
                "retention.applied",
                extra=_fields(kept=len(result.kept), forgotten=list(result.deleted)),
            )

    async def _until_done_or_stopped(
        self, task: asyncio.Task[SnapshotResult], runner: SnapshotRunner
    ) -> None:
        """Wait for the snapshot; on a stop, give it the grace period, then cancel it."""
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._stopping.wait())]
        try:
            await asyncio.wait({task, waiters[0]}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return
            _log.info(
                "snapshot.finishing",
                extra=_fields(grace_s=self.stop_grace_s, reason="the service is stopping"),
            )
            waiters.append(asyncio.ensure_future(self.clock.sleep(self.stop_grace_s)))
            waiters.append(asyncio.ensure_future(self._hurry.wait()))
            await asyncio.wait({task, *waiters[1:]}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                runner.cancel()
                task.cancel()
                await asyncio.wait({task})
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _abandoned(self, reason: str) -> None:
        self.metrics.snapshots_abandoned_total += 1
        _log.warning("snapshot.abandoned", extra=_fields(reason=reason))

    def _completed(self, result: SnapshotResult, started: float) -> None:
        # take_snapshot logged snapshot.completed with the details; here: metrics and status.
        self.metrics.snapshots_total += 1
        self.metrics.last_snapshot_wall = self.clock.wall().timestamp()
        self.metrics.last_snapshot_duration = self.clock.monotonic() - started
        self.metrics.bytes_uploaded_total += result.bytes_uploaded
        self.last_snapshot = result.snapshot_id

    # --- background helpers ----------------------------------------------------------------

    async def _identity_watch(self, identity: ProcessLeaseHolder) -> None:
        """A fenced incarnation is no longer node N: stop at once (exit 4) and let a restart
        make a new incarnation."""
        reason = await identity.wait_lost()
        _log.error(
            "process_lease.lost",
            extra=_fields(
                node=identity.node_id, incarnation=str(identity.boot_incarnation), reason=reason
            ),
        )
        self.exit_code = EXIT_LEASE_LOST
        if self._runner is not None:
            self._runner.cancel()
        self.stop()
        self._hurry.set()

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await self.clock.sleep(interval)

    async def _watch(self) -> None:
        import watchfiles

        source = Path(self.source)
        stop = asyncio.Event()

        async def stop_when_stopping() -> None:
            await self._stopping.wait()
            stop.set()

        stopper = asyncio.create_task(stop_when_stopping())
        try:
            async for _changes in watchfiles.awatch(
                source, stop_event=stop, debounce=200, step=50, recursive=True
            ):
                self.source_changed()
        except Exception as error:  # the watch is an optional trigger; the interval remains
            _log.error("watch.failed", extra=_fields(error=f"{type(error).__name__}: {error}"))
        finally:
            stopper.cancel()
