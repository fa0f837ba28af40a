"""``mushroom-backup run``: the long-running agent, one per database host.

Life cycle::

    start ──► standby ──(lease acquired)──► holding ──(lease lost)──► standby ...
                 ▲                             │
                 └──────── (SIGTERM/SIGINT) ───┴──► stopping: cancel or finish the snapshot in
                                                    flight within ``stop_grace_s``, release the
                                                    lease, STOPPING=1, exit 0

* **Standby**: while another instance holds a fresh lease, log who (instance id and host when
  the record has them) and look again every :func:`~.writer.lease_retry_interval` -- a third of
  the TTL, 1..10 s -- so a dead holder is replaced within one TTL plus one retry interval.
  Store failures are logged and retried with growing pauses.
* **Holding**: the lease is renewed every ttl/3 in the background (transient failures retried
  only while the fence is open). Snapshots run when :class:`~.triggers.Triggers` says so: on
  the interval (counted from the snapshot ``LATEST`` names, so a new holder does not snapshot
  at once), after watched changes settle, or on SIGUSR1. A lost lease cancels the snapshot in
  flight (``LATEST`` untouched) and the service goes back to standby -- it never exits for a
  lost lease.
* **Signals**: SIGTERM/SIGINT stop; SIGUSR1 requests a snapshot now; SIGHUP does *not* reload
  the configuration -- it logs ``config.reload_unsupported`` saying to restart the unit.
* **systemd**: READY=1 once running, STATUS= on every state change, WATCHDOG=1 at half of
  ``WATCHDOG_USEC`` while the event loop is alive, STOPPING=1 on shutdown.

Not promised: retention after each snapshot (``forget`` is its own command for now).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from .. import log
from ..clock import SYSTEM_CLOCK, Clock
from ..config import Settings
from ..errors import (
    EXIT_LEASE_LOST,
    FenceClosed,
    LeaseHeld,
    LeaseLost,
    MushroomError,
    StoreError,
)
from ..lease.bucket import BucketLease, LeaseView, read_lease
from ..lease.process.holder import ProcessLeaseHolder
from ..lease.record import LeaseWatch, new_instance_id
from ..snapshot.catalog import read_latest
from ..store import ObjectStore, open_store
from . import metrics as metrics_module
from .notify import Notifier, watchdog_interval
from .triggers import Schedule, Triggers
from .writer import ClusterStamp, SnapshotRunner, lease_retry_interval

_log = log.get("agent.service")


def _fields(**fields: object) -> dict[str, dict[str, object]]:
    return {"fields": fields}


class Service:
    """The agent; see the module docstring. ``run()`` returns the process exit code."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        notifier: Notifier | None = None,
        store: ObjectStore | None = None,
        identity: ProcessLeaseHolder | None = None,
        stop_grace_s: float = 30.0,
    ) -> None:
        self.settings = settings
        self.source = settings.require_source()
        self.clock = clock
        self.notifier = notifier or Notifier()
        self.metrics = metrics_module.Metrics()
        self.instance_id = new_instance_id()
        self.identity = identity
        self.exit_code = 0
        self.stop_grace_s = stop_grace_s
        self._store = store
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._runner: SnapshotRunner | None = None
        schedule = settings.schedule
        self.triggers = Triggers(
            Schedule(schedule.interval_s, schedule.watch, schedule.debounce_s, schedule.min_gap_s)
        )
        self.last_snapshot: str | None = None

    # --- control (signal handlers, tests) ---------------------------------------------------

    def stop(self) -> None:
        """Stop taking snapshots, finish or cancel the one in flight, release, exit."""
        if not self._stopping.is_set():
            _log.info("service.stopping", extra=_fields(instance_id=self.instance_id))
        self._stopping.set()
        self._wake.set()

    def request_snapshot(self) -> None:
        """SIGUSR1: a snapshot as soon as none is running."""
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
        store = self._store or open_store(
            self.settings.require_store(), conditional=self.settings.lease.conditional
        )
        background: list[asyncio.Task[None]] = []
        server: asyncio.Server | None = None
        try:
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
            self.notifier.stopping()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if server is not None:
                server.close()
                await server.wait_closed()
            if self._store is None:
                await store.close()
            for sig in handlers:
                loop.remove_signal_handler(sig)
            self.notifier.close()
            _log.info("service.stopped", extra=_fields(instance_id=self.instance_id))

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

    # --- standby ---------------------------------------------------------------------------

    async def _standby(self, store: ObjectStore) -> BucketLease | None:
        watch = LeaseWatch()
        failures = 0
        ttl_s = self.settings.lease.ttl_s
        while not self.stopping:
            try:
                lease = await BucketLease.acquire(
                    store,
                    ttl_s=ttl_s,
                    instance_id=self.instance_id,
                    watch=watch,
                    clock=self.clock,
                )
            except LeaseHeld as held:
                failures = 0
                view = await self._quiet_read(store)
                host = view.record.host if view is not None and view.record else None
                where = f" on {host}" if host else ""
                self.notifier.status(f"standby: lease held by {held.instance_id}{where}")
                _log.info(
                    "service.standby",
                    extra=_fields(holder=held.instance_id, holder_host=host),
                )
                pause = lease_retry_interval(ttl_s)
            except StoreError as error:
                failures += 1
                pause = min(lease_retry_interval(ttl_s) * 2 ** min(failures, 5), 300.0)
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
                self.metrics.lease_held = True
                self.metrics.exclusion = str(lease.exclusion)
                return lease
            await self._sleep_or_wake(self.clock.monotonic() + pause)
        return None

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
        try:
            async with lease.keep_renewed(on_lost=on_lost):
                await self._seed_interval(store)
                self._status_holding()
                while not self.stopping and not lost and not lease.lost:
                    due = self.triggers.due(self.clock.monotonic())
                    if due.reason is None:
                        await self._sleep_or_wake(due.wake_at)
                        continue
                    await self._take_snapshot(runner, due.reason)
        finally:
            self._runner = None
            self.metrics.lease_held = False
            if lost or lease.lost:
                reason = lost[0].message if lost else "the bucket lease was lost"
                _log.warning(
                    "service.lease_lost",
                    extra=_fields(instance_id=self.instance_id, reason=reason),
                )
                self.notifier.status(f"standby: lost the lease ({reason})")
            else:
                try:
                    await lease.release()
                except StoreError as error:
                    _log.warning(
                        "lease.release_failed",
                        extra=_fields(error=error.message, expires_in_s=lease.ttl_s),
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
        except (StoreError, MushroomError) as error:
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
        _log.info("snapshot.started", extra=_fields(reason=reason))
        task = asyncio.create_task(runner.snapshot(self.source))
        stop_waiter = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                # Stopping: give the snapshot a bounded grace period, then cancel it.
                grace = asyncio.ensure_future(
                    self.clock.sleep_until(self.clock.monotonic() + self.stop_grace_s)
                )
                await asyncio.wait({task, grace}, return_when=asyncio.FIRST_COMPLETED)
                grace.cancel()
                if not task.done():
                    runner.cancel()
                    task.cancel()
            result = await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            self.metrics.snapshots_abandoned_total += 1
            _log.warning("snapshot.abandoned", extra=_fields(reason="service stopping"))
        except (LeaseLost, FenceClosed) as error:
            self.metrics.snapshots_abandoned_total += 1
            _log.warning("snapshot.abandoned", extra=_fields(reason=error.message))
        except MushroomError as error:
            self.metrics.snapshots_abandoned_total += 1
            _log.error("snapshot.failed", extra=_fields(error=error.message))
        else:
            self.metrics.snapshots_total += 1
            self.metrics.last_snapshot_wall = self.clock.wall().timestamp()
            self.metrics.last_snapshot_duration = self.clock.monotonic() - started
            self.metrics.bytes_uploaded_total += result.bytes_uploaded
            self.last_snapshot = result.snapshot_id
            _log.info(
                "snapshot.completed",
                extra=_fields(
                    snapshot_id=result.snapshot_id,
                    files=result.files,
                    bytes_scanned=result.bytes_scanned,
                    bytes_uploaded=result.bytes_uploaded,
                    duration_s=round(self.clock.monotonic() - started, 3),
                ),
            )
        finally:
            stop_waiter.cancel()
            if not self.stopping:
                self._status_holding()

    # --- background helpers ----------------------------------------------------------------

    async def _identity_watch(self, identity: ProcessLeaseHolder) -> None:
        """A fenced incarnation is no longer node N: stop (exit 4) and let a restart make a new
        incarnation."""
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
