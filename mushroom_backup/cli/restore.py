"""``mushroom-backup restore``: restore or verify a snapshot."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..errors import UsageError
from ..snapshot.restore import RestoreResult, restore_snapshot
from ..store import open_store
from .common import (
    ProgressBar,
    echo_json,
    human_bytes,
    human_duration,
    json_option,
    run,
    settings_for,
    store_option,
)


@click.command("restore")
@click.argument("snapshot", metavar="latest|SNAPSHOT_ID")
@store_option
@click.option(
    "--target",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to restore into (created if absent; must be empty unless --force).",
)
@click.option(
    "--verify-only",
    is_flag=True,
    help="Download and check every chunk and file; write nothing.",
)
@click.option("--force", is_flag=True, help="Restore into a non-empty target.")
@json_option
@click.pass_context
def restore(
    ctx: click.Context,
    snapshot: str,
    store_url: str | None,
    target: str | None,
    verify_only: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Restore SNAPSHOT (or the one LATEST names) into --target, verifying every chunk and
    every file; each file is written under a temporary name and renamed into place.

    Exits 5 on a missing or corrupt object, a hash mismatch or an unsafe path, naming the file
    and the object; nothing half-written is left under a final name.
    """
    settings = settings_for(ctx, {("store",): store_url})
    if target is None and not verify_only:
        raise UsageError("restore needs --target DIR (or --verify-only to check without writing)")
    bar = ProgressBar("verify" if verify_only else "restore", enabled=False if as_json else None)

    async def go() -> RestoreResult:
        async with open_store(settings.require_store()) as store:
            return await restore_snapshot(
                store,
                snapshot,
                None if target is None else Path(target),
                verify_only=verify_only,
                force=force,
                download_concurrency=settings.restore.download_concurrency,
                progress=bar,
            )

    try:
        result = run(go())
    finally:
        bar.finish()
    if as_json:
        echo_json(dataclasses.asdict(result))
        return
    what = "verified" if result.verify_only else f"restored into {target}"
    click.echo(
        f"{result.snapshot_id} {what}: {result.files} files, {result.dirs} dirs, "
        f"{result.symlinks} symlinks, {human_bytes(result.bytes)}; "
        f"{human_bytes(result.bytes_downloaded)} downloaded in {result.requests} requests, "
        f"{human_duration(result.duration_s)}; every chunk and file hash checked"
    )
