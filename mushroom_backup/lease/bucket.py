"""The bucket lease: an advisory, remote single-writer lock on a backup prefix.

One object, ``LEASE`` at the root of the backup prefix's store, names the instance that uploads
there (format and pure rules: :mod:`mushroom_backup.lease.record`). The holder renews it every
``ttl_s / 3`` and deletes it on shutdown. Another instance that finds a lease renewed less than
its ``ttl_s`` ago (by the reader's clock) uploads nothing; an older one may be taken over.

What it promises (a port of the Rust agent's ``bucket_lease.rs``; byte-compatible with it):

* **Acquire and renew are compare-and-swap where the service allows it.** Taking the lease is
  one conditional PUT -- create (``If-None-Match: *``) on an empty key, ``If-Match`` over a
  stale, unparseable or own record -- and so is every renewal. Two instances that start
  together get exactly one lease; a loser looks again, up to :data:`ACQUIRE_RACES` times, then
  reports the winner (:class:`~mushroom_backup.errors.LeaseHeld`). A holder whose lease was
  taken over learns it at its next renewal (:class:`~mushroom_backup.errors.LeaseLost`, naming
  the new holder), and a lost lease stays lost.
* **A request whose answer was lost is not a lost lease.** An instance keeps one id (and one
  :class:`LeaseWatch`) across attempts: a lease naming that id is taken back at once, and a
  renewal refused after an earlier renewal's answer was lost re-reads the lease, and if it
  still names us, swaps again against the version it found.
* **The probe.** After every conditional acquire the lease is written once more with
  ``If-None-Match: *`` and once with ``If-Match`` on a made-up ETag; both must be refused. If
  either is accepted the service ignores preconditions: acquire fails closed
  (:class:`~mushroom_backup.errors.PreconditionsIgnored`, naming the header and
  ``MUSHROOM_BACKUP_LEASE_CONDITIONAL=off``) and hands the prefix back.
* **The holder fences itself.** :meth:`BucketLease.write_deadline` is 2/3 of a TTL after the
  last confirmed renewal was *sent*, on the monotonic and the wall clock; nobody may take over
  before a full TTL, so a partitioned holder stops a third of a TTL before a takeover.
* **Clock skew** up to that third of a TTL (10 s at 30 s) is absorbed: a contender whose
  clock runs ahead sees the lease expire that much early, still not before the holder stopped.
  A holder whose clock runs ahead stamps the future, which counts as fresh; if it dies, the
  takeover is delayed by its skew.
* **Suspect records** (renewed more than their TTL in the future, or a TTL over an hour) are
  taken over only after they sat unchanged for one of our TTLs, with a warning.
* **Best-effort mode.** A store opened without conditional writes (``store.conditional`` is
  false: ``MUSHROOM_BACKUP_LEASE_CONDITIONAL=off``, or the Rust agent's
  ``MUSHROOMDB_BACKUP_LEASE_CONDITIONAL=off``) makes every step a read followed by an
  unconditional write, logs ``lease.best_effort`` at WARNING, and reports
  :attr:`Exclusion.BEST_EFFORT`. Exclusion is never weakened silently.
* **Release** deletes the record only if it still names us: ``DELETE`` with ``If-Match`` on the
  version we last wrote where the service honours it (``store.conditional_delete``), else a read
  followed by a delete. A lost lease, or one naming someone else, is left alone.
* Every renewal writes a new body (a fresh ``renewed_at``), so its ETag always changes.

Not promised: that two writers never overlap. This catches two machines configured with one
bucket; a stale holder's request already received by the service still completes (DESIGN.md,
"What a stale writer can still do").

All timing comes from the injected :class:`~mushroom_backup.clock.Clock`; decisions are the pure
functions of :mod:`.record`. Logs go to ``mushroom_backup.lease`` (events ``lease.*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Final

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import (
    ConditionalWritesUnsupported,
    LeaseHeld,
    LeaseLost,
    NotFound,
    PreconditionFailed,
    PreconditionsIgnored,
    StoreError,
    UsageError,
)
from ..retry import retrying
from ..store.base import CREATE, OVERWRITE, ObjectStore, PutMode, Update, Version
from .record import (
    ACQUIRE_RACES,
    MAX_SANE_TTL_S,
    PROBE_ETAG,
    Exclusion,
    LeaseCondition,
    LeaseRecord,
    LeaseState,
    LeaseView,
    LeaseWatch,
    Verdict,
    decode_record,
    describe,
    format_rfc3339,
    judge_foreign,
    new_instance_id,
    parse_rfc3339,
    probe_verdict,
    write_deadline,
)

# The record module's public names are re-exported: callers need only this module.
__all__ = [
    "LEASE_KEY",
    "BucketLease",
    "Exclusion",
    "LeaseCondition",
    "LeaseRecord",
    "LeaseState",
    "LeaseView",
    "LeaseWatch",
    "describe",
    "new_instance_id",
    "read_lease",
    "release_own_record",
]

#: The lease object's key, relative to the store's root (the backup prefix).
LEASE_KEY: Final = "LEASE"

logger = logging.getLogger("mushroom_backup.lease")

#: Renewal attempts are bounded by the write fence, not by a count.
_UNBOUNDED = 1_000_000


class _Auto(enum.Enum):
    AUTO = "auto"


#: Default for ``host`` / ``pid``: this machine's host name, this process's id.
AUTO: Final = _Auto.AUTO


def _log(level: int, event: str, **fields: object) -> None:
    logger.log(level, event, extra={"fields": fields})


async def read_lease(store: ObjectStore) -> LeaseView | None:
    """The ``LEASE`` object as it is now, parsed when it parses; None when there is none.

    Never raises for a garbage object (its :attr:`LeaseView.error` says what is wrong); raises
    :class:`~mushroom_backup.errors.StoreError` when the store fails the read.
    """
    try:
        found = await store.get(LEASE_KEY)
    except NotFound:
        return None
    try:
        record: LeaseRecord | None = decode_record(found.data)
        error = None
    except ValueError as problem:
        record, error = None, str(problem)
    return LeaseView(record, error, found.version, len(found.data))


async def release_own_record(store: ObjectStore, instance_id: str) -> bool:
    """Delete the ``LEASE`` object if it names ``instance_id``; True when it was deleted.

    For a caller whose acquire failed or was cancelled after its write may have landed. The
    delete is conditional on the version read where the store honours conditional deletes;
    elsewhere the read and the delete are two requests, and a takeover landing between them
    would be deleted (its holder rewrites it at its next renewal).
    """
    view = await read_lease(store)
    if view is None or view.record is None or view.record.instance_id != instance_id:
        return False
    try:
        if store.conditional and store.conditional_delete:
            await store.delete(LEASE_KEY, if_match=view.version)
        else:
            await store.delete(LEASE_KEY)
    except NotFound:
        return False
    except PreconditionFailed:
        # It changed since we read it: a takeover landed in between. Leave it alone.
        return False
    return True


class BucketLease:
    """A held lease on the store's ``LEASE``. Make one with :meth:`acquire`; see the module
    docstring for what it promises. Satisfies :class:`~mushroom_backup.lease.fenced.Fence`."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        record: LeaseRecord,
        version: Version,
        confirmed_mono: float,
        confirmed_wall: datetime,
        exclusion: Exclusion,
        clock: Clock,
    ) -> None:
        """Internal: use :meth:`acquire`."""
        self._store = store
        self._clock = clock
        self._record = record
        self._version = version
        self._confirmed_mono = confirmed_mono
        self._confirmed_wall = confirmed_wall
        self._exclusion = exclusion
        self._lost = False
        self._lost_to: str | None = None
        self._released = False
        # Renewals and the release never overlap: a renewal landing after the release would
        # put the record back.
        self._io = asyncio.Lock()

    # --- taking the lease -----------------------------------------------------------------

    @classmethod
    async def acquire(
        cls,
        store: ObjectStore,
        *,
        ttl_s: int = 30,
        instance_id: str | None = None,
        watch: LeaseWatch | None = None,
        clock: Clock = SYSTEM_CLOCK,
        host: str | _Auto | None = AUTO,
        pid: int | _Auto | None = AUTO,
    ) -> BucketLease:
        """Take the lease for ``ttl_s`` seconds (0 counts as 1) as ``instance_id`` (default: a
        new random id).

        Pass the same ``instance_id`` and ``watch`` to every attempt of one instance: a lease
        already naming the id (an attempt whose answer was lost) is taken back at once, and the
        watch lets a suspect foreign lease be taken over once it sat unchanged for a TTL.

        Raises :class:`~mushroom_backup.errors.LeaseHeld` when another instance holds a fresh
        lease or won the race for it; :class:`~mushroom_backup.errors.PreconditionsIgnored`
        when the service ignores a precondition (the prefix is handed back);
        :class:`~mushroom_backup.errors.StoreError` when the service fails a request (try
        again with the same id); :class:`~mushroom_backup.errors.UsageError` for a TTL over
        :data:`~mushroom_backup.lease.record.MAX_SANE_TTL_S` (every other agent would find
        such a lease suspect) or below zero.
        """
        if ttl_s < 0 or ttl_s > MAX_SANE_TTL_S:
            raise UsageError(
                f"lease TTL {ttl_s} s is out of range: use 1 to {MAX_SANE_TTL_S} seconds"
            )
        ttl_s = max(1, ttl_s)
        me = instance_id or new_instance_id()
        watch = watch if watch is not None else LeaseWatch()
        our_host = socket.gethostname() if isinstance(host, _Auto) else host
        our_pid = os.getpid() if isinstance(pid, _Auto) else pid

        for race in range(1, ACQUIRE_RACES + 1):
            current = await read_lease(store)
            took_from = _judge(current, me, ttl_s, watch, clock, store.url)

            confirmed_mono, confirmed_wall = clock.monotonic(), clock.wall()
            stamp = format_rfc3339(confirmed_wall)
            record = LeaseRecord(me, stamp, stamp, ttl_s, our_host, our_pid)
            body = record.encode()
            mode: PutMode = CREATE if current is None else Update(current.version)
            exclusion = Exclusion.CONDITIONAL
            try:
                version = await store.put(LEASE_KEY, body, mode)
            except (PreconditionFailed, NotFound):
                # Someone wrote (or deleted) the key between our read and our write.
                _log(logging.INFO, "lease.race_lost", race=race, of=ACQUIRE_RACES)
                continue
            except ConditionalWritesUnsupported:
                exclusion = Exclusion.BEST_EFFORT
                _log(
                    logging.WARNING,
                    "lease.best_effort",
                    store=store.url,
                    reason="conditional writes are switched off; the lease is read, then "
                    "written, and two writers may overlap until the next renewal",
                )
                version = await store.put(LEASE_KEY, body, OVERWRITE)

            lease = cls(
                store,
                record=record,
                version=version,
                confirmed_mono=confirmed_mono,
                confirmed_wall=confirmed_wall,
                exclusion=exclusion,
                clock=clock,
            )
            if exclusion is Exclusion.CONDITIONAL:
                try:
                    await lease._probe(body)
                except (PreconditionsIgnored, StoreError) as error:
                    # Hand the prefix back: either this lease excludes nobody, or we cannot
                    # tell. A failed hand-back expires with the TTL.
                    lease._lost = True
                    with contextlib.suppress(StoreError):
                        await release_own_record(store, me)
                    if isinstance(error, PreconditionsIgnored):
                        _log(
                            logging.ERROR,
                            "lease.preconditions_ignored",
                            store=store.url,
                            header=error.header,
                        )
                    raise
            watch.seen = None
            _log(
                logging.INFO,
                "lease.acquired",
                instance_id=me,
                ttl_s=ttl_s,
                exclusion=str(lease.exclusion),
                taken_from=took_from,
                store=store.url,
            )
            return lease

        # Lost every race: whoever won holds it now.
        view = await read_lease(store)
        holder = view.record.instance_id if view is not None and view.record else "unknown"
        raise LeaseHeld(holder)

    async def _probe(self, body: bytes) -> None:
        """Check that the service refuses both preconditions: a create over the existing
        lease, and an update against an ETag it never issued."""
        for mode, header in (
            (CREATE, "If-None-Match"),
            (Update(Version(PROBE_ETAG)), "If-Match"),
        ):
            answer: Version | StoreError
            try:
                answer = await self._store.put(LEASE_KEY, body, mode)
            except StoreError as refused:
                answer = refused
            if probe_verdict(answer, header) is Exclusion.BEST_EFFORT:
                self._degrade(f"the client cannot send {header}")

    def _degrade(self, reason: str) -> None:
        if self._exclusion is Exclusion.BEST_EFFORT:
            return
        self._exclusion = Exclusion.BEST_EFFORT
        _log(logging.WARNING, "lease.best_effort", store=self._store.url, reason=reason)

    # --- what the holder may do -----------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """This process's instance id, as the ``LEASE`` object names it."""
        return self._record.instance_id

    @property
    def ttl_s(self) -> int:
        """The TTL this lease was taken with, in seconds."""
        return self._record.ttl_s

    @property
    def renew_interval(self) -> float:
        """How often to :meth:`renew`, in seconds: a third of the TTL."""
        return self._record.ttl_s / 3

    @property
    def exclusion(self) -> Exclusion:
        """How strongly this lease excludes a second writer on this service."""
        return self._exclusion

    @property
    def lost(self) -> bool:
        """Whether the lease was found replaced or deleted, marked lost, or released. Final."""
        return self._lost

    @property
    def record(self) -> LeaseRecord:
        """The record this holder last wrote and saw confirmed."""
        return self._record

    @property
    def version(self) -> Version:
        """The version of the ``LEASE`` object our last confirmed write produced."""
        return self._version

    def mark_lost(self, holder: str | None = None) -> None:
        """Give the lease up without a request: a write elsewhere (a refused ``LATEST`` swap)
        showed that another writer is active. Closes the fence at once; final."""
        if not self._lost:
            _log(logging.WARNING, "lease.lost", instance_id=self.instance_id, holder=holder)
        self._lost = True
        self._lost_to = self._lost_to or holder

    def write_deadline(self) -> float | None:
        """The monotonic moment (on the injected clock) after which this holder must not start
        a write: 2/3 of a TTL after its last confirmed renewal was sent. None once the lease is
        lost or released, or that moment has passed on either clock."""
        return write_deadline(
            confirmed_mono=self._confirmed_mono,
            confirmed_wall=self._confirmed_wall,
            ttl_s=self._record.ttl_s,
            now_mono=self._clock.monotonic(),
            now_wall=self._clock.wall(),
            lost=self._lost,
        )

    def may_write(self) -> bool:
        """Whether this holder may start a write now."""
        return self.write_deadline() is not None

    # --- renewing -------------------------------------------------------------------------

    async def renew(self) -> None:
        """Extend the lease: rewrite it with a new ``renewed_at``, provided it is still ours.

        Raises :class:`~mushroom_backup.errors.LeaseLost` (naming the new holder when there is
        one) when the object was replaced or deleted since our last write -- the lease is then
        lost for good; :class:`~mushroom_backup.errors.StoreError` when the service fails a
        request (try again; the fence keeps the holder safe meanwhile).
        """
        async with self._io:
            self._check_held()
            confirmed_mono, confirmed_wall = self._clock.monotonic(), self._clock.wall()
            record = _restamped(self._record, confirmed_wall)
            if self._exclusion is Exclusion.CONDITIONAL:
                try:
                    version = await self._store.put(
                        LEASE_KEY, record.encode(), Update(self._version)
                    )
                except ConditionalWritesUnsupported:
                    self._degrade("conditional writes are switched off")
                    version = await self._renew_best_effort(record)
                except (PreconditionFailed, NotFound):
                    version = await self._reconcile(record)
            else:
                version = await self._renew_best_effort(record)
            self._record = record
            self._version = version
            self._confirmed_mono, self._confirmed_wall = confirmed_mono, confirmed_wall
        _log(
            logging.DEBUG,
            "lease.renewed",
            instance_id=self.instance_id,
            renewed_at=record.renewed_at,
            version=str(version),
        )

    def _check_held(self) -> None:
        if self._released:
            raise LeaseLost(
                None, "the bucket lease was released by this instance; acquire a new one"
            )
        if self._lost:
            raise LeaseLost(self._lost_to)

    async def _reconcile(self, record: LeaseRecord) -> Version:
        """A compare-and-swap was refused. If the lease still names us, a write of ours landed
        though its answer was lost: adopt the version it left and swap again. Otherwise the
        lease is lost."""
        view = await read_lease(self._store)
        if view is None or view.record is None or view.record.instance_id != self.instance_id:
            raise self._lose(view)
        # The landed write may carry this very stamp: make sure the body changes.
        record = _restamped(record, self._clock.wall(), after=view.record.renewed_at)
        _log(
            logging.INFO,
            "lease.reconciled",
            instance_id=self.instance_id,
            found=str(view.version),
            expected=str(self._version),
        )
        try:
            return await self._store.put(LEASE_KEY, record.encode(), Update(view.version))
        except (PreconditionFailed, NotFound):
            raise self._lose(await _read_quietly(self._store)) from None

    async def _renew_best_effort(self, record: LeaseRecord) -> Version:
        """Read the lease and rewrite it only if it still names us."""
        view = await read_lease(self._store)
        if view is None or view.record is None or view.record.instance_id != self.instance_id:
            raise self._lose(view)
        return await self._store.put(LEASE_KEY, record.encode(), OVERWRITE)

    def _lose(self, view: LeaseView | None) -> LeaseLost:
        holder = view.record.instance_id if view is not None and view.record else None
        if holder == self.instance_id:
            holder = None
        self.mark_lost(holder)
        return LeaseLost(holder)

    # --- the renewal loop -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def keep_renewed(
        self, on_lost: Callable[[LeaseLost], object] | None = None
    ) -> AsyncIterator[BucketLease]:
        """Renew the lease in the background while the block runs.

        Renews every :attr:`renew_interval` after the last confirmed renewal, on the injected
        clock. A renewal that fails in a way retrying may fix (a retryable
        :class:`~mushroom_backup.errors.StoreError`) is retried through
        :func:`mushroom_backup.retry.retrying` -- jittered, growing pauses -- while the write
        fence is open, the last attempt as it closes. When the lease is lost, the fence closed
        without a confirmed renewal, or the error is not retryable, the lease is marked lost,
        ``on_lost`` (plain or async) is called once with a
        :class:`~mushroom_backup.errors.LeaseLost` saying why, and the loop stops. A lease
        marked lost by someone else stops the loop without a call. Leaving the block stops the
        loop (cancelling a renewal in flight); it does not release the lease.
        """
        task = asyncio.create_task(
            self._renew_loop(on_lost), name=f"lease-renewer-{self.instance_id[:8]}"
        )
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.wait({task})

    async def _renew_loop(self, on_lost: Callable[[LeaseLost], object] | None) -> None:
        try:
            while True:
                await self._clock.sleep_until(self._confirmed_mono + self.renew_interval)
                if self._lost:
                    return
                try:
                    await retrying(
                        self._renew_once,
                        what=f"renew {LEASE_KEY}",
                        attempts=_UNBOUNDED,  # the fence bounds it, below
                        first_delay=self.renew_interval / 10,
                        max_delay=self.renew_interval,
                        while_open=self.may_write,
                        sleep=self._pause_within_fence,
                    )
                except LeaseLost as lost:
                    await _call_on_lost(on_lost, lost)
                    return
                except StoreError as error:
                    if self._lost:
                        return  # marked lost meanwhile: whoever did it knows
                    why = (
                        "before its write fence closed"
                        if not self.may_write()
                        else "(the error is not one that retrying fixes)"
                    )
                    self.mark_lost()
                    await _call_on_lost(
                        on_lost,
                        LeaseLost(
                            None,
                            f"the bucket lease could not be renewed {why}: {error.message}; "
                            "this holder stopped writing",
                        ),
                    )
                    return
        except Exception as error:
            # A bug, not a store failure: fail closed rather than write without renewing.
            logger.exception(
                "lease.renew_loop_failed", extra={"fields": {"instance_id": self.instance_id}}
            )
            self.mark_lost()
            await _call_on_lost(
                on_lost,
                LeaseLost(None, f"the lease renewer failed ({type(error).__name__}: {error})"),
            )

    async def _renew_once(self) -> None:
        try:
            await self.renew()
        except StoreError as error:
            _log(
                logging.WARNING,
                "lease.renew_failed",
                instance_id=self.instance_id,
                retryable=error.retryable,
                fence_open=self.may_write(),
                error=error.message,
            )
            raise

    async def _pause_within_fence(self, seconds: float) -> None:
        """Sleep between renewal attempts, but never past the write deadline: the last attempt
        is made as the fence closes."""
        deadline = self.write_deadline()
        if deadline is None:
            await self._clock.sleep(0.0)
        elif self._clock.monotonic() + seconds >= deadline:
            await self._clock.sleep_until(deadline)
        else:
            await self._clock.sleep(seconds)

    # --- giving it up ---------------------------------------------------------------------

    async def release(self) -> None:
        """Give the lease up: delete ``LEASE`` if it still names us. A lost lease, or one that
        another instance now holds, is left alone. The fence closes at once, whatever happens.

        Raises :class:`~mushroom_backup.errors.StoreError` when the service fails a request;
        the lease then expires by itself after its TTL.
        """
        async with self._io:
            if self._lost:
                _log(logging.DEBUG, "lease.release_skipped", instance_id=self.instance_id)
                return
            self._lost = self._released = True
            store = self._store
            if (
                self._exclusion is Exclusion.CONDITIONAL
                and store.conditional
                and store.conditional_delete
            ):
                try:
                    await store.delete(LEASE_KEY, if_match=self._version)
                except NotFound:
                    _log(logging.INFO, "lease.released", instance_id=self.instance_id, gone=True)
                    return
                except (PreconditionFailed, ConditionalWritesUnsupported):
                    # Not the version we last wrote: a renewal whose answer was lost, or a
                    # takeover. Look, and delete only our own.
                    pass
                else:
                    _log(logging.INFO, "lease.released", instance_id=self.instance_id)
                    return
            deleted = await release_own_record(store, self.instance_id)
            _log(
                logging.INFO if deleted else logging.WARNING,
                "lease.released" if deleted else "lease.release_skipped",
                instance_id=self.instance_id,
                reason=None if deleted else "the lease no longer names this instance",
            )


