"""Restoring a snapshot into a directory, or verifying it without writing anything.

:func:`restore_snapshot` reads the manifest (strictly validated: an absolute path, ``..``, an
entry below a symlink is :class:`~mushroom_backup.errors.UnsafePath` before anything is
written), then:

1. creates the directories (owner-only at first, so that read-only ones can be filled),
   while the first ranges download (no file is written before they all exist),
2. restores the files. The files' chunks, in order, are cut into *runs* of up to 8 MiB that
   take one range from each of at most four packs (:func:`.plan.plan_restore`); the ranges
   of consecutive runs are served by shared ranged GETs of up to 8 MiB (*spans*,
   :func:`.plan.plan_spans`), so a pack read front to back costs one GET. Each run's chunks
   are decompressed and checked against their SHA-256 on ``workers`` threads. Each file is
   then written by one of ``max(2, workers)`` writer threads (*lanes*; the one with the least
   queued when the file's first chunk arrives), in order, to a temporary name in its
   directory while hashing it; the lane checks the whole-file SHA-256, sets mode, owner (when
   run as root) and mtime, and renames it into place. Different files are written and
   hashed in parallel (creating a file costs ~1 ms of kernel CPU on the bench VM), and the
   runs' consumer does not wait for the writes: a run's bytes count against the budget
   until its lanes wrote them,
3. creates the symlinks (as links, never followed) the same way, via a temporary name,
4. sets the directories' modes and mtimes, deepest first.

Promises
--------
* Nothing half-written is ever left under a final name: a file appears under its name only
  complete and verified. On any failure -- a missing pack, a truncated object, a chunk or file
  hash mismatch (:class:`~mushroom_backup.errors.IntegrityError`, exit 5, naming the file and
  the object), a store error, cancellation -- the temporary file in progress is removed; files
  already renamed into place are complete and verified.
* A non-empty target is refused unless ``force``; with ``force`` files are replaced (via
  rename), other existing files are left alone, and an existing symlink where the manifest has a
  directory is refused (UnsafePath): restore never writes through a symlink.
* ``verify_only`` downloads, decompresses and checks every chunk and every whole file, and
  writes nothing (no target is needed).
* Memory is bounded: runs of at most 8 MiB of raw data, at most ``download_concurrency`` of
  them in flight and at most 48 MiB of runs and of the spans they hold (a span lives from its
  first run to its last, at most three runs apart), except that one run is always admitted
  when none is in flight (so a run whose spans alone exceed the budget still progresses);
  plus a cache of at most 16 MiB for chunks used more than once.

Not promised: restoring hard links (each name is its own file), sparse regions (written as
zeros), extended attributes or ACLs, atime (set to the mtime), ``fsync`` of restored files (run
``sync`` before relying on them after a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import stat
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import IntegrityError, NotFound, SnapshotError, UnsafePath, UsageError
from ..store.base import ObjectStore
from .catalog import Sleep, get_range_retrying, load_manifest, read_latest
from .manifest import DirEntry, FileEntry, Manifest, SymlinkEntry
from .metered import MeteredStore
from .pack import decompress_chunk, pack_key
from .plan import FetchSpan, RestorePlan, RestoreRun, plan_restore, plan_spans
from .progress import NoProgress, ProgressSink

KiB = 1024
MiB = 1024 * KiB
MAX_RUN_BYTES = 8 * MiB
MAX_GAP = 1 * MiB
MAX_RANGES = 4
MAX_SPAN_BYTES = 8 * MiB
SPAN_REACH = 2
BUFFER_BYTES = 48 * MiB
CACHE_BYTES = 16 * MiB
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

log = logging.getLogger("mushroom_backup.snapshot")


@dataclass(frozen=True)
class RestoreResult:
    snapshot_id: str
    files: int
    dirs: int
    symlinks: int
    bytes: int
    bytes_downloaded: int
    requests: int
    duration_s: float
    verify_only: bool


def _temp_name(directory: str) -> str:
    return os.path.join(directory, f".mushroom-restore-{secrets.token_hex(8)}.tmp")


def _as_root() -> bool:
    return os.geteuid() == 0


# --- the target --------------------------------------------------------------------------------


def _prepare_target(target: Path, force: bool) -> str:
    """The target's real path, created if absent; refuse a non-empty one without ``force``."""
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise UsageError(f"restore target {target} exists and is not a directory")
        if not force and any(target.iterdir()):
            raise UsageError(
                f"restore target {target} is not empty; restore into an empty directory, "
                "or pass --force to replace the files the snapshot contains"
            )
    else:
        target.mkdir(parents=True)
    return os.path.realpath(target)


