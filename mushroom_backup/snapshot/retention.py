"""Retention: which snapshots a policy keeps (a pure rule), and ``forget``, which deletes the
manifests of the others.

The rule (:func:`plan_retention`) is a plain function of the snapshot list, the policy, the
snapshot ``LATEST`` names and an explicit ``now``; only :func:`apply_retention` does I/O.

Semantics (restic's, which users know; borg's differ only in the details noted)
-------------------------------------------------------------------------------
Snapshots are ordered newest first by ``created_at`` (the UTC start time in the manifest
header); two with the same ``created_at`` are ordered by snapshot id, the greater one counting
as newer. Then, each rule on its own:

* ``last N`` -- the N newest snapshots.
* ``hourly/daily/weekly/monthly/yearly N`` -- walking newest to oldest, a snapshot is kept when
  its *bucket* (the hour, day, ISO week, month or year it was taken in) differs from the bucket
  of the previous snapshot this rule kept, until N snapshots were kept: the newest snapshot of
  each of the N most recent buckets *that have snapshots*. Buckets without a snapshot are
  skipped, not counted (a week without backups does not use up a ``daily``).
* ``within D`` -- every snapshot taken at most D before ``now`` (``created_at >= now - D``;
  a snapshot stamped in the future counts as within). Unlike restic, whose ``--keep-within``
  counts back from the newest snapshot, D counts back from ``now``, as in borg: if backups stop,
  ``within`` stops keeping the old ones, and the other rules (and ``LATEST``) still do.
* The snapshot ``LATEST`` names is always kept (reason ``latest``), whatever the policy.

A snapshot is kept if any rule keeps it; :class:`Decision.reasons` lists every rule that did
(``last``, ``hourly``, ``daily``, ``weekly``, ``monthly``, ``yearly``, ``within``, ``latest``). A
snapshot one rule keeps still uses up a count of every other bucket rule that keeps it, as in
restic.

**Time zone.** Buckets are cut in **UTC**, not local time: a "day" is a UTC calendar day, a
"week" an ISO 8601 week (Monday to Sunday, numbered within its ISO year, so 2026-12-31 and
2027-01-01 can share week 2026-W53), a "month" a UTC calendar month. There is no daylight saving
time in UTC, so no bucket is 23 or 25 hours long and no hour happens twice. A host in UTC+2 whose
backup runs at 01:00 local time files it under the previous UTC day.

A policy with no rule set is refused (:class:`~mushroom_backup.errors.UsageError`): "keep
nothing" is never a default.

Deleting (:func:`apply_retention`)
----------------------------------
Only manifests are deleted (``prune`` removes the data no remaining manifest uses). The caller
holds the bucket lease and passes a :class:`~mushroom_backup.lease.fenced.FencedStore`, so
every delete starts only while the write deadline holds. Right before each delete ``LATEST`` is
read again: a snapshot it names now is kept, whatever the plan said. Deletes are idempotent, so
a retryable failure is retried; a manifest that is already gone counts as deleted.

:func:`forget_snapshots` forgets snapshots named by id instead of by a policy (never the one
``LATEST`` names); their manifests need not be readable, so this is how a damaged one goes.

Not promised: grouping by host or path (a prefix holds one agent's snapshots; the policy applies
to all of them together), ``unlimited`` counts, or keeping tags.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from ..clock import Clock
from ..errors import IntegrityError, NotFound, UsageError
from ..retry import retrying
from ..store.base import ObjectStore
from .catalog import list_snapshots, read_latest
from .ids import is_snapshot_id
from .manifest import manifest_key

if TYPE_CHECKING:
    from ..config import RetentionSettings

log = logging.getLogger("mushroom_backup.snapshot.retention")

Reason = Literal["last", "hourly", "daily", "weekly", "monthly", "yearly", "within", "latest"]
BucketRule = Literal["hourly", "daily", "weekly", "monthly", "yearly"]
BUCKET_RULES: tuple[BucketRule, ...] = ("hourly", "daily", "weekly", "monthly", "yearly")
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How many snapshots each rule keeps (0: the rule is off) and the ``within`` window
    (None: off). See the module docstring for the semantics."""

    last: int = 0
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    yearly: int = 0
    within: timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("last", *BUCKET_RULES):
            if getattr(self, name) < 0:
                raise UsageError(f"--keep-{name} must not be negative")
        if self.within is not None and self.within < timedelta(0):
            raise UsageError("--keep-within must not be negative")

    @property
    def empty(self) -> bool:
        """Whether no rule is set (such a policy is refused)."""
        return self.within is None and not any(
            getattr(self, name) for name in ("last", *BUCKET_RULES)
        )

    def count(self, rule: BucketRule) -> int:
        value: int = getattr(self, rule)
        return value

    def describe(self) -> str:
        """``"last 3, daily 7, within 2d"`` (for output and logs)."""
        parts = [f"{name} {getattr(self, name)}" for name in ("last", *BUCKET_RULES)]
        parts = [p for p in parts if not p.endswith(" 0")]
        if self.within is not None:
            parts.append(f"within {format_duration(self.within)}")
        return ", ".join(parts) or "nothing set"


