"""Pure decisions: change detection against the parent, which chunks are new, restore runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mushroom_backup.snapshot.manifest import ChunkLocation, FileEntry
from mushroom_backup.snapshot.pack import PackedChunk, SealedPack
from mushroom_backup.snapshot.plan import (
    ChunkIndex,
    FetchRange,
    RestoreItem,
    RestoreRun,
    plan_files,
    plan_restore,
    plan_spans,
    unchanged,
)
from mushroom_backup.snapshot.scan import ScannedEntry

SCANNED = ScannedEntry(
    path="base/1",
    kind="file",
    mode=0o600,
    mtime_ns=100,
    ctime_ns=200,
    size=4096,
    inode=7,
    dev=1,
    uid=0,
    gid=0,
)


def _entry(path: str, chunks: tuple[str, ...] = (), size: int = 4096, **extra: object) -> FileEntry:
    fields: dict[str, object] = {
        "type": "file",
        "path": path,
        "mode": 0o600,
        "mtime_ns": 100,
        "size": size,
        "sha256": "f" * 64,
        "chunks": chunks,
        "inode": 7,
        "dev": 1,
        "ctime_ns": 200,
        "uid": 0,
        "gid": 0,
    }
    fields.update(extra)
    return FileEntry.model_validate(fields)


PREVIOUS = _entry("base/1")


@pytest.mark.parametrize(
    ("scanned", "previous", "expected"),
    [
        (SCANNED, PREVIOUS, True),
        (replace(SCANNED, size=4097), PREVIOUS, False),
        (replace(SCANNED, mtime_ns=101), PREVIOUS, False),
        (replace(SCANNED, ctime_ns=201), PREVIOUS, False),  # chmod, or mtime set back
        (replace(SCANNED, inode=8), PREVIOUS, False),  # replaced by rename
        (replace(SCANNED, dev=2), PREVIOUS, True),  # dev numbers change across reboots
        (replace(SCANNED, mode=0o644), PREVIOUS, True),  # (a chmod changes ctime as well)
        (SCANNED, PREVIOUS.model_copy(update={"unstable": True}), False),
    ],
)
def test_unchanged(scanned: ScannedEntry, previous: FileEntry, expected: bool) -> None:
    assert unchanged(scanned, previous) is expected


def test_plan_files_reuses_only_unchanged_files() -> None:
    scanned = [
        replace(SCANNED, path="a", kind="dir", size=0),
        replace(SCANNED, path="a/same"),
        replace(SCANNED, path="a/touched", mtime_ns=999),
        replace(SCANNED, path="a/new"),
        replace(SCANNED, path="a/link", kind="symlink", target="same"),
    ]

    class Parent:
        entries = (_entry("a/same"), _entry("a/touched"), _entry("a/gone"))

    plan = plan_files(scanned, Parent())  # type: ignore[arg-type]
    assert list(plan.reuse) == ["a/same"]
    assert plan.reuse["a/same"] is Parent.entries[0]
    assert [e.path for e in plan.read] == ["a/touched", "a/new"]
    first = plan_files(scanned, None)
    assert first.reuse == {}
    assert [e.path for e in first.read] == ["a/same", "a/touched", "a/new"]


def test_chunk_index_new_pending_stored() -> None:
    known = {"k" * 64: ChunkLocation("p" * 64, 0, 1, 1)}
    index = ChunkIndex(known=known)
    assert not index.is_new("k" * 64)
    assert index.is_new("n" * 64)
    index.add_pending("n" * 64)
    assert not index.is_new("n" * 64)
    pack = SealedPack("q" * 64, b"", (PackedChunk("n" * 64, 5, 6, 7),))
    index.add_pack(pack)
    assert not index.is_new("n" * 64)
    assert index.pending == set()
    assert index.location("n" * 64) == ChunkLocation("q" * 64, 5, 6, 7)
    assert index.location("k" * 64) == known["k" * 64]
    with pytest.raises(KeyError):
        index.location("z" * 64)


# --- restore runs ----------------------------------------------------------------------------

A, B, C, D, Z, N = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "0" * 64, "e" * 64)
P, Q, R = ("p" * 64, "q" * 64, "r" * 64)
LOCATIONS = {
    A: ChunkLocation(P, 0, 10, 100),
    B: ChunkLocation(P, 10, 10, 100),
    C: ChunkLocation(P, 50, 10, 100),  # 30 bytes after B's end
    D: ChunkLocation(Q, 0, 10, 100),
    Z: ChunkLocation(Q, 10, 5, 100),
    N: ChunkLocation(R, 0, 10, 100),  # a rewritten chunk, stored in a newer pack
}

Shape = list[tuple[list[tuple[str, int, int]], list[str]]]


def _files(*chunk_lists: tuple[str, ...]) -> list[FileEntry]:
    return [_entry(f"f{i}", chunks, 100 * len(chunks)) for i, chunks in enumerate(chunk_lists)]


def _shape(runs: list[RestoreRun]) -> Shape:
    """([(pack, start, length)], [chunk or 'cache:chunk']) per run, for readable tables."""
    return [
        (
            [(r.pack_id[:1], r.start, r.length) for r in run.ranges],
            [i.chunk_id[:1] if i.fetch else "cache:" + i.chunk_id[:1] for i in run.items],
        )
        for run in runs
    ]


def _plan(
    files: list[tuple[str, ...]], max_run: int = 1000, gap: int = 0, ranges: int = 4, cache: int = 0
) -> Shape:
    return _shape(
        plan_restore(
            _files(*files),
            LOCATIONS,
            max_run_bytes=max_run,
            max_gap=gap,
            max_ranges=ranges,
            cache_bytes=cache,
        )
    )


@pytest.mark.parametrize(
    ("files", "limits", "expected"),
    [
        # adjacent chunks of one pack, across files: one range
        ([(A,), (B,)], {}, [([("p", 0, 20)], ["a", "b"])]),
        # a gap within the allowance is downloaded and skipped
        ([(A, B, C)], {"gap": 30}, [([("p", 0, 60)], ["a", "b", "c"])]),
        # ... and beyond it ends the run
        ([(A, B, C)], {"gap": 29}, [([("p", 0, 20)], ["a", "b"]), ([("p", 50, 10)], ["c"])]),
        # another pack adds a range to the run
        ([(A, D)], {}, [([("p", 0, 10), ("q", 0, 10)], ["a", "d"])]),
        # ... unless the run has all the ranges it may have
        ([(A, D)], {"ranges": 1}, [([("p", 0, 10)], ["a"]), ([("q", 0, 10)], ["d"])]),
        # a file rewritten in the middle: the old pack's range steps over the replaced chunk
        ([(A, N, C)], {"gap": 40}, [([("p", 0, 60), ("r", 0, 10)], ["a", "e", "c"])]),
        # going backwards in a pack ends the run
        ([(B, A)], {}, [([("p", 10, 10)], ["b"]), ([("p", 0, 10)], ["a"])]),
        # a chunk already inside the run's range is not downloaded twice
        ([(A, B), (A,)], {}, [([("p", 0, 20)], ["a", "b", "a"])]),
        # the raw size bound ends runs (a single chunk always fits)
        ([(A, B)], {"max_run": 150}, [([("p", 0, 10)], ["a"]), ([("p", 10, 10)], ["b"])]),
        ([(A,)], {"max_run": 50}, [([("p", 0, 10)], ["a"])]),
        # a repeated chunk (zero pages) is fetched once and served from the cache
        (
            [(Z, D, Z, Z)],
            {"cache": 1000},
            [([("q", 10, 5)], ["0"]), ([("q", 0, 10)], ["d", "cache:0", "cache:0"])],
        ),
        # ... unless the cache is too small: then it is fetched again
        ([(Z, D, Z)], {"cache": 99}, [([("q", 10, 5)], ["0"]), ([("q", 0, 15)], ["d", "0"])]),
        ([], {}, []),
    ],
)
def test_plan_restore_runs(
    files: list[tuple[str, ...]], limits: dict[str, int], expected: Shape
) -> None:
    assert _plan(files, **limits) == expected


def test_plan_restore_items_know_their_range_offset_and_cache_lifetime() -> None:
    runs = plan_restore(
        _files((Z, A), (Z,), (B,)),
        LOCATIONS,
        max_run_bytes=1000,
        max_gap=0,
        max_ranges=4,
        cache_bytes=1000,
    )
    items = [item for run in runs for item in run.items]
    assert items == [
        RestoreItem(0, 0, Z, 100, (0, 0, 5), keep=True),
        RestoreItem(0, 1, A, 100, (1, 0, 10)),
        RestoreItem(1, 0, Z, 100, None, release=True),
        RestoreItem(2, 0, B, 100, (1, 10, 10)),
    ]


def test_cached_chunks_ride_along_with_the_current_run() -> None:
    assert _plan([(Z, D), (Z,)], max_run=100, cache=1000) == [
        ([("q", 10, 5)], ["0"]),
        ([("q", 0, 10)], ["d", "cache:0"]),
    ]
    assert _plan([(D, Z, Z)], max_run=100, cache=1000)[-1] == ([("q", 10, 5)], ["0", "cache:0"])


# --- spans: GETs shared by consecutive runs ---------------------------------------------------


def _run(*ranges: tuple[str, int, int]) -> RestoreRun:
    return RestoreRun(tuple(FetchRange(p * 64, s, n) for p, s, n in ranges), ())


@pytest.mark.parametrize(
    ("runs", "limits", "expected_spans", "expected_ranges"),
    [
        # a pack read front to back by consecutive runs: one GET
        (
            [_run(("p", 0, 10)), _run(("p", 10, 10)), _run(("p", 20, 5))],
            {},
            [("p", 0, 25, 0, 2)],
            [[0], [0], [0]],
        ),
        # ... but no bigger than max_span_bytes
        (
            [_run(("p", 0, 10)), _run(("p", 10, 10)), _run(("p", 20, 5))],
            {"max_span_bytes": 20},
            [("p", 0, 20, 0, 1), ("p", 20, 5, 2, 2)],
            [[0], [0], [1]],
        ),
        # rewritten chunks in a newer pack, one per run: one GET for them too
        (
            [_run(("p", 0, 10), ("r", 0, 3)), _run(("p", 12, 10), ("r", 3, 3))],
            {"max_gap": 2},
            [("p", 0, 22, 0, 1), ("r", 0, 6, 0, 1)],
            [[0, 1], [0, 1]],
        ),
        # a span is not kept for a far later run (its bytes would be held all along)
        (
            [_run(("p", 0, 10)), _run(("q", 0, 10)), _run(("q", 10, 10)), _run(("p", 10, 10))],
            {"reach": 2},
            [("p", 0, 10, 0, 0), ("q", 0, 20, 1, 2), ("p", 10, 10, 3, 3)],
            [[0], [1], [1], [2]],
        ),
        # a gap beyond the allowance, or going backwards, starts a new span
        (
            [_run(("p", 0, 10)), _run(("p", 30, 10)), _run(("p", 0, 5))],
            {"max_gap": 19},
            [("p", 0, 10, 0, 0), ("p", 30, 10, 1, 1), ("p", 0, 5, 2, 2)],
            [[0], [1], [2]],
        ),
        # a range inside the span already downloaded reuses it
        (
            [_run(("p", 0, 30)), _run(("p", 10, 10))],
            {},
            [("p", 0, 30, 0, 1)],
            [[0], [0]],
        ),
    ],
)
def test_plan_spans(
    runs: list[RestoreRun],
    limits: dict[str, int],
    expected_spans: list[tuple[str, int, int, int, int]],
    expected_ranges: list[list[int]],
) -> None:
    settings = {"max_span_bytes": 1000, "max_gap": 0, "reach": 1, **limits}
    plan = plan_spans(runs, **settings)
    assert [
        (s.pack_id[:1], s.start, s.length, s.first_run, s.last_run) for s in plan.spans
    ] == expected_spans
    assert [[r.span for r in run.ranges] for run in plan.runs] == expected_ranges
    for run, original in zip(plan.runs, runs, strict=True):  # ranges themselves unchanged
        assert [(r.pack_id, r.start, r.length) for r in run.ranges] == [
            (r.pack_id, r.start, r.length) for r in original.ranges
        ]
