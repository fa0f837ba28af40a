"""``mushroom-backup node``: the process lease of a stable cluster node id.

::

    node status --node N [--json]                      head, term, owner, expiry, history, fences
    node fence  --node N --incarnation UUID [--io-budget S]
                                                       revoke a dead incarnation (waits >= 1 TTL);
                                                       prints the certificate; exit 3 if it renewed
    node verify --node N --incarnation UUID [--term T] exit 0 current, 1 not current
    node verify --node N --fence FILE                  exit 0 the certificate holds, 1 it does not

Every command takes ``--root URL`` (the cluster root store; else ``$MUSHROOM_BACKUP_CLUSTER_ROOT``)
and ``--ttl SECONDS`` (default 30; must match the agents'). :func:`cluster_root` is the one place
that decides the root, so a shared config helper can replace it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, BinaryIO, TypeVar
from uuid import UUID

import click

from ..clock import SYSTEM_CLOCK
from ..errors import EXIT_ERROR, ProcessLeaseInvalid, UsageError
from ..lease.process.authority import ProcessLeaseAuthority
from ..lease.process.record import (
    MAX_U64,
    Participant,
    ProcessLeaseFence,
    parse_uuid,
    ttl_to_ms,
    wall_ms,
)
from ..lease.process.store import ProcessLeaseStore
from ..store import open_store
from .common import echo_json, json_option, run, settings_for

F = TypeVar("F", bound=Callable[..., Any])

ROOT_ENV = "MUSHROOM_BACKUP_CLUSTER_ROOT"
DEFAULT_IO_BUDGET_S = 10.0


def cluster_root(root: str | None) -> str:
    """The cluster root URL: ``--root``, else ``$MUSHROOM_BACKUP_CLUSTER_ROOT``, else the
    config's ``[cluster] root``."""
    settings = settings_for(click.get_current_context(), {("cluster", "root"): root})
    if not settings.cluster.root:
        raise UsageError(
            f"no cluster root given; pass --root URL (e.g. s3://bucket/cluster), set {ROOT_ENV}, "
            "or set [cluster] root in the config file"
        )
    return settings.cluster.root


class _Incarnation(click.ParamType[UUID]):
    name = "UUID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> UUID:
        if isinstance(value, UUID):
            return value
        try:
            return parse_uuid(str(value))
        except ProcessLeaseInvalid as error:
            self.fail(error.message, param, ctx)


def _ttl(ctx: click.Context, param: click.Parameter, seconds: float) -> timedelta:
    ttl = timedelta(seconds=seconds)
    try:
        ttl_to_ms(ttl)
    except ProcessLeaseInvalid as error:
        raise click.BadParameter(error.message, ctx, param) from None
    return ttl


def _common(command: F) -> F:
    for option in reversed(
        [
            click.option(
                "--node",
                "node_id",
                type=click.IntRange(1, MAX_U64),
                required=True,
                help="The stable node id.",
            ),
            click.option(
                "--root",
                metavar="URL",
                default=None,
                help=f"Cluster root store, e.g. s3://bucket/cluster (default: ${ROOT_ENV}).",
            ),
            click.option(
                "--ttl",
                type=click.FloatRange(min=0, min_open=True),
                default=30.0,
                show_default=True,
                callback=_ttl,
                metavar="SECONDS",
                help="Process-lease TTL; must match the agents' (whole milliseconds).",
            ),
        ]
    ):
        command = option(command)
    return command


_io_budget = click.option(
    "--io-budget",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_IO_BUDGET_S,
    show_default=True,
    metavar="SECONDS",
    help="Time allowed for store I/O on top of the TTL.",
)


@click.group()
def node() -> None:
    """Cluster node identity: process-lease status, fencing and verification."""


# --- status ------------------------------------------------------------------------------------


async def _status(root: str, node_id: int, ttl: timedelta) -> dict[str, Any]:
    async with open_store(root) as store:
        leases = ProcessLeaseStore(store, node_id, ttl_to_ms(ttl))
        try:
            # read_history (not load) so that a status never starts a pruning write
            history = await leases.read_history()
            fences = await leases.list_fences()
        finally:
            await leases.close()
        head = history[-1] if history else None
        now_ms = wall_ms(SYSTEM_CLOCK.wall())
        return {
            "node": node_id,
            "root": store.url,
            "head": None if head is None else head.as_json(),
            "term": None if head is None else head.term,
            "owner": None if head is None else str(head.owner),
            "expires_in_s": None if head is None else (head.expires_at_ms - now_ms) / 1000,
            "history_length": len(history),
            "oldest_seq": history[0].seq if history else None,
            "fences": [fence.as_json() for fence in fences],
        }