def format_duration(span: timedelta) -> str:
    """``timedelta(days=2, hours=3)`` -> ``"2d3h"`` (whole seconds; ``"0s"`` for zero)."""
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"


def policy_from_settings(settings: RetentionSettings) -> RetentionPolicy | None:
    """The policy the ``[retention]`` config section describes, or None when it sets no rule
    (then nothing is forgotten automatically)."""
    policy = RetentionPolicy(
        last=settings.keep_last or 0,
        hourly=settings.keep_hourly or 0,
        daily=settings.keep_daily or 0,
        weekly=settings.keep_weekly or 0,
        monthly=settings.keep_monthly or 0,
        yearly=settings.keep_yearly or 0,
        within=(
            timedelta(seconds=settings.keep_within_s)
            if settings.keep_within_s is not None
            else None
        ),
    )
    return None if policy.empty else policy


# --- the rule ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotStamp:
    """What the rule needs to know of a snapshot."""

    snapshot_id: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Decision:
    """Keep or forget one snapshot, and every rule that keeps it."""

    snapshot_id: str
    created_at: datetime
    keep: bool
    reasons: tuple[Reason, ...]


def bucket_of(rule: BucketRule, at: datetime) -> tuple[int, ...]:
    """The UTC bucket ``at`` falls in for ``rule`` (hour, day, ISO week, month, year)."""
    if at.tzinfo is None:
        raise ValueError("snapshot times must be timezone-aware")
    t = at.astimezone(UTC)
    if rule == "hourly":
        return (t.year, t.month, t.day, t.hour)
    if rule == "daily":
        return (t.year, t.month, t.day)
    if rule == "weekly":
        iso = t.isocalendar()
        return (iso.year, iso.week)
    if rule == "monthly":
        return (t.year, t.month)
    return (t.year,)


def plan_retention(
    snapshots: Iterable[SnapshotStamp],
    policy: RetentionPolicy,
    *,
    now: datetime,
    latest_id: str | None,
) -> tuple[Decision, ...]:
    """Keep or forget each snapshot (module docstring), oldest first. UsageError for a policy
    with no rule."""
    if policy.empty:
        raise UsageError(
            "no retention rule given: pass at least one of --keep-last, --keep-hourly, "
            "--keep-daily, --keep-weekly, --keep-monthly, --keep-yearly, --keep-within "
            "(or set them in the [retention] section of the config)"
        )
    newest_first = sorted(snapshots, key=lambda s: (s.created_at, s.snapshot_id), reverse=True)
    remaining = {rule: policy.count(rule) for rule in BUCKET_RULES}
    last_bucket: dict[BucketRule, tuple[int, ...] | None] = dict.fromkeys(BUCKET_RULES)
    cutoff = now - policy.within if policy.within is not None else None
    decisions: list[Decision] = []
    for index, snap in enumerate(newest_first):
        reasons: list[Reason] = []
        if index < policy.last:
            reasons.append("last")
        for rule in BUCKET_RULES:
            if remaining[rule] <= 0:
                continue
            bucket = bucket_of(rule, snap.created_at)
            if bucket != last_bucket[rule]:
                last_bucket[rule] = bucket
                remaining[rule] -= 1
                reasons.append(rule)
        if cutoff is not None and snap.created_at >= cutoff:
            reasons.append("within")
        if snap.snapshot_id == latest_id:
            reasons.append("latest")
        decisions.append(Decision(snap.snapshot_id, snap.created_at, bool(reasons), tuple(reasons)))
    decisions.reverse()
    return tuple(decisions)


# --- forget ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForgetResult:
    """What :func:`apply_retention` decided and did. ``decisions`` are oldest first;
    ``deleted`` lists the snapshot ids whose manifests were deleted (none with ``dry_run``);
    ``spared`` those the rule forgot but ``LATEST`` named when it came to deleting them (their
    decision says keep, reason ``latest``)."""

    policy: RetentionPolicy
    now: datetime
    latest_id: str | None
    decisions: tuple[Decision, ...]
    deleted: tuple[str, ...]
    spared: tuple[str, ...]
    dry_run: bool

    @property
    def kept(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.keep)

    @property
    def forgotten(self) -> tuple[Decision, ...]:
        """The snapshots forgotten (deleted, or to be deleted in a dry run)."""
        return tuple(d for d in self.decisions if not d.keep)


