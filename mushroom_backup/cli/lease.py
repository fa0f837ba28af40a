"""``mushroom-backup lease``: look at the bucket lease, and break it after a crash."""

from __future__ import annotations

from typing import Any

import click

from ..clock import SYSTEM_CLOCK
from ..errors import NotFound, PreconditionFailed, UsageError
from ..lease.bucket import LEASE_KEY, read_lease
from ..lease.record import LeaseView, describe
from ..store import ObjectStore, open_store
from .common import echo_json, json_option, run, settings_for, store_option


def _view_json(view: LeaseView | None) -> dict[str, Any]:
    if view is None:
        return {"present": False}
    state = describe(view, SYSTEM_CLOCK.wall())
    record = view.record
    return {
        "present": True,
        "condition": str(state.condition),
        "holder": state.holder,
        "host": record.host if record else None,
        "pid": record.pid if record else None,
        "acquired_at": record.acquired_at if record else None,
        "renewed_at": record.renewed_at if record else None,
        "ttl_s": state.ttl_s,
        "age_s": None if state.age_s is None else round(state.age_s, 3),
        "expires_in_s": None if state.expires_in_s is None else round(state.expires_in_s, 3),
        "detail": state.detail,
        "version": str(view.version),
        "error": view.error,
    }


def _print_view(store: ObjectStore, view: LeaseView | None) -> None:
    if view is None:
        click.echo(f"no lease on {store.url}: nobody is writing there")
        return
    info = _view_json(view)
    rows = [
        ("store", store.url),
        ("state", info["condition"]),
        ("holder", info["holder"] or "-"),
        ("host", f"{info['host']} (pid {info['pid']})" if info["host"] else "-"),
        ("acquired at", info["acquired_at"] or "-"),
        ("renewed at", info["renewed_at"] or "-"),
        ("age", "-" if info["age_s"] is None else f"{info['age_s']:.1f} s"),
        ("ttl", "-" if info["ttl_s"] is None else f"{info['ttl_s']} s"),
        ("detail", info["detail"]),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


@click.group()
def lease() -> None:
    """The bucket lease: who may write to a backup prefix."""


@lease.command("status")
@store_option
@json_option
@click.pass_context
def status(ctx: click.Context, store_url: str | None, as_json: bool) -> None:
    """Show who holds the lease, when it was renewed, and whether it is fresh, stale or
    suspect."""
    settings = settings_for(ctx, {("store",): store_url})

    async def go() -> None:
        async with open_store(settings.require_store()) as store:
            view = await read_lease(store)
            if as_json:
                echo_json({"store": store.url, **_view_json(view)})
            else:
                _print_view(store, view)

    run(go())


@lease.command("release")
@store_option
@click.option("--force", is_flag=True, help="Really delete the lease (required).")
@json_option
@click.pass_context
def release(ctx: click.Context, store_url: str | None, force: bool, as_json: bool) -> None:
    """Break-glass: delete the lease after a crash, if it is still exactly the one shown.

    A live holder finds its lease gone at its next renewal and stops writing; use this only
    when you know the holder is dead or must be stopped.
    """
    settings = settings_for(ctx, {("store",): store_url})
    if not force:
        raise UsageError(
            "lease release deletes the bucket lease; a live holder then stops writing at its "
            "next renewal. Check `mushroom-backup lease status` first, then pass --force"
        )

    async def go() -> None:
        async with open_store(settings.require_store()) as store:
            view = await read_lease(store)
            if view is None:
                if as_json:
                    echo_json({"store": store.url, "removed": None})
                else:
                    click.echo(f"no lease on {store.url}: nothing to release")
                return
            shown = _view_json(view)
            if not as_json:
                _print_view(store, view)
            await _delete_exact(store, view)
            if as_json:
                echo_json({"store": store.url, "removed": shown})
            else:
                click.echo(f"removed the lease of {shown['holder'] or 'an unparseable record'}")
            click.echo(
                "warning: if that holder is still running it will find its lease lost at its "
                "next renewal and stop writing; its snapshot in flight is abandoned",
                err=True,
            )

    run(go())


async def _delete_exact(store: ObjectStore, view: LeaseView) -> None:
    """Delete LEASE only if it is still the version that was shown."""
    changed = UsageError(
        "the lease changed since it was read (a renewal or a new holder); nothing was "
        "removed. Run `mushroom-backup lease status` and try again"
    )
    try:
        if store.conditional and store.conditional_delete:
            await store.delete(LEASE_KEY, if_match=view.version)
            return
        again = await read_lease(store)
        if again is None or again.version != view.version:
            raise changed
        await store.delete(LEASE_KEY)
    except (PreconditionFailed, NotFound):
        raise changed from None
