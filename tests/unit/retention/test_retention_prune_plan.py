"""Prune's decision as tables: used packs are kept however old, unused ones only once older
than the grace period (strictly), ages on the younger of two clocks, unknown keys never."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.snapshot.manifest import ChunkLocation
from mushroom_backup.snapshot.prune import PackUsage, plan_prune, store_now
from mushroom_backup.store.base import ObjectInfo, Version

if TYPE_CHECKING:
    from tests.unit.retention.retention_support import manifest
else:
    from retention_support import manifest

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GRACE = timedelta(hours=24)
SNAP_A = "20261129T100000.000Z-0000000a"
SNAP_B = "20261129T110000.000Z-0000000b"


def pid(n: int) -> str:
    return f"{n:02x}" * 32


def pack(n: int, *, age: timedelta | None, size: int = 1000) -> ObjectInfo:
    pack_id = pid(n)
    modified = None if age is None else NOW - age
    return ObjectInfo(f"data/{pack_id[:2]}/{pack_id}", size, Version(f'"{n}"'), modified)


def usage(*rows: tuple[int, int, int]) -> PackUsage:
    """``(pack n, offset, length)`` rows of chunks some manifest uses."""
    used = PackUsage()
    for n, offset, length in rows:
        used.chunks.setdefault(pid(n), {})[offset] = length
    return used


@pytest.mark.parametrize(
    ("age", "used", "verdict"),
    [
        (timedelta(days=400), True, "used"),  # however old, a used pack stays
        (timedelta(hours=24, seconds=1), False, "delete"),
        (timedelta(hours=24), False, "young"),  # exactly the grace period: not yet
        (timedelta(hours=23), False, "young"),
        (timedelta(0), False, "young"),
        (-timedelta(hours=1), False, "young"),  # stamped in the future
        (None, False, "young"),  # no modification time: cannot judge its age
    ],
)
def test_each_pack_verdict(age: timedelta | None, used: bool, verdict: str) -> None:
    info = pack(1, age=age)
    plan = plan_prune([info], usage((1, 0, 10)) if used else PackUsage(), now=NOW, grace=GRACE)
    got = {
        "delete": plan.delete,
        "young": plan.young,
        "used": plan.used,
    }
    assert got[verdict] == (info,)
    assert sum(len(v) for v in got.values()) == 1


def test_unknown_keys_are_never_deleted_and_missing_packs_are_named() -> None:
    stray = [
        ObjectInfo("data/tmp-upload", 5, Version('"x"'), NOW - timedelta(days=9)),
        ObjectInfo(f"data/zz/{pid(3)}", 5, Version('"y"'), NOW - timedelta(days=9)),  # wrong dir
        ObjectInfo(f"data/ab/{pid(0xAB).upper()}", 5, Version('"z"'), None),
    ]
    plan = plan_prune(
        [*stray, pack(1, age=timedelta(days=2))], usage((2, 0, 1)), now=NOW, grace=GRACE
    )
    assert plan.unknown == tuple(i.key for i in stray)
    assert [i.key for i in plan.delete] == [pack(1, age=None).key]
    assert plan.missing == (pid(2),)


def test_partly_used_packs_report_their_unused_bytes() -> None:
    whole = pack(1, age=timedelta(days=3), size=1000)
    plan = plan_prune(
        [whole, pack(2, age=timedelta(days=3), size=500)],
        usage((1, 0, 300), (1, 300, 200), (1, 300, 200), (2, 0, 500)),
        now=NOW,
        grace=GRACE,
    )
    assert plan.partly_used == ((whole, 500),)  # the repeated row counts once
    assert plan.delete == ()


@pytest.mark.parametrize(
    ("wall", "observed", "expected"),
    [
        (NOW, [], NOW),  # nothing observed: our clock
        (NOW, [None, None], NOW),
        (NOW, [NOW - timedelta(days=2), NOW - timedelta(seconds=5)], NOW - timedelta(seconds=5)),
        # the store's clock runs ahead: ours is the younger reading
        (NOW, [NOW + timedelta(hours=3)], NOW),
        # ours runs ahead by two days: the store's newest stamp bounds it
        (NOW + timedelta(days=2), [NOW, NOW - timedelta(hours=1), None], NOW),
    ],
)
def test_store_now_is_the_younger_reading(
    wall: datetime, observed: list[datetime | None], expected: datetime
) -> None:
    assert store_now(wall, observed) == expected


def test_a_fast_local_clock_does_not_age_fresh_uploads() -> None:
    """Our clock two days ahead of the store: a pack uploaded a minute ago by the store's clock
    would look two days old by ours. Measured from the store's newest stamp, it is young."""
    fresh = pack(1, age=timedelta(minutes=1))
    lease_renewed = NOW  # the LEASE object we just renewed, by the store's clock
    now = store_now(NOW + timedelta(days=2), [fresh.last_modified, lease_renewed])
    plan = plan_prune([fresh], PackUsage(), now=now, grace=GRACE)
    assert plan.young == (fresh,)
    naive = plan_prune([fresh], PackUsage(), now=NOW + timedelta(days=2), grace=GRACE)
    assert naive.delete == (fresh,)  # what trusting our clock alone would have done


def test_usage_from_manifests_counts_each_chunk_once() -> None:
    c1, c2, c3 = "1" * 64, "2" * 64, "3" * 64
    where = {
        c1: ChunkLocation(pid(1), 0, 10, 50),
        c2: ChunkLocation(pid(1), 10, 20, 50),
        c3: ChunkLocation(pid(2), 0, 7, 9),
    }
    used = PackUsage()
    used.add(manifest(SNAP_A, {"a": (c1, c2)}, where))
    used.add(manifest(SNAP_B, {"b": (c2, c3), "c": (c2,)}, where))
    assert pid(1) in used
    assert pid(3) not in used
    assert used.used_bytes(pid(1)) == 30
    assert used.used_bytes(pid(2)) == 7
    assert used.used_bytes(pid(3)) == 0