def _make_dirs(root: str, dirs: Sequence[DirEntry]) -> None:
    """Create the directories, parents first (the manifest is sorted), refusing to go through
    an existing symlink or over a non-directory."""
    for entry in dirs:
        path = os.path.join(root, entry.path)
        try:
            os.mkdir(path, 0o700)
            continue
        except FileExistsError:
            pass
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(
                f"refusing to restore {entry.path!r}: it is a symlink in the target, and "
                "restore never writes through a symlink; remove it or restore elsewhere"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise SnapshotError(
                f"cannot restore directory {entry.path!r}: {path} exists and is not a directory"
            )


def _finish_dirs(root: str, dirs: Sequence[DirEntry]) -> None:
    for entry in reversed(dirs):
        path = os.path.join(root, entry.path)
        if _as_root():
            os.lchown(path, entry.uid, entry.gid)
        os.chmod(path, entry.mode)
        os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns))


def _place(temp: str, final: str, what: str) -> None:
    try:
        os.replace(temp, final)
    except OSError as e:
        _unlink_quietly(temp)
        raise SnapshotError(f"cannot restore {what}: {final}: {e.strerror}") from None


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _make_symlinks(root: str, links: Sequence[SymlinkEntry]) -> None:
    for entry in links:
        final = os.path.join(root, entry.path)
        temp = _temp_name(os.path.dirname(final))
        os.symlink(entry.target, temp)
        try:
            if _as_root():
                os.lchown(temp, entry.uid, entry.gid)
            os.utime(temp, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
        except BaseException:
            _unlink_quietly(temp)
            raise
        _place(temp, final, f"symlink {entry.path!r}")


# --- writing files -----------------------------------------------------------------------------


class _OutFile:
    """One file being restored (or verified): a temporary file and the running hash."""

    def __init__(self, root: str | None, entry: FileEntry) -> None:
        self.entry = entry
        # A one-chunk file's hash is its chunk's id, already checked when it was decompressed.
        self.hasher = hashlib.sha256() if len(entry.chunks) > 1 else None
        self.fd: int | None = None
        self.temp: str | None = None
        self.final: str | None = None
        if root is not None:
            self.final = os.path.join(root, entry.path)
            self.temp = _temp_name(os.path.dirname(self.final))
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self.fd = os.open(self.temp, flags, 0o600)

    def write(self, data: bytes) -> None:
        if self.hasher is not None:
            self.hasher.update(data)
        if self.fd is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]

    def finish(self) -> None:
        entry = self.entry
        if self.hasher is not None:
            digest = self.hasher.hexdigest()
        else:
            digest = entry.chunks[0] if entry.chunks else EMPTY_SHA256
        if digest != entry.sha256:
            self.discard()
            raise IntegrityError(
                f"restoring {entry.path!r}: the restored content does not match the file's "
                "recorded SHA-256 (the manifest or the data is corrupt)"
            )
        if self.fd is None or self.temp is None or self.final is None:
            return
        try:
            if _as_root():
                os.fchown(self.fd, entry.uid, entry.gid)
            os.fchmod(self.fd, entry.mode)
            os.utime(self.fd, ns=(entry.mtime_ns, entry.mtime_ns))
        except BaseException:
            self.discard()
            raise
        os.close(self.fd)
        self.fd = None
        _place(self.temp, self.final, f"file {entry.path!r}")

    def discard(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.temp is not None:
            _unlink_quietly(self.temp)
            self.temp = None


class _Skipped(Exception):
    """A piece not written: the restore is stopping, or an earlier piece of its file failed
    (that failure is the one reported)."""


Piece = tuple[int, int, int, list[bytes]]
"""``(file, first chunk index, last chunk index, the chunks' bytes)``: consecutive chunks of one
file, as one run carries them."""


class _Lanes:
    """The writer threads. Each file is written, hashed and finished by one lane (a thread of
    its own, taking pieces first in, first out), chosen when its first chunk arrives: the lane
    with the fewest bytes queued. So a file's chunks are written and hashed in order, while
    different files are written, hashed and verified in parallel."""

    def __init__(self, root: str | None, files: Sequence[FileEntry], count: int) -> None:
        self._root = root
        self._files = files
        self._threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"mushroom-write-{i}") for i in range(count)
        ]
        self._queued = [0] * count
        self._lane_of: dict[int, int] = {}
        # Files in progress, by file index; each is touched only by its lane's thread.
        self._open: list[dict[int, _OutFile]] = [{} for _ in range(count)]
        self._stopped = False

    def submit(self, pieces: Sequence[Piece]) -> list[asyncio.Future[int]]:
        """Queue a run's pieces on their files' lanes, one batch per lane (called in plan
        order, from the event loop); each future gives the number of files completed."""
        batches: dict[int, list[Piece]] = {}
        for piece in pieces:
            file, first, last, _ = piece
            lane = self._lane_of.get(file)
            if lane is None:
                assert first == 0
                lane = min(range(len(self._threads)), key=self._queued.__getitem__)
            if last == len(self._files[file].chunks) - 1:
                self._lane_of.pop(file, None)
            else:
                self._lane_of[file] = lane
            batches.setdefault(lane, []).append(piece)
            self._queued[lane] += sum(len(c) for c in piece[3])
        return [self._start(lane, batch) for lane, batch in batches.items()]

    def _start(self, lane: int, batch: list[Piece]) -> asyncio.Future[int]:
        size = sum(len(c) for piece in batch for c in piece[3])

        def done(_: object) -> None:
            self._queued[lane] -= size

        future = asyncio.wrap_future(self._threads[lane].submit(self._write_all, lane, batch))
        future.add_done_callback(done)
        return future

    def _write_all(self, lane: int, batch: list[Piece]) -> int:
        """Lane thread: write the pieces, in order."""
        return sum(self._write(lane, piece) for piece in batch)

    def _write(self, lane: int, piece: Piece) -> int:
        """Lane thread: write one piece; finish the file after its last chunk."""
        file, first, last, chunks = piece
        open_files = self._open[lane]
        try:
            entry = self._files[file]
            if first == 0 and not self._stopped:
                open_files[file] = _OutFile(self._root, entry)
            out = open_files.get(file)
            if out is None:
                raise _Skipped  # stopping, or an earlier piece of this file failed
            for data in chunks:
                out.write(data)
            if last < len(entry.chunks) - 1:
                return 0
            del open_files[file]
            out.finish()
            return 1
        except BaseException:
            failed = open_files.pop(file, None)
            if failed is not None:
                failed.discard()
            raise

    async def close(self) -> None:
        """Stop: skip queued pieces, remove every file in progress, end the threads."""
        self._stopped = True
        loop = asyncio.get_running_loop()
        cleanups = [
            loop.run_in_executor(thread, self._discard_all, lane)
            for lane, thread in enumerate(self._threads)
        ]
        for thread in self._threads:
            thread.shutdown(wait=False)
        await asyncio.shield(asyncio.gather(*cleanups, return_exceptions=True))

    def _discard_all(self, lane: int) -> None:
        open_files = self._open[lane]
        while open_files:
            _, out = open_files.popitem()
            out.discard()


