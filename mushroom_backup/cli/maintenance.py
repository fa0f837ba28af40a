"""``mushroom-backup forget``, ``prune`` and ``check``: retention and integrity.

* ``forget`` and ``prune`` delete, so they run like ``backup now``: they take the bucket lease
  (``--wait-lease SECONDS``; exit 3 while another instance holds it), keep it renewed, and
  delete only through a :class:`~mushroom_backup.lease.fenced.FencedStore` (exit 4 when the
  lease is lost or the write fence closes; what was deleted until then stays deleted, which is
  harmless). With ``--dry-run`` they write nothing and take no lease, so a preview does not
  disturb a running service.
* ``check`` only reads and takes no lease. Exit 5 when it finds a problem, 0 when clean.

Human output on stdout; ``--json`` for machines. The rules live in
:mod:`mushroom_backup.snapshot.retention`, :mod:`~mushroom_backup.snapshot.prune` and
:mod:`~mushroom_backup.snapshot.check`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import click

from .. import log
from ..agent.writer import run_under_lease
from ..clock import SYSTEM_CLOCK, Clock
from ..config import Settings, parse_duration
from ..errors import IntegrityError, UsageError
from ..lease.bucket import BucketLease
from ..lease.fenced import FencedStore
from ..snapshot.check import CheckReport, check_store
from ..snapshot.prune import DEFAULT_GRACE, PruneResult, prune
from ..snapshot.retention import (
    ForgetResult,
    RetentionPolicy,
    apply_retention,
    forget_snapshots,
    format_duration,
    policy_from_settings,
)
from ..store import ObjectStore, open_store
from .common import echo_json, human_bytes, json_option, run, settings_for, store_option, table

T = TypeVar("T")
_log = log.get("cli.maintenance")


# --- running under the lease -------------------------------------------------------------------


async def under_lease(
    settings: Settings,
    work: Callable[[ObjectStore], Coroutine[Any, Any, T]],
    *,
    what: str,
    wait_lease_s: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    store: ObjectStore | None = None,
) -> T:
    """Run ``work`` with a store fenced by the bucket lease (see
    :func:`~mushroom_backup.agent.writer.run_under_lease`)."""

    async def fenced(target: ObjectStore, lease: BucketLease) -> T:
        return await work(FencedStore(target, lease, clock))

    return await run_under_lease(
        settings, fenced, what=what, wait_lease_s=wait_lease_s, clock=clock, store=store
    )


async def _read_only(settings: Settings, work: Callable[[ObjectStore], Awaitable[T]]) -> T:
    async with open_store(settings.require_store()) as store:
        return await work(store)


# --- options -----------------------------------------------------------------------------------


class _Duration(click.ParamType[timedelta, Any]):
    name = "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return timedelta(seconds=parse_duration(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


DURATION = _Duration()

wait_lease_option = click.option(
    "--wait-lease",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Keep trying this long while another instance holds the lease (default: fail at once).",
)
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Show what would be deleted; delete nothing, take no lease."
)
grace_option = click.option(
    "--grace",
    type=DURATION,
    default=None,
    help="Delete only unused packs older than this (default 24h; must exceed the lease TTL).",
)


def _keep(name: str, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        f"--keep-{name}",
        f"keep_{name}",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help=what,
    )


def check_grace(grace: timedelta | None, settings: Settings) -> timedelta:
    """The grace period to use: the default, or one that exceeds the lease TTL."""
    chosen = DEFAULT_GRACE if grace is None else grace
    ttl = timedelta(seconds=settings.lease.ttl_s)
    if chosen <= ttl:
        raise UsageError(
            f"--grace {format_duration(chosen)} is too short: it must exceed the lease TTL "
            f"({settings.lease.ttl_s}s), the longest a stale holder's upload may still be "
            "in flight (the default, 24h, leaves hours of margin)"
        )
    return chosen


# --- forget ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ForgetOutcome:
    forget: ForgetResult
    prune: PruneResult | None


@click.command("forget")
@click.argument("snapshot_ids", nargs=-1, metavar="[SNAPSHOT_ID]...")
@store_option
@_keep("last", "Keep the N most recent snapshots.")
@_keep("hourly", "Keep the newest snapshot of each of the last N hours that have one (UTC).")
@_keep("daily", "Keep the newest snapshot of each of the last N days that have one (UTC).")
@_keep("weekly", "Keep the newest snapshot of each of the last N ISO weeks that have one.")
@_keep("monthly", "Keep the newest snapshot of each of the last N months that have one (UTC).")
@_keep("yearly", "Keep the newest snapshot of each of the last N years that have one (UTC).")
@click.option(
    "--keep-within",
    "keep_within",
    type=DURATION,
    default=None,
    help="Keep every snapshot taken within DURATION before now (e.g. 36h, 7d, 2w).",
)
@click.option("--prune", "and_prune", is_flag=True, help="Prune under the same lease afterwards.")
@grace_option
@wait_lease_option
@dry_run_option
@json_option
@click.pass_context
def forget(
    ctx: click.Context,
    snapshot_ids: tuple[str, ...],
    store_url: str | None,
    keep_last: int | None,
    keep_hourly: int | None,
    keep_daily: int | None,
    keep_weekly: int | None,
    keep_monthly: int | None,
    keep_yearly: int | None,
    keep_within: timedelta | None,
    and_prune: bool,
    grace: timedelta | None,
    wait_lease: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete the snapshots (manifests) the retention policy does not keep, or the snapshots
    named by SNAPSHOT_ID (their manifests need not be readable).

    The policy is the --keep-* options; without any, the config's [retention] section; without
    that either, forget refuses to run. The snapshot LATEST names is always kept. Buckets are
    UTC hours, days, ISO weeks, months and years. Only manifests are deleted: run `prune` (or
    pass --prune) to delete the data no snapshot uses any more.

    Exits 2 without a policy, 3 when another instance holds the lease, 4 when the lease is
    lost mid-run.
    """
    settings = settings_for(ctx, {("store",): store_url})
    given = RetentionPolicy(
        last=keep_last or 0,
        hourly=keep_hourly or 0,
        daily=keep_daily or 0,
        weekly=keep_weekly or 0,
        monthly=keep_monthly or 0,
        yearly=keep_yearly or 0,
        within=keep_within,
    )
    if snapshot_ids:
        if not given.empty:
            raise UsageError("forget takes either snapshot ids or --keep-* options, not both")
        _forget_by_id(settings, snapshot_ids, and_prune, grace, wait_lease, dry_run, as_json)
        return
    policy = given if not given.empty else policy_from_settings(settings.retention)
    if policy is None:
        raise UsageError(
            "forget needs a retention policy: pass at least one of --keep-last, --keep-hourly, "
            "--keep-daily, --keep-weekly, --keep-monthly, --keep-yearly, --keep-within, or set "
            "them in the config's [retention] section"
        )
    chosen_grace = check_grace(grace, settings) if and_prune else DEFAULT_GRACE

    async def work(store: ObjectStore) -> _ForgetOutcome:
        result = await apply_retention(store, policy, clock=SYSTEM_CLOCK, dry_run=dry_run)
        pruned = None
        if and_prune:
            pruned = await prune(store, clock=SYSTEM_CLOCK, grace=chosen_grace, dry_run=dry_run)
        return _ForgetOutcome(result, pruned)

    if dry_run:
        outcome = run(_read_only(settings, work))
    else:
        outcome = run(under_lease(settings, work, what="forget", wait_lease_s=wait_lease))
    if as_json:
        body = forget_json(outcome.forget)
        if outcome.prune is not None:
            body["prune"] = prune_json(outcome.prune)
        echo_json(body)
    else:
        click.echo(forget_summary(outcome.forget))
        if outcome.prune is not None:
            click.echo("")
            click.echo(prune_summary(outcome.prune))
    if outcome.prune is not None:
        _fail_on_broken(outcome.prune)


