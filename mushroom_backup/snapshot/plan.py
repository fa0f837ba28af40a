"""Decisions of backup and restore, as plain functions of their inputs (no I/O, no clock).

* :func:`unchanged` / :func:`plan_files` -- which files can reuse the parent snapshot's chunk
  list without being read: same size, mtime_ns, ctime_ns and inode as the parent recorded, and
  the parent did not flag the file unstable.
* :class:`ChunkIndex` -- which chunks are new: the parent snapshot's chunk table (the chunks
  known to be stored) plus what this snapshot stored so far. A chunk in neither is new.
* :func:`plan_restore` -- how to fetch what a restore needs: the files' chunks in file order,
  cut into *runs* (one ranged GET each) of chunks that lie close together in one pack, with a
  small cache for chunks used more than once (e.g. the zero pages of a database file), so a
  repeated chunk is fetched once while it fits the cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .manifest import ChunkLocation, FileEntry, Manifest
from .pack import SealedPack
from .scan import ScannedEntry

# --- backup ------------------------------------------------------------------------------------


def unchanged(scanned: ScannedEntry, previous: FileEntry) -> bool:
    """Whether a file may keep the chunk list the parent recorded without being read."""
    return (
        not previous.unstable
        and scanned.size == previous.size
        and scanned.mtime_ns == previous.mtime_ns
        and scanned.ctime_ns == previous.ctime_ns
        and scanned.inode == previous.inode
    )


@dataclass(frozen=True, slots=True)
class FilePlan:
    """``reuse``: path -> the parent's entry, taken as is; ``read``: files to read, in path
    order."""

    reuse: Mapping[str, FileEntry]
    read: tuple[ScannedEntry, ...]


def plan_files(scanned: Sequence[ScannedEntry], parent: Manifest | None) -> FilePlan:
    """Split the scanned files into those reused from ``parent`` and those to read."""
    previous: dict[str, FileEntry] = {}
    if parent is not None:
        previous = {e.path: e for e in parent.entries if isinstance(e, FileEntry)}
    reuse: dict[str, FileEntry] = {}
    read: list[ScannedEntry] = []
    for entry in scanned:
        if entry.kind != "file":
            continue
        old = previous.get(entry.path)
        if old is not None and unchanged(entry, old):
            reuse[entry.path] = old
        else:
            read.append(entry)
    return FilePlan(reuse, tuple(read))


@dataclass
class ChunkIndex:
    """Which chunks are stored: ``known`` (the parent's chunk table), chunks this snapshot
    sealed into packs (with their locations), and ``pending`` ones waiting in the open pack.

    Read from worker threads while the event loop adds to it: lookups and inserts are single
    dict/set operations, which CPython performs atomically."""

    known: Mapping[str, ChunkLocation] = field(default_factory=dict)
    stored: dict[str, ChunkLocation] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)

    def is_new(self, chunk_id: str) -> bool:
        return not (chunk_id in self.known or chunk_id in self.stored or chunk_id in self.pending)

    def add_pending(self, chunk_id: str) -> None:
        self.pending.add(chunk_id)

    def add_pack(self, pack: SealedPack) -> None:
        for chunk in pack.chunks:
            self.stored[chunk.chunk_id] = ChunkLocation(
                pack.pack_id, chunk.offset, chunk.length, chunk.raw_length
            )
            self.pending.discard(chunk.chunk_id)

    def location(self, chunk_id: str) -> ChunkLocation:
        """Where a stored chunk is (KeyError for one never stored or still pending)."""
        found = self.stored.get(chunk_id)
        return found if found is not None else self.known[chunk_id]


# --- restore -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchRange:
    """The bytes a run needs from one pack: ``length`` bytes at ``start`` of ``pack_id``,
    downloaded as part of span number ``span`` of the plan."""

    pack_id: str
    start: int
    length: int
    span: int = -1


@dataclass(frozen=True, slots=True)
class FetchSpan:
    """One ranged GET, shared by the ranges of consecutive runs: ``length`` bytes at ``start``
    of ``pack_id``, needed from run ``first_run`` to run ``last_run``."""

    pack_id: str
    start: int
    length: int
    first_run: int
    last_run: int


@dataclass(frozen=True, slots=True)
class RestoreItem:
    """One chunk of one file, in restore order.

    ``fetch`` is ``(range, offset in that range's bytes, stored length)`` -- ``range`` indexes
    the run's :attr:`RestoreRun.ranges` -- or None when the bytes come from the cache (an
    earlier item kept them). ``keep``: put the bytes in the cache for a later item;
    ``release``: this is the cached chunk's last use, drop it afterwards."""

    file: int
    index: int
    chunk_id: str
    raw_length: int
    fetch: tuple[int, int, int] | None
    keep: bool = False
    release: bool = False


@dataclass(frozen=True, slots=True)
class RestoreRun:
    """Consecutive items, served by a few ranged GETs (at most one per pack) and the cache."""

    ranges: tuple[FetchRange, ...]
    items: tuple[RestoreItem, ...]

    @property
    def raw_length(self) -> int:
        return sum(item.raw_length for item in self.items)


@dataclass
class _Range:
    pack_id: str
    start: int
    end: int


@dataclass
class _OpenRun:
    ranges: list[_Range] = field(default_factory=list)
    by_pack: dict[str, int] = field(default_factory=dict)
    raw: int = 0
    stored: int = 0
    items: list[RestoreItem] = field(default_factory=list)

    def place(
        self, location: ChunkLocation, *, max_bytes: int, max_gap: int, max_ranges: int
    ) -> tuple[int, int] | None:
        """Where the chunk's frame would be fetched in this run -- (range, offset in it) --
        extending or adding a range, or None if it does not fit: then close the run."""
        if self.raw + location.raw_length > max_bytes and self.items:
            return None
        index = self.by_pack.get(location.pack_id)
        if index is None:
            if len(self.ranges) >= max_ranges or self.stored + location.length > max_bytes:
                return None if self.items else self._add(location)
            return self._add(location)
        span = self.ranges[index]
        if span.start <= location.offset and location.offset + location.length <= span.end:
            return index, location.offset - span.start  # already downloaded in this run
        grows = location.offset + location.length - span.end
        if not span.end <= location.offset <= span.end + max_gap:
            return None
        if self.stored + grows > max_bytes:
            return None
        span.end += grows
        self.stored += grows
        return index, location.offset - span.start

    def _add(self, location: ChunkLocation) -> tuple[int, int]:
        self.by_pack[location.pack_id] = len(self.ranges)
        end = location.offset + location.length
        self.ranges.append(_Range(location.pack_id, location.offset, end))
        self.stored += location.length
        return len(self.ranges) - 1, 0

    def close(self) -> RestoreRun:
        ranges = tuple(FetchRange(r.pack_id, r.start, r.end - r.start) for r in self.ranges)
        return RestoreRun(ranges, tuple(self.items))


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """The runs, in restore order, and the GETs (spans) that serve their ranges."""

    runs: tuple[RestoreRun, ...]
    spans: tuple[FetchSpan, ...]


@dataclass
class _OpenSpan:
    index: int
    pack_id: str
    start: int
    end: int
    first_run: int
    last_run: int


def plan_spans(
    runs: Sequence[RestoreRun], *, max_span_bytes: int, max_gap: int, reach: int
) -> RestorePlan:
    """Serve the ranges of consecutive runs by shared GETs.

    A range joins its pack's latest span if that span was used no more than ``reach`` runs
    before, and the range lies inside it, or at or after its end no more than ``max_gap``
    bytes further without the span growing beyond ``max_span_bytes``; otherwise it starts a new
    span. So a pack read front to back by many runs (a large file) costs one GET, not one per
    run, and a span lives only for a few consecutive runs (its bytes are held until its last
    run is written)."""
    latest: dict[str, _OpenSpan] = {}
    opened: list[_OpenSpan] = []
    planned: list[RestoreRun] = []
    for run_index, run in enumerate(runs):
        ranges = []
        for piece in run.ranges:
            end = piece.start + piece.length
            span = latest.get(piece.pack_id)
            joins = (
                span is not None
                and run_index - span.last_run <= reach
                and (
                    (span.start <= piece.start and end <= span.end)
                    or (
                        span.end <= piece.start <= span.end + max_gap
                        and end - span.start <= max_span_bytes
                    )
                )
            )
            if span is None or not joins:
                span = _OpenSpan(len(opened), piece.pack_id, piece.start, end, run_index, run_index)
                latest[piece.pack_id] = span
                opened.append(span)
            span.end = max(span.end, end)
            span.last_run = run_index
            ranges.append(FetchRange(piece.pack_id, piece.start, piece.length, span.index))
        planned.append(RestoreRun(tuple(ranges), run.items))
    spans = tuple(
        FetchSpan(s.pack_id, s.start, s.end - s.start, s.first_run, s.last_run) for s in opened
    )
    return RestorePlan(tuple(planned), spans)


def plan_restore(
    files: Sequence[FileEntry],
    chunks: Mapping[str, ChunkLocation],
    *,
    max_run_bytes: int,
    max_gap: int,
    max_ranges: int,
    cache_bytes: int,
) -> list[RestoreRun]:
    """The runs that restore ``files`` (in this order, each file's chunks in order); see
    :func:`plan_spans` for the GETs that serve them.

    A run holds at most ``max_ranges`` ranges, one per pack. The next fetched chunk joins the
    run if its pack's range can grow to cover it -- it lies at or after the range's end, no
    more than ``max_gap`` bytes further (the gap is downloaded and ignored) -- or if its pack
    has no range in the run yet and one more fits; and if neither the run's raw bytes nor its
    downloaded bytes then exceed ``max_run_bytes`` (a single larger chunk is a run of its own).
    So a file rewritten in places costs one range for its old pack plus one for the new
    chunks per run, not a new run at every change. A chunk used again later is kept in a
    cache while the cache's raw bytes stay within ``cache_bytes``; later uses read it from
    there, the last one releases it."""
    remaining = Counter(chunk_id for entry in files for chunk_id in entry.chunks)
    cached: dict[str, int] = {}
    cache_used = 0
    runs: list[RestoreRun] = []
    run = _OpenRun()
    for file_index, entry in enumerate(files):
        for index, chunk_id in enumerate(entry.chunks):
            location = chunks[chunk_id]
            remaining[chunk_id] -= 1
            last_use = remaining[chunk_id] == 0
            if chunk_id in cached:
                if last_use:
                    cache_used -= cached.pop(chunk_id)
                run.items.append(
                    RestoreItem(
                        file_index, index, chunk_id, location.raw_length, None, release=last_use
                    )
                )
                run.raw += location.raw_length
                continue
            keep = not last_use and cache_used + location.raw_length <= cache_bytes
            if keep:
                cached[chunk_id] = location.raw_length
                cache_used += location.raw_length
            limits = {"max_bytes": max_run_bytes, "max_gap": max_gap, "max_ranges": max_ranges}
            placed = run.place(location, **limits)
            if placed is None:
                runs.append(run.close())
                run = _OpenRun()
                placed = run.place(location, **limits)
                assert placed is not None  # an empty run takes any chunk
            range_index, offset = placed
            run.items.append(
                RestoreItem(
                    file_index,
                    index,
                    chunk_id,
                    location.raw_length,
                    (range_index, offset, location.length),
                    keep,
                )
            )
            run.raw += location.raw_length
    if run.items:
        runs.append(run.close())
    return runs