class _Cache:
    """Chunks used more than once, resolved in plan order (on the event loop)."""

    def __init__(self) -> None:
        self._chunks: dict[str, bytes] = {}

    def pieces(self, run: RestoreRun, decoded: Sequence[bytes | None]) -> list[Piece]:
        """A run's chunks, cached ones filled in, cut into pieces of one file each."""
        pieces: list[Piece] = []
        for item, fetched in zip(run.items, decoded, strict=True):
            data = self._chunks[item.chunk_id] if fetched is None else fetched
            if item.keep:
                self._chunks[item.chunk_id] = data
            if item.release:
                del self._chunks[item.chunk_id]
            if pieces and pieces[-1][0] == item.file:
                file, first, _, chunks = pieces[-1]
                chunks.append(data)
                pieces[-1] = (file, first, item.index, chunks)
            else:
                pieces.append((item.file, item.index, item.index, [data]))
        return pieces


def _restore_empty_files(root: str | None, files: Sequence[FileEntry]) -> None:
    for entry in files:
        out = _OutFile(root, entry)
        out.finish()


# --- fetching ----------------------------------------------------------------------------------


class _PackMissing(Exception):
    """A span's pack is not in the store (turned into an IntegrityError naming a file)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _decode_run(
    run: RestoreRun,
    spans: Sequence[FetchSpan],
    downloaded: Sequence[bytes],
    files: Sequence[FileEntry],
) -> list[bytes | None]:
    """The raw bytes of a run's fetched chunks (None for cached ones), each verified.
    ``downloaded`` holds the bytes of each of the run's ranges' spans."""
    views = [memoryview(data) for data in downloaded]
    out: list[bytes | None] = []
    for item in run.items:
        if item.fetch is None:
            out.append(None)
            continue
        range_index, offset, length = item.fetch
        piece = run.ranges[range_index]
        start = piece.start - spans[piece.span].start + offset
        key = pack_key(piece.pack_id)
        path = files[item.file].path
        view = views[range_index]
        if start + length > len(view):
            raise IntegrityError(
                f"restoring {path!r}: pack {key} is truncated (it ends before chunk "
                f"{item.chunk_id} does)"
            )
        where = f"restoring {path!r} from pack {key}"
        out.append(
            decompress_chunk(view[start : start + length], item.chunk_id, item.raw_length, where)
        )
    return out


class _Fetcher:
    """Downloads each span once (runs share them) and decodes each run's chunks on the worker
    pool."""

    def __init__(
        self,
        store: ObjectStore,
        plan: RestorePlan,
        files: Sequence[FileEntry],
        pool: ThreadPoolExecutor,
        sleep: Sleep,
    ) -> None:
        self._store = store
        self._plan = plan
        self._files = files
        self._pool = pool
        self._sleep = sleep
        self._spans: dict[int, asyncio.Task[bytes]] = {}

    def start(self, index: int) -> None:
        """Start downloading span ``index`` (once)."""
        if index not in self._spans:
            self._spans[index] = asyncio.create_task(self._download(self._plan.spans[index]))

    def release(self, index: int) -> None:
        """Span ``index`` is needed no more: drop its bytes."""
        self._spans.pop(index, None)

    async def cancel(self) -> None:
        tasks = list(self._spans.values())
        self._spans.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _download(self, span: FetchSpan) -> bytes:
        key = pack_key(span.pack_id)
        try:
            return await get_range_retrying(self._store, key, span.start, span.length, self._sleep)
        except NotFound:
            raise _PackMissing(key) from None

    async def __call__(self, run: RestoreRun) -> list[bytes | None]:
        downloaded = []
        for index, piece in enumerate(run.ranges):
            try:
                # Shielded: a span serves other runs too, cancelling this one must not stop it.
                downloaded.append(await asyncio.shield(self._spans[piece.span]))
            except _PackMissing as missing:
                first = next(i for i in run.items if i.fetch is not None and i.fetch[0] == index)
                raise IntegrityError(
                    f"restoring {self._files[first.file].path!r}: pack {missing.key} is "
                    "missing from the store"
                ) from None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, _decode_run, run, self._plan.spans, downloaded, self._files
        )


class _Budget:
    """Bytes of runs (and the spans they opened) in flight, at most ``limit`` -- except that
    a run is always admitted when no other run is in flight, so the plan always progresses."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._runs = 0
        self._changed = asyncio.Condition()

    async def acquire(self, amount: int) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._runs == 0 or self._used + amount <= self._limit
            )
            self._used += amount
            self._runs += 1

    async def release(self, amount: int) -> None:
        async with self._changed:
            self._used -= amount
            self._runs -= 1
            self._changed.notify_all()


