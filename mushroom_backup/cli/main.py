"""The ``mushroom-backup`` group, global options, and the one place errors become exit codes."""

from __future__ import annotations

from typing import Any

import click

from .. import __version__
from ..errors import EXIT_ERROR, MushroomError, redact
from .backup import backup, snapshots
from .lease import lease
from .maintenance import register as register_maintenance
from .node import node
from .restore import restore
from .run import run_command


class _Group(click.Group):
    """Turns MushroomError into one clear line and its exit code (a traceback only with
    --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MushroomError as error:
            if ctx.meta.get("mushroom.debug"):
                raise
            click.echo(f"error: {error.message}", err=True)
            ctx.exit(error.exit_code)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as error:  # the last line of defence for users
            if ctx.meta.get("mushroom.debug"):
                raise
            click.echo(
                redact(
                    f"error: unexpected {type(error).__name__}: {error} "
                    "(run with --debug for a traceback, and please report it)"
                ),
                err=True,
            )
            ctx.exit(EXIT_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mushroom-backup")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file (default: /etc/mushroom-backup/config.toml when present).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool) -> None:
    """Fenced, deduplicated, verified backups of a data directory."""
    ctx.meta["mushroom.debug"] = debug
    ctx.meta["mushroom.config_path"] = config_path


cli.add_command(backup)
cli.add_command(snapshots)
cli.add_command(restore)
cli.add_command(lease)
cli.add_command(node)
cli.add_command(run_command)
register_maintenance(cli)


def main() -> None:
    """The console script. click's own usage errors exit 2, like our UsageError."""
    cli.main(prog_name="mushroom-backup")
