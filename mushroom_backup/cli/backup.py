"""``mushroom-backup backup now`` and ``mushroom-backup snapshots``."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from ..agent.writer import backup_now
from ..snapshot.backup import SnapshotResult
from ..snapshot.catalog import SnapshotInfo, list_snapshots
from ..store import open_store
from .common import (
    ProgressBar,
    echo_json,
    human_bytes,
    human_duration,
    json_option,
    run,
    settings_for,
    source_option,
    store_option,
    table,
)


@click.group()
def backup() -> None:
    """Take snapshots."""


@backup.command("now")
@store_option
@source_option
@click.option(
    "--wait-lease",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Keep trying this long while another instance holds the lease (default: fail at once).",
)
@click.option(
    "--exclude",
    "excludes",
    multiple=True,
    metavar="PATTERN",
    help="Skip paths matching PATTERN (repeatable; adds to the config's excludes).",
)
@click.option(
    "--skip-unreadable",
    is_flag=True,
    default=None,
    help="Skip files that cannot be read, with a warning, instead of failing.",
)
@json_option
@click.pass_context
def now(
    ctx: click.Context,
    store_url: str | None,
    source: str | None,
    wait_lease: float | None,
    excludes: tuple[str, ...],
    skip_unreadable: bool | None,
    as_json: bool,
) -> None:
    """Take the lease, take one snapshot, release the lease, print a summary.

    Exits 3 when another instance holds the lease, 4 when the lease is lost or the write fence
    closes mid-snapshot (the snapshot is abandoned; LATEST is untouched).
    """
    settings = settings_for(
        ctx,
        {
            ("store",): store_url,
            ("source",): source,
            ("backup", "skip_unreadable"): skip_unreadable,
        },
    )
    if excludes:
        settings = settings.model_copy(
            update={
                "backup": settings.backup.model_copy(
                    update={"excludes": (*settings.backup.excludes, *excludes)}
                )
            }
        )
    bar = ProgressBar("backup", enabled=None if not as_json else False)
    try:
        result = run(backup_now(settings, wait_lease_s=wait_lease, progress=bar))
    finally:
        bar.finish()
    if as_json:
        echo_json(result_json(result))
        return
    click.echo(summary(result))


def result_json(result: SnapshotResult) -> dict[str, Any]:
    body = dataclasses.asdict(result)
    body["warnings"] = [dataclasses.asdict(w) for w in result.warnings]
    return body


def summary(result: SnapshotResult) -> str:
    rows = [
        ("snapshot", result.snapshot_id),
        ("parent", result.parent_id or "-"),
        ("files", f"{result.files} ({result.files_reused} unchanged, {result.files_read} read)"),
        ("dirs / symlinks", f"{result.dirs} / {result.symlinks}"),
        ("bytes scanned", human_bytes(result.bytes_scanned)),
        ("new bytes stored", f"{human_bytes(result.new_bytes_stored)} (compressed)"),
        ("uploaded", f"{human_bytes(result.bytes_uploaded)} in {result.requests} requests"),
        ("dedup ratio", f"{result.dedup_ratio:.1%}"),
        ("duration", human_duration(result.duration_s)),
    ]
    width = max(len(key) for key, _ in rows)
    lines = [f"{key.ljust(width)}  {value}" for key, value in rows]
    lines += [f"warning: {w.path}: {w.message}" for w in result.warnings]
    return "\n".join(lines)


@click.command("snapshots")
@store_option
@json_option
@click.pass_context
def snapshots(ctx: click.Context, store_url: str | None, as_json: bool) -> None:
    """List snapshots, oldest first (the one LATEST names is marked *)."""
    settings = settings_for(ctx, {("store",): store_url})

    async def go() -> list[SnapshotInfo]:
        async with open_store(settings.require_store()) as store:
            return await list_snapshots(store)

    found = run(go())
    if as_json:
        echo_json(
            [
                {
                    "id": info.snapshot_id,
                    "time": info.created_at.isoformat(),
                    "files": info.files,
                    "size": info.size,
                    "new_bytes": info.new_bytes,
                    "writer_instance": info.writer_instance,
                    "exclusion": info.header.writer.exclusion,
                    "latest": info.is_latest,
                }
                for info in found
            ]
        )
        return
    if not found:
        click.echo("no snapshots yet")
        return
    click.echo(
        table(
            ("id", "time (UTC)", "files", "size", "new bytes", "writer"),
            [
                (
                    info.snapshot_id + (" *" if info.is_latest else ""),
                    info.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    info.files,
                    human_bytes(info.size),
                    human_bytes(info.new_bytes),
                    info.writer_instance[:12],
                )
                for info in found
            ],
        )
    )