def _judge(
    current: LeaseView | None,
    me: str,
    our_ttl_s: int,
    watch: LeaseWatch,
    clock: Clock,
    store_url: str,
) -> str | None:
    """Decide about the record we read (raising LeaseHeld when it keeps us out) and log it.
    Returns the instance id we are about to take the lease from, if any."""
    if current is None:
        return None
    record = current.record
    if record is None:
        _log(
            logging.WARNING,
            "lease.unparseable_takeover",
            store=store_url,
            size=current.size,
            error=current.error,
        )
        return None
    if record.instance_id == me:
        return None
    verdict, watch.seen = judge_foreign(
        record,
        current.version,
        our_ttl_s=our_ttl_s,
        seen=watch.seen,
        now_wall=clock.wall(),
        now_mono=clock.monotonic(),
    )
    fields = {
        "holder": record.instance_id,
        "renewed_at": record.renewed_at,
        "ttl_s": record.ttl_s,
        "store": store_url,
    }
    if verdict is Verdict.TAKE_OVER_STALE:
        _log(logging.INFO, "lease.stale_takeover", **fields)
    elif verdict is Verdict.TAKE_OVER_SUSPECT:
        _log(logging.WARNING, "lease.suspect_takeover", unchanged_for_s=our_ttl_s, **fields)
    elif verdict is Verdict.SUSPECT_NOTICED:
        _log(logging.WARNING, "lease.suspect_noticed", wait_s=our_ttl_s, **fields)
    if not verdict.blocks:
        return record.instance_id
    if verdict is Verdict.BLOCKED:
        raise LeaseHeld(record.instance_id)
    assert watch.seen is not None
    wait = max(0.0, watch.seen.since + our_ttl_s - clock.monotonic())
    raise LeaseHeld(
        record.instance_id,
        f"the backup prefix's lease is held by {record.instance_id}, but it is suspect "
        f"(renewed_at {record.renewed_at}, ttl_s {record.ttl_s}): it is taken over if it "
        f"stays unchanged for {wait:.0f} s more; retry with the same instance, or use "
        "--wait-lease SECONDS",
    )


