"""A stand-in for an agent process in the integration tests: hold node N's process lease.

    python tests/integration/_process_lease_node.py ROOT_URL NODE TTL_SECONDS [--takeover]

Prints one JSON line ``{"incarnation": ..., "term": ...}`` on stdout once it holds the node,
then renews every TTL/3 until it is killed (or lost: exit 4). Exit 3 if another live incarnation
holds the node (with ``--takeover``: if it changed during one observed TTL). The store's
endpoint and credentials come from the AWS environment variables the test sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import timedelta

from mushroom_backup.errors import EXIT_LEASE_HELD, EXIT_LEASE_LOST, ProcessLeaseHeld
from mushroom_backup.lease.process import ProcessLeaseHolder
from mushroom_backup.store import open_store


async def hold(root: str, node: int, ttl_s: float, takeover: bool) -> int:
    async with open_store(root) as store:
        holder = ProcessLeaseHolder(store, node, ttl=timedelta(seconds=ttl_s))
        try:
            lease = await holder.start(takeover=takeover)
        except ProcessLeaseHeld as error:
            print(f"held: {error.message}", file=sys.stderr, flush=True)
            return EXIT_LEASE_HELD
        try:
            line = {"incarnation": str(holder.boot_incarnation), "term": lease.term}
            print(json.dumps(line), flush=True)
            reason = await holder.wait_lost()
            print(f"lost: {reason}", file=sys.stderr, flush=True)
            return EXIT_LEASE_LOST
        finally:
            await holder.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("node", type=int)
    parser.add_argument("ttl_s", type=float)
    parser.add_argument("--takeover", action="store_true")
    args = parser.parse_args()
    sys.exit(asyncio.run(hold(args.root, args.node, args.ttl_s, args.takeover)))


if __name__ == "__main__":
    main()