async def apply_retention(
    store: ObjectStore,
    policy: RetentionPolicy,
    *,
    clock: Clock,
    dry_run: bool = False,
) -> ForgetResult:
    """Decide with :func:`plan_retention` and delete the manifests of the snapshots it forgets
    (module docstring). The caller holds the bucket lease and passes a fenced store; with
    ``dry_run`` nothing is written (and no lease is needed)."""
    sleep = clock.sleep
    try:
        infos = await list_snapshots(store, sleep=sleep)
    except IntegrityError as error:
        raise IntegrityError(
            f"{error.message}. forget applies no policy while a snapshot cannot be read; "
            "run `mushroom-backup check`, and forget that snapshot by its id "
            "(`mushroom-backup forget SNAPSHOT_ID`) if it is beyond repair"
        ) from None
    latest = await read_latest(store, sleep=sleep)
    latest_id = latest.snapshot_id if latest is not None else None
    now = clock.wall()
    decisions = plan_retention(
        (SnapshotStamp(i.snapshot_id, i.created_at) for i in infos),
        policy,
        now=now,
        latest_id=latest_id,
    )
    doomed = [d.snapshot_id for d in decisions if not d.keep]
    log.info(
        "forget.planned",
        extra={
            "fields": {
                "policy": policy.describe(),
                "snapshots": len(decisions),
                "forget": len(doomed),
                "dry_run": dry_run,
            }
        },
    )
    deleted: list[str] = []
    spared: list[str] = []
    if not dry_run:
        for snapshot_id in doomed:
            # Under the lease nobody should move LATEST, but a stale writer's swap may still
            # land: whatever LATEST names at this moment is never deleted.
            current = await read_latest(store, sleep=sleep)
            if current is not None and current.snapshot_id == snapshot_id:
                log.warning("forget.spared_latest", extra={"fields": {"snapshot_id": snapshot_id}})
                spared.append(snapshot_id)
                continue
            await _delete(store, manifest_key(snapshot_id), sleep)
            deleted.append(snapshot_id)
            log.info("forget.deleted", extra={"fields": {"snapshot_id": snapshot_id}})
    if spared:
        decisions = tuple(
            Decision(d.snapshot_id, d.created_at, True, ("latest",))
            if d.snapshot_id in spared
            else d
            for d in decisions
        )
    return ForgetResult(
        policy=policy,
        now=now,
        latest_id=latest_id,
        decisions=decisions,
        deleted=tuple(deleted),
        spared=tuple(spared),
        dry_run=dry_run,
    )


async def forget_snapshots(
    store: ObjectStore,
    snapshot_ids: Iterable[str],
    *,
    clock: Clock,
    dry_run: bool = False,
) -> tuple[str, ...]:
    """Forget the named snapshots (``forget SNAPSHOT_ID...``): delete their manifests, which
    need not be readable -- this is how a damaged one is removed. Every id must name an
    existing manifest and none may be the snapshot ``LATEST`` names (UsageError before anything
    is deleted); ``LATEST`` is read again before each delete. Returns the ids (to be)
    deleted."""
    sleep = clock.sleep
    ids = list(dict.fromkeys(snapshot_ids))
    for snapshot_id in ids:
        if not is_snapshot_id(snapshot_id):
            raise UsageError(
                f"{snapshot_id!r} is not a snapshot id (like 20261129T101500.123Z-3f9a1c2e); "
                "list them with `mushroom-backup snapshots`"
            )
        try:
            await store.head(manifest_key(snapshot_id))
        except NotFound:
            raise UsageError(
                f"there is no snapshot {snapshot_id}; list them with `mushroom-backup snapshots`"
            ) from None
    for snapshot_id in ids:
        await _refuse_latest(store, snapshot_id, sleep)
    if dry_run:
        return tuple(ids)
    for snapshot_id in ids:
        await _refuse_latest(store, snapshot_id, sleep)
        await _delete(store, manifest_key(snapshot_id), sleep)
        log.info("forget.deleted", extra={"fields": {"snapshot_id": snapshot_id}})
    return tuple(ids)


async def _refuse_latest(store: ObjectStore, snapshot_id: str, sleep: Sleep) -> None:
    try:
        current = await read_latest(store, sleep=sleep)
    except IntegrityError:
        current = None  # an unreadable LATEST names nothing we could protect
    if current is not None and current.snapshot_id == snapshot_id:
        raise UsageError(
            f"snapshot {snapshot_id} is the one LATEST names, which is never forgotten; take "
            "a new backup first (or see the README's `check` section to repair a damaged one)"
        )


async def _delete(store: ObjectStore, key: str, sleep: Sleep) -> None:
    async def call() -> None:
        await store.delete(key)

    await retrying(call, what=f"delete {key}", sleep=sleep)


__all__ = [
    "BUCKET_RULES",
    "Decision",
    "ForgetResult",
    "RetentionPolicy",
    "SnapshotStamp",
    "apply_retention",
    "bucket_of",
    "forget_snapshots",
    "format_duration",
    "plan_retention",
    "policy_from_settings",
]
