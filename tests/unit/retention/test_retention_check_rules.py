"""Check's pure rules: the read-data subset window, the least size of a pack, which files a bad
pack or chunk affects, verifying a downloaded pack, and one line per affected file."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.snapshot.check import (
    Affected,
    Problem,
    UsedChunk,
    affected_files,
    pack_position,
    required_size,
    subset_window,
    used_chunks,
    verify_pack,
)
from mushroom_backup.snapshot.manifest import ChunkLocation, Manifest
from mushroom_backup.snapshot.pack import FOOTER_SIZE, PackBuilder, compress_chunk

if TYPE_CHECKING:
    from tests.unit.retention.retention_support import manifest
else:
    from retention_support import manifest

EPOCH_DAY = datetime(1970, 1, 1, 12, tzinfo=UTC)
S1 = "20261128T100000.000Z-00000001"
S2 = "20261129T100000.000Z-00000002"


@pytest.mark.parametrize(
    ("percent", "day", "index", "count", "start", "end"),
    [
        (10, 0, 0, 10, 0.0, 0.1),
        (10, 3, 3, 10, 0.3, 0.4),
        (10, 13, 3, 10, 0.3, 0.4),  # ten days later, the same window again
        (30, 3, 3, 4, 0.9, 1.0),  # the last window is shorter
        (100, 12345, 0, 1, 0.0, 1.0),
        (0.5, 250, 50, 200, 0.25, 0.255),
        (33.3, 0, 0, 4, 0.0, 0.333),
    ],
)
def test_subset_window(
    percent: float, day: int, index: int, count: int, start: float, end: float
) -> None:
    window = subset_window(percent, EPOCH_DAY + timedelta(days=day))
    assert (window.index, window.count) == (index, count)
    assert window.start == pytest.approx(start)
    assert window.end == pytest.approx(end)


def test_subset_windows_cover_every_pack_once_per_cycle() -> None:
    ids = [hashlib.sha256(str(n).encode()).hexdigest() for n in range(2000)]
    for percent in (7, 10, 25, 40):
        first = subset_window(percent, EPOCH_DAY)
        hits: dict[str, int] = dict.fromkeys(ids, 0)
        for day in range(first.count):
            window = subset_window(percent, EPOCH_DAY + timedelta(days=day))
            for pack_id in ids:
                hits[pack_id] += window.contains(pack_id)
        assert set(hits.values()) == {1}
        # a window holds about its share of the packs
        one_day = subset_window(percent, EPOCH_DAY)
        share = sum(one_day.contains(p) for p in ids) / len(ids)
        assert share == pytest.approx(percent / 100, abs=0.04)


def test_subset_window_uses_the_utc_day_and_rejects_bad_percentages() -> None:
    late_local = datetime(1970, 1, 2, 1, 0, tzinfo=UTC).astimezone(timezone(timedelta(hours=5)))
    assert subset_window(10, late_local).index == 1
    for bad in (0, -5, 100.5):
        with pytest.raises(ValueError, match="percentage"):
            subset_window(bad, EPOCH_DAY)


def test_pack_position() -> None:
    assert pack_position("0" * 64) == 0.0
    assert pack_position("8" + "0" * 63) == 0.5
    assert pack_position("f" * 64) < 1.0


# --- manifests -> packs and files --------------------------------------------------------------

C = [f"{n:x}" * 64 for n in range(1, 6)]
PA, PB = "a" * 64, "b" * 64
WHERE = {
    C[0]: ChunkLocation(PA, 0, 40, 100),
    C[1]: ChunkLocation(PA, 40, 30, 100),
    C[2]: ChunkLocation(PB, 0, 10, 7),
    C[3]: ChunkLocation(PB, 10, 25, 9),
}


def two_snapshots() -> list[Manifest]:
    old = manifest(S1, {"t/a": (C[0], C[1]), "t/b": (C[2],)}, WHERE)
    new = manifest(S2, {"t/a": (C[0],), "t/c": (C[3], C[2]), "t/d": ()}, WHERE)
    return [old, new]


def test_required_size_is_the_last_used_byte_plus_footer_and_trailer() -> None:
    old, new = two_snapshots()
    need = required_size([old, new])
    assert need == {PA: 70 + FOOTER_SIZE + 1, PB: 35 + FOOTER_SIZE + 1}
    assert required_size([old]) == {PA: 70 + FOOTER_SIZE + 1, PB: 10 + FOOTER_SIZE + 1}


def test_affected_files_by_pack_and_by_chunk() -> None:
    manifests = two_snapshots()
    by_pack = affected_files(manifests, packs=frozenset({PB}))
    assert by_pack == (Affected(S1, "t/b"), Affected(S2, "t/c"))
    by_chunk = affected_files(manifests, chunks=frozenset({(PA, C[1])}))
    assert by_chunk == (Affected(S1, "t/a"),)
    # the same chunk id in another pack is another chunk
    assert affected_files(manifests, chunks=frozenset({(PB, C[1])})) == ()


def test_used_chunks_are_listed_once_per_offset() -> None:
    used = used_chunks(two_snapshots())
    assert sorted(used[PA]) == [0, 40]
    assert sorted(used[PB]) == [0, 10]
    assert used[PB][10].chunk_id == C[3]


def test_problem_lines_name_snapshot_and_file() -> None:
    problem = Problem(
        "pack-missing",
        "data/aa/" + PA,
        "pack is missing",
        (Affected(S1, "t/a"), Affected(S2, "t/a"), Affected(S2)),
    )
    assert problem.lines() == [
        f"snapshot {S1} file 't/a': pack is missing",
        f"snapshot {S2} file 't/a': pack is missing",
        f"snapshot {S2}: pack is missing",
    ]
    assert Problem("latest", "LATEST", "is not JSON").lines() == ["LATEST: is not JSON"]


# --- verifying a downloaded pack ---------------------------------------------------------------


def real_pack() -> tuple[str, bytes, list[UsedChunk]]:
    builder = PackBuilder()
    for n in range(3):
        data = bytes([n]) * 3000 + hashlib.sha256(bytes([n])).digest()
        builder.add(hashlib.sha256(data).hexdigest(), compress_chunk(data, 3), len(data))
    sealed = builder.seal()
    where = {
        c.chunk_id: ChunkLocation(sealed.pack_id, c.offset, c.length, c.raw_length)
        for c in sealed.chunks
    }
    files = {f"f{n}": (c.chunk_id,) for n, c in enumerate(sealed.chunks)}
    (used,) = used_chunks([manifest(S1, files, where)]).values()
    return sealed.pack_id, sealed.data, sorted(used.values(), key=lambda c: c.offset)


def test_an_intact_pack_verifies() -> None:
    pack_id, data, rows = real_pack()
    assert verify_pack(pack_id, data, rows) == (None, [])


def test_a_flipped_byte_names_the_chunk_and_the_pack() -> None:
    pack_id, data, rows = real_pack()
    damaged = bytearray(data)
    damaged[rows[1].offset + rows[1].length // 2] ^= 0xFF
    whole, bad = verify_pack(pack_id, bytes(damaged), rows)
    assert whole is not None
    assert "do not match its name" in whole
    assert [chunk_id for chunk_id, _ in bad] == [rows[1].chunk_id]


def test_a_damaged_trailer_leaves_the_chunks_intact() -> None:
    pack_id, data, rows = real_pack()
    damaged = data[: -FOOTER_SIZE - 3] + b"xyz" + data[-FOOTER_SIZE:]
    whole, bad = verify_pack(pack_id, damaged, rows)
    assert whole is not None
    assert bad == []


def test_a_truncated_pack_names_the_chunks_past_its_end() -> None:
    pack_id, data, rows = real_pack()
    whole, bad = verify_pack(pack_id, data[: rows[2].offset + 5], rows)
    assert whole is not None
    assert [chunk_id for chunk_id, _ in bad] == [rows[2].chunk_id]
    assert "beyond the end" in bad[0][1]
