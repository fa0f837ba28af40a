"""What the process-lease store and prune tests share: a node, owners, a clock reading, small
bounds, and helpers that make and write records."""

from __future__ import annotations

from uuid import UUID

from mushroom_backup.lease.process.record import ProcessLease, ProcessLeaseBounds, lease_key
from mushroom_backup.store.base import ObjectStore

NODE = 7
TTL_MS = 30_000
NOW = 1_796_000_000_000
A = UUID("aaaaaaaa-0000-4000-8000-000000000001")
B = UUID("bbbbbbbb-0000-4000-8000-000000000002")
C = UUID("cccccccc-0000-4000-8000-000000000003")
#: retain 4, prune every 2 writes, list bound 20, 3 per batch, 6 batches, 5 s, 2 reads at once.
SMALL = ProcessLeaseBounds(
    history_to_retain=4,
    writes_per_prune=2,
    max_list_records=20,
    prune_batch_records=3,
    max_prune_batches=6,
    prune_io_timeout_s=5.0,
    read_concurrency=2,
    head_read_attempts=3,
)


def rec(owner: UUID, term: int, seq: int, node: int = NODE) -> ProcessLease:
    return ProcessLease(node, owner, term, seq, NOW + TTL_MS)


async def write(store: ObjectStore, *records: ProcessLease) -> None:
    for record in records:
        await store.put(lease_key(record.node, record.seq), record.encode())