def _print_status(info: dict[str, Any]) -> None:
    head = info["head"]
    if head is None:
        click.echo(f"node {info['node']}: no process lease under {info['root']}")
        return
    expires = info["expires_in_s"]
    life = f"in {expires:.1f} s" if expires >= 0 else f"{-expires:.1f} s ago"
    rows = [
        ("node", info["node"]),
        ("owner", info["owner"]),
        ("term", info["term"]),
        ("seq", head["seq"]),
        ("expires", f"{life} (by the writer's clock)"),
        ("history", f"{info['history_length']} records (seq {info['oldest_seq']}..{head['seq']})"),
        ("fences", len(info["fences"])),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
    for fence in info["fences"]:
        before, after = fence["predecessor"], fence["successor"]
        click.echo(
            f"  term {after['term']} at seq {after['seq']}: {before['owner']} -> {after['owner']}"
        )


@node.command("status")
@_common
@json_option
def status(node_id: int, root: str | None, ttl: timedelta, as_json: bool) -> None:
    """Show the node's head record, term, owner, expiry, history length and fences."""
    info = run(_status(cluster_root(root), node_id, ttl))
    if as_json:
        echo_json(info)
    else:
        _print_status(info)


# --- fence -------------------------------------------------------------------------------------


async def _fence(
    root: str, participant: Participant, ttl: timedelta, io_budget: float
) -> ProcessLeaseFence:
    async with open_store(root) as store:
        authority = ProcessLeaseAuthority(store, ttl)
        try:
            deadline = authority.fencing_deadline(io_budget)
            return await authority.fence_incarnation(participant, deadline)
        finally:
            await authority.close()


@node.command("fence")
@_common
@click.option("--incarnation", type=_Incarnation(), required=True, help="Boot incarnation.")
@_io_budget
def fence(
    node_id: int, root: str | None, ttl: timedelta, incarnation: UUID, io_budget: float
) -> None:
    """Durably revoke a (dead) process incarnation of the node.

    Watches the node for one full TTL; if the incarnation did not renew, a takeover is written
    and the fence certificate is printed as JSON (exit 0). Exit 3 if it renewed meanwhile: it
    is alive. Running it again after a success prints the same certificate at once."""
    url = cluster_root(root)
    click.echo(
        f"fencing incarnation {incarnation} of node {node_id}: watching it for one TTL "
        f"({ttl.total_seconds():g} s)",
        err=True,
    )
    certificate = run(_fence(url, Participant(node_id, incarnation), ttl, io_budget))
    click.echo(certificate.encode().decode("ascii"))


# --- verify ------------------------------------------------------------------------------------


async def _verify_participant(
    root: str, participant: Participant, term: int | None, ttl: timedelta, io_budget: float
) -> bool:
    async with open_store(root) as store:
        authority = ProcessLeaseAuthority(store, ttl)
        try:
            deadline = SYSTEM_CLOCK.monotonic() + io_budget
            if term is None:
                return await authority.verify_current_participant(participant, deadline)
            return await authority.verify_current_participant_term(participant, term, deadline)
        finally:
            await authority.close()


async def _verify_fence(
    root: str, certificate: ProcessLeaseFence, ttl: timedelta, io_budget: float
) -> bool:
    async with open_store(root) as store:
        authority = ProcessLeaseAuthority(store, ttl)
        try:
            return await authority.verify_fence(certificate, SYSTEM_CLOCK.monotonic() + io_budget)
        finally:
            await authority.close()


@node.command("verify")
@_common
@click.option("--incarnation", type=_Incarnation(), default=None, help="Boot incarnation.")
@click.option("--term", type=click.IntRange(1, MAX_U64), default=None, help="Process term.")
@click.option(
    "--fence",
    "fence_file",
    type=click.File("rb"),
    default=None,
    help="A certificate printed by `node fence` ('-' for stdin) to verify instead.",
)
@_io_budget
@click.pass_context
def verify(
    ctx: click.Context,
    node_id: int,
    root: str | None,
    ttl: timedelta,
    incarnation: UUID | None,
    term: int | None,
    fence_file: BinaryIO | None,
    io_budget: float,
) -> None:
    """Exit 0 if the incarnation (and term) is the node's current durable owner, 1 if not.
    With --fence: exit 0 if the certificate is sealed and its revocation still holds."""
    url = cluster_root(root)
    if (incarnation is None) == (fence_file is None):
        raise UsageError("give either --incarnation UUID [--term T] or --fence FILE")
    if fence_file is not None:
        if term is not None:
            raise UsageError("--term goes with --incarnation, not with --fence")
        certificate = ProcessLeaseFence.decode(fence_file.read().rstrip(b"\n"))
        if certificate.node != node_id:
            raise UsageError(
                f"the certificate is for node {certificate.node}, not --node {node_id}"
            )
        holds = run(_verify_fence(url, certificate, ttl, io_budget))
        click.echo("fence holds" if holds else "fence does not hold")
    else:
        assert incarnation is not None
        participant = Participant(node_id, incarnation)
        holds = run(_verify_participant(url, participant, term, ttl, io_budget))
        click.echo("current" if holds else "not current")
    if not holds:
        ctx.exit(EXIT_ERROR)
