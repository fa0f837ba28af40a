"""``mushroom-backup node``: the process lease of a stable cluster node id (status, fence,
verify)."""

from __future__ import annotations

import click


@click.group()
def node() -> None:
    """Cluster node identity: process-lease status, fencing and verification."""