async def _together(*coros: Coroutine[Any, Any, None]) -> None:
    """Run coroutines concurrently; the first failure cancels the others and is raised."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = task.exception() if task.done() and not task.cancelled() else None
            if error is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _restore_files(
    store: ObjectStore,
    root: str | None,
    files: Sequence[FileEntry],
    manifest: Manifest,
    *,
    ready: asyncio.Task[None],
    download_concurrency: int,
    workers: int,
    sink: ProgressSink,
    sleep: Sleep,
) -> None:
    plan = plan_spans(
        plan_restore(
            files,
            manifest.chunks,
            max_run_bytes=MAX_RUN_BYTES,
            max_gap=MAX_GAP,
            max_ranges=MAX_RANGES,
            cache_bytes=CACHE_BYTES,
        ),
        max_span_bytes=MAX_SPAN_BYTES,
        max_gap=MAX_GAP,
        reach=SPAN_REACH,
    )
    opens: list[list[int]] = [[] for _ in plan.runs]
    closes: list[list[int]] = [[] for _ in plan.runs]
    for index, span in enumerate(plan.spans):
        opens[span.first_run].append(index)
        closes[span.last_run].append(index)

    def cost_in(index: int) -> int:
        return plan.runs[index].raw_length + sum(plan.spans[i].length for i in opens[index])

    def cost_out(index: int) -> int:
        return plan.runs[index].raw_length + sum(plan.spans[i].length for i in closes[index])

    pool = ThreadPoolExecutor(workers, thread_name_prefix="mushroom-decode")
    lanes = _Lanes(root, files, max(2, workers))
    cache = _Cache()
    fetch = _Fetcher(store, plan, files, pool, sleep)
    window: asyncio.Queue[tuple[int, asyncio.Task[list[bytes | None]]] | None]
    window = asyncio.Queue(maxsize=download_concurrency)
    decoding: set[asyncio.Task[list[bytes | None]]] = set()
    writing: set[asyncio.Task[None]] = set()
    failures: list[BaseException] = []
    budget = _Budget(BUFFER_BYTES)

    async def produce() -> None:
        for index, run in enumerate(plan.runs):
            await budget.acquire(cost_in(index))
            for span in opens[index]:
                fetch.start(span)
            task = asyncio.create_task(fetch(run))
            decoding.add(task)
            task.add_done_callback(decoding.discard)
            await window.put((index, task))
        await window.put(None)

    async def written(index: int, writes: list[asyncio.Future[int]]) -> None:
        """A run's pieces are written: free its bytes (the budget counts them until then)."""
        try:
            counts = await asyncio.gather(*writes)
        except _Skipped:
            return
        except Exception as error:
            failures.append(error)  # raised by consume
            return
        finally:
            for span in closes[index]:
                fetch.release(span)
            await budget.release(cost_out(index))
        sink.advance(sum(counts), plan.runs[index].raw_length)

    def check() -> None:
        if failures:
            raise failures[0]

    async def consume() -> None:
        await asyncio.shield(ready)  # the directories exist: files may be written
        while (queued := await window.get()) is not None:
            check()
            index, task = queued
            decoded = await task
            # The task holds its result too: drop every reference before the bytes are
            # counted as free.
            del queued, task
            writes = lanes.submit(cache.pieces(plan.runs[index], decoded))
            del decoded
            done = asyncio.create_task(written(index, writes))
            writing.add(done)
            done.add_done_callback(writing.discard)
        while writing:
            await asyncio.wait(set(writing), return_when=asyncio.FIRST_COMPLETED)
            check()
        check()

    try:
        await _together(produce(), consume())
    finally:
        for task in [*decoding, *writing]:
            task.cancel()
        await asyncio.gather(*decoding, *writing, return_exceptions=True)
        await fetch.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        # After the pieces being written, if any: each lane removes its files in progress.
        await lanes.close()


