"""``mushroom-backup run``: the service (see :mod:`mushroom_backup.agent.service`).

Checks what it can before starting: a store URL and a source *directory* (a missing source is
a usage error, exit 2, as for ``backup now``). Exits 0 after SIGTERM/SIGINT, 3 when another
process holds this node id (cluster), 4 when this incarnation's process lease is lost.
"""

from __future__ import annotations

import sys

import click

from ..agent.identity import node_identity
from ..agent.service import Service
from ..agent.writer import require_source_dir
from .common import run as run_coro
from .common import settings_for, source_option, store_option


@click.command("run")
@store_option
@source_option
@click.option(
    "--metrics-listen", metavar="HOST:PORT", default=None, help="Serve Prometheus metrics."
)
@click.option("--watch/--no-watch", default=None, help="Also snapshot after changes settle.")
@click.option(
    "--takeover",
    is_flag=True,
    help="In a cluster: if another process holds this node id, observe it for one TTL and take "
    "over only if it never renewed.",
)
@click.pass_context
def run_command(
    ctx: click.Context,
    store_url: str | None,
    source: str | None,
    metrics_listen: str | None,
    watch: bool | None,
    takeover: bool,
) -> None:
    """Run the agent: stand by or hold the lease, take snapshots on schedule, until SIGTERM.

    SIGUSR1 takes a snapshot now; SIGHUP does not reload (restart to apply a new config).
    """
    settings = settings_for(
        ctx,
        {
            ("store",): store_url,
            ("source",): source,
            ("metrics", "listen"): metrics_listen,
            ("schedule", "watch"): watch,
        },
    )
    settings.require_store()
    require_source_dir(settings)

    async def serve() -> int:
        async with node_identity(settings, takeover=takeover) as identity:
            return await Service(settings, identity=identity).run()

    sys.exit(run_coro(serve()))