def _forget_by_id(
    settings: Settings,
    snapshot_ids: tuple[str, ...],
    and_prune: bool,
    grace: timedelta | None,
    wait_lease: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    chosen_grace = check_grace(grace, settings) if and_prune else DEFAULT_GRACE

    async def work(store: ObjectStore) -> tuple[tuple[str, ...], PruneResult | None]:
        deleted = await forget_snapshots(store, snapshot_ids, clock=SYSTEM_CLOCK, dry_run=dry_run)
        pruned = None
        if and_prune:
            pruned = await prune(store, clock=SYSTEM_CLOCK, grace=chosen_grace, dry_run=dry_run)
        return deleted, pruned

    if dry_run:
        deleted, pruned = run(_read_only(settings, work))
    else:
        deleted, pruned = run(under_lease(settings, work, what="forget", wait_lease_s=wait_lease))
    if as_json:
        body: dict[str, Any] = {
            "dry_run": dry_run,
            "forgotten": list(deleted),
            "deleted": [] if dry_run else list(deleted),
        }
        if pruned is not None:
            body["prune"] = prune_json(pruned)
        echo_json(body)
    else:
        verb = "would forget" if dry_run else "forgot"
        click.echo("\n".join(f"{verb} {snapshot_id}" for snapshot_id in deleted))
        if pruned is not None:
            click.echo("")
            click.echo(prune_summary(pruned))
    if pruned is not None:
        _fail_on_broken(pruned)


def forget_json(result: ForgetResult) -> dict[str, Any]:
    policy = result.policy
    return {
        "policy": {
            "keep_last": policy.last,
            "keep_hourly": policy.hourly,
            "keep_daily": policy.daily,
            "keep_weekly": policy.weekly,
            "keep_monthly": policy.monthly,
            "keep_yearly": policy.yearly,
            "keep_within_s": policy.within.total_seconds() if policy.within else None,
        },
        "now": result.now.isoformat(),
        "latest": result.latest_id,
        "dry_run": result.dry_run,
        "snapshots": [
            {
                "id": d.snapshot_id,
                "time": d.created_at.isoformat(),
                "keep": d.keep or d.snapshot_id in result.spared,
                "reasons": list(d.reasons)
                or (["latest"] if d.snapshot_id in result.spared else []),
            }
            for d in result.decisions
        ],
        "kept": len(result.kept),
        "forgotten": [d.snapshot_id for d in result.forgotten],
        "deleted": list(result.deleted),
        "spared": list(result.spared),
    }


def forget_summary(result: ForgetResult) -> str:
    if not result.decisions:
        return "no snapshots yet"
    rows = [
        (
            d.snapshot_id + (" *" if d.snapshot_id == result.latest_id else ""),
            d.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "keep" if d.keep else "forget",
            ", ".join(d.reasons) or "-",
        )
        for d in result.decisions
    ]
    lines = [
        f"policy: keep {result.policy.describe()} (buckets in UTC; * = LATEST, always kept)",
        table(("id", "time (UTC)", "action", "reasons"), rows),
    ]
    forgotten = len(result.forgotten)
    if result.dry_run:
        lines.append(f"dry run: would forget {forgotten}, keep {len(result.kept)}")
    else:
        lines.append(
            f"forgot {len(result.deleted)} snapshot(s), kept {len(result.kept)}; "
            "run `mushroom-backup prune` to delete the data they alone used"
        )
    lines += [f"warning: kept {s}: LATEST named it when it came to deleting" for s in result.spared]
    return "\n".join(lines)


# --- prune -------------------------------------------------------------------------------------


@click.command("prune")
@store_option
@grace_option
@wait_lease_option
@dry_run_option
@json_option
@click.pass_context
def prune_command(
    ctx: click.Context,
    store_url: str | None,
    grace: timedelta | None,
    wait_lease: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete the packs no snapshot uses and older than the grace period.

    Runs under the bucket lease; every delete is fenced by its write deadline. Packs some
    snapshot still uses in part are kept whole. Exits 3 when another instance holds the lease,
    4 when the lease is lost mid-run, 5 when a manifest cannot be read (nothing is deleted).
    """
    settings = settings_for(ctx, {("store",): store_url})
    chosen = check_grace(grace, settings)

    async def work(store: ObjectStore) -> PruneResult:
        return await prune(store, clock=SYSTEM_CLOCK, grace=chosen, dry_run=dry_run)

    if dry_run:
        result = run(_read_only(settings, work))
    else:
        result = run(under_lease(settings, work, what="prune", wait_lease_s=wait_lease))
    if as_json:
        echo_json(prune_json(result))
    else:
        click.echo(prune_summary(result))
    _fail_on_broken(result)


def _packs(count: int) -> str:
    return f"{count} unused pack" + ("" if count == 1 else "s")


def _fail_on_broken(result: PruneResult) -> None:
    if result.broken_snapshots:
        raise IntegrityError(
            f"snapshot(s) {', '.join(result.broken_snapshots)} appeared while prune ran and use "
            "a pack it deleted: a writer ignored the bucket lease. Those snapshots cannot be "
            "restored; take a new backup, and find the instance that writes without the lease"
        )


def prune_json(result: PruneResult) -> dict[str, Any]:
    return {
        "dry_run": result.dry_run,
        "grace_s": result.grace.total_seconds(),
        "now": result.now.isoformat(),
        "manifests": result.manifests,
        "late_manifests": result.late_manifests,
        "packs": result.packs,
        "pack_bytes": result.pack_bytes,
        "used_packs": result.used_packs,
        "used_bytes": result.used_bytes,
        "deleted_packs": len(result.deleted),
        "deleted_bytes": result.deleted_bytes,
        "deleted": list(result.deleted),
        "spared": list(result.spared),
        "young_packs": result.young_packs,
        "young_bytes": result.young_bytes,
        "partly_used_packs": result.partly_used_packs,
        "partly_unused_bytes": result.partly_unused_bytes,
        "unknown_keys": list(result.unknown_keys),
        "missing_packs": list(result.missing_packs),
        "broken_snapshots": list(result.broken_snapshots),
    }


def prune_summary(result: PruneResult) -> str:
    verb = "would delete" if result.dry_run else "deleted"
    rows = [
        ("snapshots", str(result.manifests)),
        ("packs", f"{result.packs} ({human_bytes(result.pack_bytes)})"),
        ("used by snapshots", f"{result.used_packs} ({human_bytes(result.used_bytes)})"),
        (
            verb,
            f"{_packs(len(result.deleted))}, {human_bytes(result.deleted_bytes)} reclaimed",
        ),
        (
            "kept, within grace",
            f"{_packs(result.young_packs)} ({human_bytes(result.young_bytes)}) younger "
            f"than {format_duration(result.grace)}",
        ),
        (
            "partly used packs",
            f"{result.partly_used_packs}, holding {human_bytes(result.partly_unused_bytes)} "
            "no snapshot uses (kept whole; never rewritten)",
        ),
    ]
    width = max(len(key) for key, _ in rows)
    lines = [f"{key.ljust(width)}  {value}" for key, value in rows]
    if result.dry_run:
        lines.append("dry run: nothing was deleted")
    if result.spared:
        lines.append(f"spared {len(result.spared)} pack(s) a snapshot newer than the mark uses")
    if result.missing_packs:
        lines.append(
            f"warning: {len(result.missing_packs)} pack(s) snapshots use are missing; "
            "run `mushroom-backup check`"
        )
    lines += [f"note: left alone (not a pack): {key}" for key in result.unknown_keys]
    return "\n".join(lines)


# --- check -------------------------------------------------------------------------------------


@click.command("check")
@store_option
@click.option(
    "--read-data", is_flag=True, help="Download every used pack and verify every chunk's hash."
)
@click.option(
    "--read-data-subset",
    "subset",
    type=click.FloatRange(min=0, max=100, min_open=True),
    default=None,
    metavar="PCT",
    help="Like --read-data, for PCT %% of the packs: a window that moves every UTC day.",
)
@json_option
@click.pass_context
def check(
    ctx: click.Context,
    store_url: str | None,
    read_data: bool,
    subset: float | None,
    as_json: bool,
) -> None:
    """Check that every snapshot is complete: LATEST names a manifest, every manifest parses,
    every pack it uses exists and is long enough; with --read-data, every chunk's hash.

    Problems are listed one per line with the snapshot and file they affect; packs no snapshot
    uses are reported as reclaimable, not as problems. Exits 5 when any problem is found.
    """
    if read_data and subset is not None:
        raise UsageError("pass either --read-data or --read-data-subset PCT, not both")
    settings = settings_for(ctx, {("store",): store_url})

    async def work(store: ObjectStore) -> CheckReport:
        return await check_store(
            store, clock=SYSTEM_CLOCK, read_data=read_data, subset_percent=subset
        )

    report = run(_read_only(settings, work))
    if as_json:
        echo_json(check_json(report))
    else:
        click.echo(check_summary(report))
    if not report.clean:
        raise IntegrityError(
            f"check found {len(report.problems)} problem(s) affecting "
            f"{len(report.affected_snapshots)} snapshot(s); restore what you need from a snapshot "
            "not named above, then forget the damaged ones (the README's `check` section says "
            "how to repair the one LATEST names)"
        )


def check_json(report: CheckReport) -> dict[str, Any]:
    window = report.subset
    return {
        "clean": report.clean,
        "snapshots": report.snapshots,
        "latest": report.latest_id,
        "used_packs": report.used_packs,
        "used_bytes": report.used_bytes,
        "read_data": report.read_data,
        "subset": None
        if window is None
        else {
            "percent": window.percent,
            "window": window.index + 1,
            "windows": window.count,
            "start": window.start,
            "end": window.end,
        },
        "packs_read": report.packs_read,
        "bytes_read": report.bytes_read,
        "chunks_verified": report.chunks_verified,
        "problems": [
            {
                "kind": p.kind,
                "object": p.key,
                "message": p.message,
                "affected": [{"snapshot": a.snapshot_id, "file": a.path} for a in p.affected],
            }
            for p in report.problems
        ],
        "affected_snapshots": list(report.affected_snapshots),
        "reclaimable": {"packs": report.reclaimable_packs, "bytes": report.reclaimable_bytes},
        "unknown_keys": list(report.unknown_keys),
    }


def check_summary(report: CheckReport) -> str:
    lines = [line for problem in report.problems for line in problem.lines()]
    read = "no data read (pass --read-data to verify every chunk)"
    if report.read_data:
        read = (
            f"read {report.packs_read} packs ({human_bytes(report.bytes_read)}), "
            f"verified {report.chunks_verified} chunks"
        )
    if report.subset is not None:
        lines.append(f"read-data subset: {report.subset.describe()}")
    lines += [
        f"snapshots: {report.snapshots}, LATEST: {report.latest_id or '-'}",
        f"used packs: {report.used_packs} ({human_bytes(report.used_bytes)}); {read}",
        f"reclaimable: {_packs(report.reclaimable_packs)} "
        f"({human_bytes(report.reclaimable_bytes)}); `mushroom-backup prune` deletes them",
    ]
    lines += [f"unknown object (left alone): {key}" for key in report.unknown_keys]
    lines.append(
        "no problems found"
        if report.clean
        else f"{len(report.problems)} problem(s) in {len(report.affected_snapshots)} snapshot(s)"
    )
    return "\n".join(lines)


def register(group: click.Group) -> None:
    """Add ``forget``, ``prune`` and ``check`` to the root command group."""
    for command in (forget, prune_command, check):
        group.add_command(command)


__all__ = ["check", "forget", "prune_command", "register", "under_lease"]