async def restore_snapshot(
    store: ObjectStore,
    which: str,
    target: Path | None,
    *,
    verify_only: bool = False,
    force: bool = False,
    download_concurrency: int = 8,
    workers: int = 0,
    progress: ProgressSink | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> RestoreResult:
    """Restore snapshot ``which`` (an id, or ``"latest"``) into ``target``, or only verify it.
    See the module docstring."""
    if download_concurrency < 1:
        raise UsageError("download concurrency must be at least 1")
    sink = progress or NoProgress()
    metered = MeteredStore(store)
    started = clock.monotonic()
    sleep = clock.sleep
    if which == "latest":
        latest = await read_latest(metered, sleep=sleep)
        if latest is None:
            raise SnapshotError(f"there is no snapshot in {store.url} yet; nothing to restore")
        snapshot_id = latest.snapshot_id
    else:
        snapshot_id = which
    manifest = await load_manifest(metered, snapshot_id, sleep=sleep)

    entries = manifest.entries
    dirs = [e for e in entries if isinstance(e, DirEntry)]
    links = [e for e in entries if isinstance(e, SymlinkEntry)]
    all_files = [e for e in entries if isinstance(e, FileEntry)]
    files = [e for e in all_files if e.chunks]
    empty = [e for e in all_files if not e.chunks]
    total = sum(e.size for e in all_files)
    sink.start(len(all_files), total)

    root: str | None = None
    if not verify_only:
        if target is None:
            raise UsageError("restore needs a target directory (--target DIR)")
        root = await asyncio.to_thread(_prepare_target, target, force)

    async def make_dirs_and_empty_files() -> None:
        if root is not None:
            await asyncio.to_thread(_make_dirs, root, dirs)
        await asyncio.to_thread(_restore_empty_files, root, empty)
        sink.advance(len(empty), 0)

    # The directories are created while the first ranges download; no file is written before.
    ready = asyncio.create_task(make_dirs_and_empty_files())
    try:
        await _restore_files(
            metered,
            root,
            files,
            manifest,
            ready=ready,
            download_concurrency=download_concurrency,
            workers=workers or os.cpu_count() or 2,
            sink=sink,
            sleep=sleep,
        )
        await ready
    finally:
        # Never return while a thread still creates directories.
        await asyncio.gather(asyncio.shield(ready), return_exceptions=True)
    if root is not None:
        await asyncio.to_thread(_make_symlinks, root, links)
        await asyncio.to_thread(_finish_dirs, root, dirs)

    result = RestoreResult(
        snapshot_id=snapshot_id,
        files=len(all_files),
        dirs=len(dirs),
        symlinks=len(links),
        bytes=total,
        bytes_downloaded=metered.bytes_downloaded,
        requests=metered.requests,
        duration_s=round(max(0.0, clock.monotonic() - started), 3),
        verify_only=verify_only,
    )
    log.info(
        "restore.verified" if verify_only else "restore.completed",
        extra={
            "fields": {
                "snapshot_id": snapshot_id,
                "files": result.files,
                "bytes": result.bytes,
                "bytes_downloaded": result.bytes_downloaded,
                "requests": result.requests,
                "duration_s": result.duration_s,
            }
        },
    )
    return result