def _restamped(record: LeaseRecord, wall: datetime, *, after: str | None = None) -> LeaseRecord:
    """``record`` renewed at ``wall``, with a stamp later than ``after`` (default: the record's
    own ``renewed_at``), so that the body -- and with it the ETag -- always changes.

    Within one clock tick, or after the wall clock stepped back by less than a TTL, the stamp
    is the previous one plus a microsecond: never more than a TTL ahead of our clock, so the
    record never looks suspect. After a larger step back the stamp follows the clock.
    """
    previous = record.renewed_at if after is None else after
    stamp = format_rfc3339(wall)
    try:
        last = parse_rfc3339(previous)
    except ValueError:
        last = None
    if last is not None and wall <= last <= wall + timedelta(seconds=record.ttl_s):
        stamp = format_rfc3339(last + timedelta(microseconds=1))
    return LeaseRecord(
        record.instance_id, record.acquired_at, stamp, record.ttl_s, record.host, record.pid
    )


async def _read_quietly(store: ObjectStore) -> LeaseView | None:
    try:
        return await read_lease(store)
    except StoreError:
        return None


async def _call_on_lost(on_lost: Callable[[LeaseLost], object] | None, lost: LeaseLost) -> None:
    if on_lost is None:
        return
    try:
        result = on_lost(lost)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("lease.on_lost_failed", extra={"fields": {"error": lost.message}})
