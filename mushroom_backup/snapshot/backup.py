"""Taking a snapshot: scan, read what changed, chunk, hash, compress, pack, upload; then the
manifest; then ``LATEST``.

:func:`take_snapshot` is the whole of ``backup now`` below the lease. It writes only through
the store it is given -- the coordinator hands it a
:class:`~mushroom_backup.lease.fenced.FencedStore`, so every write is fenced by the lease.

Order and promises
------------------
1. Read ``LATEST`` (remember its version) and the parent manifest it names: the parent's chunk
   table is the set of chunks already stored, its entries drive change detection.
2. Scan the source (:mod:`.scan`); files whose size, mtime_ns, ctime_ns and inode match the
   parent keep their chunk list unread (:func:`.plan.plan_files`).
3. Read the other files (:mod:`.reader`): cut into fixed-size chunks at file offsets, SHA-256
   per chunk and per file, zstd for chunks the index does not hold, packed into pack objects
   (:mod:`.pack`) uploaded create-only, ``upload_concurrency`` at a time.
4. Only after every pack upload succeeded: the manifest (create-only), then the ``LATEST``
   compare-and-swap (:mod:`.catalog`).

* If any upload fails -- the fence closed (:class:`~mushroom_backup.errors.FenceClosed`), the
  store failed after retries -- the other uploads are cancelled, nothing more is written, and
  the error propagates: no manifest, ``LATEST`` untouched. The same holds for cancellation
  (``CancelledError`` is never swallowed) and for any other error.
* Memory is bounded whatever the file sizes: at most ``8 * workers + 8`` chunks between reading
  and packing, one open pack, and ``upload_concurrency`` sealed packs (a pack is sealed only
  once an upload slot is free). With the defaults that is about 12 + 4 + 4 x 4 MiB, plus what
  the store's client copies while sending.
* CPU work runs off the event loop: reads and the whole-file hash on one reader thread (a
  file's chunks must be hashed in order), chunk hashing and compression on ``workers`` threads.
* A file that changes while it is read is read again, up to ``max_read_attempts`` times; if it
  never settles it is stored as last read, flagged ``unstable`` in the manifest, with an
  ``unstable`` warning -- or, with ``fail_on_unstable``, the snapshot fails naming it.
  (A database being written to during a backup is the usual case; failing the whole backup
  for it would leave no backup at all, so the default stores and reports.)
* A file that vanished since the scan is left out with a warning. An unreadable one is an
  error naming it, unless ``skip_unreadable`` (left out with a warning).

Not promised: that packs of an abandoned snapshot, or chunks of a discarded read attempt, are
removed (they are orphans: invisible to restore, removed by ``prune``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import queue
import secrets
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clock import Clock
from ..errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    IntegrityError,
    SnapshotError,
    UsageError,
)
from ..retry import retrying
from ..store.base import CREATE, OVERWRITE, ObjectStore
from .catalog import (
    LatestRef,
    Sleep,
    load_manifest,
    read_latest,
    swap_latest,
    write_manifest,
)
from .ids import new_snapshot_id
from .manifest import (
    LATEST_FORMAT,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    ChunkingParams,
    DirEntry,
    FileEntry,
    LatestRecord,
    Manifest,
    ManifestBody,
    ManifestHeader,
    SourceInfo,
    Summary,
    SymlinkEntry,
    WriterInfo,
    check_manifest,
    encode_manifest,
    manifest_key,
    pack_table,
)
from .metered import MeteredStore
from .pack import PackBuilder, SealedPack
from .paths import Excludes
from .plan import ChunkIndex, plan_files
from .progress import NoProgress, ProgressSink
from .reader import NotRegularFile, OpenFile, SmallRead, hash_and_compress, read_small_batch
from .scan import ScannedEntry, SnapshotWarning, WarningKind, scan_tree

KiB = 1024
MiB = 1024 * KiB

log = logging.getLogger("mushroom_backup.snapshot")


@dataclass(frozen=True)
class BackupOptions:
    """How to take a snapshot. ``workers`` 0 means one compression thread per CPU."""

    excludes: tuple[str, ...] = ()
    skip_unreadable: bool = False
    chunk_size: int = 512 * KiB
    compression_level: int = 3
    upload_concurrency: int = 4
    pack_size: int = 4 * MiB
    workers: int = 0
    max_read_attempts: int = 3
    fail_on_unstable: bool = False

    def __post_init__(self) -> None:
        checks = (
            (self.chunk_size >= 1024, "chunk_size must be at least 1 KiB"),
            (self.chunk_size <= 64 * MiB, "chunk_size must be at most 64 MiB"),
            (1 <= self.compression_level <= 22, "compression_level must be 1..22"),
            (self.upload_concurrency >= 1, "upload_concurrency must be at least 1"),
            (self.pack_size >= self.chunk_size, "pack_size must be at least chunk_size"),
            (self.workers >= 0, "workers must not be negative"),
            (self.max_read_attempts >= 1, "max_read_attempts must be at least 1"),
        )
        for ok, message in checks:
            if not ok:
                raise UsageError(f"invalid backup options: {message}")
        try:
            Excludes.parse(self.excludes)
        except ValueError as e:
            raise UsageError(str(e)) from None


@dataclass(frozen=True)
class SnapshotResult:
    """What a snapshot did. ``dedup_ratio`` is the share of scanned bytes that needed no new
    chunk (0.0 for a first backup of unique data, 1.0 for an unchanged re-backup);
    ``bytes_uploaded`` and ``requests`` count every store call, manifest and LATEST included."""

    snapshot_id: str
    parent_id: str | None
    manifest_key: str
    files: int
    dirs: int
    symlinks: int
    bytes_scanned: int
    bytes_read: int
    files_read: int
    files_reused: int
    new_chunks: int
    new_packs: int
    new_bytes_stored: int
    bytes_uploaded: int
    requests: int
    duration_s: float
    dedup_ratio: float
    warnings: tuple[SnapshotWarning, ...] = ()


# --- pack uploads ------------------------------------------------------------------------------


class _Uploads:
    """Pack uploads, at most ``concurrency`` in flight. The first failure cancels the others
    and is raised by every later :meth:`start`, :meth:`check` and :meth:`wait`."""

    def __init__(self, store: ObjectStore, concurrency: int, sleep: Sleep) -> None:
        self._store = store
        self._sleep = sleep
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._best_effort = not store.conditional
        self.failure: BaseException | None = None
        self.packs = 0
        self.bytes = 0

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def start(self, seal: Callable[[], Awaitable[SealedPack]]) -> SealedPack:
        """Wait for a free slot, then seal the pack and start its upload (sealing only once a
        slot is free keeps at most ``concurrency`` sealed packs in memory)."""
        await self._slots.acquire()
        try:
            self.check()
            pack = await seal()
        except BaseException:
            self._slots.release()
            raise
        task = asyncio.create_task(self._put(pack), name=f"upload {pack.key}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        self.packs += 1
        self.bytes += len(pack.data)
        return pack

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and self.failure is None:
            self.failure = error
            for other in self._tasks:
                other.cancel()

    async def _put(self, pack: SealedPack) -> None:
        key, data = pack.key, pack.data

        async def attempt() -> None:
            if not self._best_effort:
                try:
                    await self._store.put(key, data, CREATE)
                    return
                except AlreadyExists:
                    return  # content-addressed: the same name holds the same bytes
                except ConditionalWritesUnsupported:
                    self._best_effort = True
            await self._store.put(key, data, OVERWRITE)

        await retrying(attempt, what=f"put {key}", sleep=self._sleep)

    async def wait(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_EXCEPTION)
            self.check()
        self.check()

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- reading, chunking, packing ----------------------------------------------------------------


@dataclass
class _LargeFile:
    """One read attempt of a file larger than a chunk, and its chunk ids as they arrive
    (``""`` for an empty read past the end of a file that shrank)."""

    entry: ScannedEntry
    file: OpenFile
    chunks: list[str | None]
    unstable: bool = False


@dataclass(frozen=True, slots=True)
class _SmallBatch:
    """Consecutive small files read by one worker call."""

    entries: tuple[ScannedEntry, ...]


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Chunk ``index`` of a large file's read attempt."""

    state: _LargeFile
    index: int


ChunkResult = tuple[str, bytes | None, int]

_BATCH_FILES = 32
_BATCH_BYTES = 1 * MiB


@dataclass
class _Counters:
    bytes_read: int = 0
    files_read: int = 0
    new_chunks: int = 0
    new_raw_bytes: int = 0
    unstable: int = 0


@dataclass
class _Pipeline:
    """Reads the files to read and fills :attr:`files`; see the module docstring.

    The window holds, in reading order, futures of small-file batches and of large-file chunks;
    it is retired in order, which keeps packs in file order and bounds memory. Each item costs
    one hand-off back to the event loop: a chunk is read (and fed to its file's hash) on the
    reader thread, which passes it straight to a worker for hashing and compression."""

    store: ObjectStore
    source: Path
    options: BackupOptions
    index: ChunkIndex
    sink: ProgressSink
    sleep: Sleep
    files: dict[str, FileEntry] = field(default_factory=dict)
    warnings: list[SnapshotWarning] = field(default_factory=list)
    counters: _Counters = field(default_factory=_Counters)

    def __post_init__(self) -> None:
        workers = self.options.workers or os.cpu_count() or 2
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mushroom-chunk")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="mushroom-read")
        self._window: deque[tuple[_SmallBatch | _Chunk, asyncio.Future[Any]]] = deque()
        # Generous: the event loop also runs the HTTP client (request signing hashes every
        # upload), and while it is busy the workers must find work queued.
        self._window_limit = 8 * workers + 8
        self._batch: list[ScannedEntry] = []
        self._batch_bytes = 0
        self._packer = PackBuilder()
        self.uploads = _Uploads(self.store, self.options.upload_concurrency, self.sleep)
        self._large: list[_LargeFile] = []
        self._grew: list[ScannedEntry] = []
        self._open: set[OpenFile] = set()
        # Read buffers of large-file chunks, reused: at most one per window slot is in use.
        self._buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()

    # The dispatcher: the only coroutine that touches the window, the packer and the index.

    async def run(self, to_read: tuple[ScannedEntry, ...]) -> None:
        try:
            for entry in to_read:
                if entry.size <= self.options.chunk_size:
                    await self._read_small(entry)
                else:
                    await self._read_large(entry)
            await self._submit_batch()
            while self._window:
                await self._retire()
            for entry in self._grew:
                await self._read_large(entry)
            while self._window:
                await self._retire()
            for state in self._large:
                self._finish_large(state)
            if len(self._packer):
                await self._flush()
            await self.uploads.wait()
        except BaseException:
            await self._abort()
            raise
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            for file in list(self._open):
                self._reader.submit(file.close)
            self._reader.shutdown(wait=False)

    async def _abort(self) -> None:
        pending = [future for _, future in self._window]
        self._window.clear()
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.uploads.cancel()

    def _path(self, entry: ScannedEntry) -> str:
        return os.path.join(os.fspath(self.source), entry.path)

    async def _make_room(self) -> None:
        self.uploads.check()
        while len(self._window) >= self._window_limit:
            await self._retire()
            self.uploads.check()

    async def _read_small(self, entry: ScannedEntry) -> None:
        self._batch.append(entry)
        self._batch_bytes += entry.size
        if len(self._batch) >= _BATCH_FILES or self._batch_bytes >= _BATCH_BYTES:
            await self._submit_batch()

    async def _submit_batch(self) -> None:
        if not self._batch:
            return
        batch = _SmallBatch(tuple(self._batch))
        self._batch, self._batch_bytes = [], 0
        await self._make_room()
        options = self.options
        future = asyncio.get_running_loop().run_in_executor(
            self._pool,
            read_small_batch,
            [self._path(entry) for entry in batch.entries],
            options.chunk_size,
            options.max_read_attempts,
            options.compression_level,
            self.index.is_new,
        )
        self._window.append((batch, future))

    def _open_attempt(self, path: str, attempt: int) -> OpenFile:
        file = OpenFile(path, attempt)
        self._open.add(file)  # set.add is atomic: safe from the reader thread
        return file

    async def _read_large(self, entry: ScannedEntry) -> None:
        await self._submit_batch()  # keep files in order
        loop = asyncio.get_running_loop()
        size = self.options.chunk_size
        state: _LargeFile | None = None
        for attempt in range(1, self.options.max_read_attempts + 1):
            try:
                file = await loop.run_in_executor(
                    self._reader, self._open_attempt, self._path(entry), attempt
                )
            except OSError as error:
                self._unreadable(entry, error)
                return
            total = file.before.size
            state = _LargeFile(entry, file, [None] * math.ceil(total / size))
            for index in range(len(state.chunks)):
                await self._make_room()
                offset = index * size
                result: Future[ChunkResult] = Future()
                # Submitted here, in order, so the reader thread hashes the file in order.
                self._reader.submit(
                    self._read_chunk, file, offset, min(size, total - offset), result
                )
                self._window.append((_Chunk(state, index), asyncio.wrap_future(result)))
            try:
                _after, settled = await loop.run_in_executor(self._reader, file.finish)
            finally:
                self._open.discard(file)
            self.counters.bytes_read += file.bytes_read
            if settled:
                break
            self._changed_while_read(entry, attempt)
        assert state is not None
        self._large.append(state)
        self.counters.files_read += 1
        if not settled:
            self._never_settled(entry)
            state.unstable = True

    def _read_chunk(
        self, file: OpenFile, offset: int, length: int, result: Future[ChunkResult]
    ) -> None:
        """Reader thread: read a chunk into a free buffer (feeding the file hash), hand it
        to a worker."""
        if not result.set_running_or_notify_cancel():
            return
        try:
            buffer = self._buffers.get_nowait()
        except queue.Empty:
            buffer = bytearray(self.options.chunk_size)
        try:
            data = file.read_into(buffer, offset, length)
            if data:
                self._pool.submit(self._hash_and_compress, buffer, data, result)
                return
            result.set_result(("", None, 0))
        except BaseException as error:
            result.set_exception(error)
        self._buffers.put(buffer)

    def _hash_and_compress(
        self, buffer: bytearray, data: memoryview, result: Future[ChunkResult]
    ) -> None:
        """Worker thread: a chunk's id, and its frame if it is new; the buffer is free again
        before the result is known (so a retired window slot always finds one)."""
        try:
            chunk_id, frame = hash_and_compress(
                data, self.options.compression_level, self.index.is_new
            )
        except BaseException as error:
            result.set_exception(error)
            return
        finally:
            length = len(data)
            data.release()
            self._buffers.put(buffer)
        result.set_result((chunk_id, frame, length))

    async def _retire(self) -> None:
        target, future = self._window.popleft()
        if isinstance(target, _SmallBatch):
            reads: list[SmallRead | OSError] = await future
            for entry, read in zip(target.entries, reads, strict=True):
                if isinstance(read, OSError):
                    self._unreadable(entry, read)
                else:
                    await self._small_done(entry, read)
            return
        try:
            chunk_id, frame, length = await future
        except OSError as error:
            raise SnapshotError(
                f"reading {self._path(target.state.entry)} failed: {error.strerror or error}"
            ) from None
        target.state.chunks[target.index] = chunk_id
        await self._store_chunk(chunk_id, frame, length)
        self.sink.advance(0, length)

    async def _small_done(self, entry: ScannedEntry, read: SmallRead) -> None:
        if read.grew:
            self._grew.append(entry)
            return
        self.counters.bytes_read += read.size * read.attempts
        self.counters.files_read += 1
        if read.attempts > 1:
            self._changed_while_read(entry, read.attempts - 1)
        if read.unstable:
            self._never_settled(entry)
        await self._store_chunk(read.digest, read.frame, read.size)
        stamp = read.stamp
        self.files[entry.path] = FileEntry(
            type="file",
            path=entry.path,
            mode=stamp.mode,
            mtime_ns=stamp.mtime_ns,
            size=read.size,
            sha256=read.digest,
            chunks=(read.digest,) if read.size else (),
            inode=stamp.inode,
            dev=stamp.dev,
            ctime_ns=stamp.ctime_ns,
            uid=stamp.uid,
            gid=stamp.gid,
            unstable=read.unstable,
        )
        self.sink.advance(1, read.size)

    def _finish_large(self, state: _LargeFile) -> None:
        assert None not in state.chunks, "every chunk of a read file was retired"
        chunks = tuple(c for c in state.chunks if c)
        stamp = state.file.before
        self.files[state.entry.path] = FileEntry(
            type="file",
            path=state.entry.path,
            mode=stamp.mode,
            mtime_ns=stamp.mtime_ns,
            size=state.file.bytes_read,
            sha256=state.file.hasher.hexdigest(),
            chunks=chunks,
            inode=stamp.inode,
            dev=stamp.dev,
            ctime_ns=stamp.ctime_ns,
            uid=stamp.uid,
            gid=stamp.gid,
            unstable=state.unstable,
        )
        self.sink.advance(1, 0)

    async def _store_chunk(self, chunk_id: str, frame: bytes | None, raw_length: int) -> None:
        # Workers only guess "new" (their lookups race with the loop); this is the decision.
        if frame is None or not self.index.is_new(chunk_id):
            return
        self._packer.add(chunk_id, frame, raw_length)
        self.index.add_pending(chunk_id)
        self.counters.new_chunks += 1
        self.counters.new_raw_bytes += raw_length
        if self._packer.size >= self.options.pack_size:
            await self._flush()

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()

        async def seal() -> SealedPack:
            return await loop.run_in_executor(self._pool, self._packer.seal)

        self.index.add_pack(await self.uploads.start(seal))

    # Files that do not read cleanly.

    def _unreadable(self, entry: ScannedEntry, error: OSError) -> None:
        path = self._path(entry)
        vanished = (
            isinstance(error, FileNotFoundError | NotRegularFile) or error.errno == errno.ELOOP
        )
        if vanished:
            self._warn("vanished", entry.path, "vanished or replaced since the scan; left out")
            return
        if isinstance(error, PermissionError) and self.options.skip_unreadable:
            self._warn("unreadable", entry.path, f"not readable ({error.strerror}); left out")
            return
        if isinstance(error, PermissionError):
            raise SnapshotError(
                f"cannot read {path}: {error.strerror}; fix its permissions, exclude it "
                "(--exclude), or pass --skip-unreadable"
            ) from None
        raise SnapshotError(f"cannot read {path}: {error.strerror or error}") from None

    def _changed_while_read(self, entry: ScannedEntry, attempt: int) -> None:
        log.info(
            "snapshot.file_changed_while_read",
            extra={"fields": {"path": entry.path, "attempt": attempt}},
        )

    def _never_settled(self, entry: ScannedEntry) -> None:
        attempts = self.options.max_read_attempts
        if self.options.fail_on_unstable:
            raise SnapshotError(
                f"{self._path(entry)} kept changing while it was read ({attempts} attempts); "
                "stop what writes to it during the backup, or exclude it"
            )
        self.counters.unstable += 1
        self._warn(
            "unstable",
            entry.path,
            f"kept changing while it was read ({attempts} attempts); stored as last read",
        )

    def _warn(self, kind: WarningKind, path: str, message: str) -> None:
        self.warnings.append(SnapshotWarning(kind, path, message))
        log.warning(f"snapshot.{kind.replace('-', '_')}", extra={"fields": {"path": path}})


# --- the snapshot ------------------------------------------------------------------------------


def _scan_warnings_logged(warnings: list[SnapshotWarning]) -> None:
    for warning in warnings:
        log.warning(
            f"snapshot.{warning.kind.replace('-', '_')}",
            extra={"fields": {"path": warning.path, "detail": warning.message}},
        )


async def _parent(store: ObjectStore, latest: LatestRef | None, sleep: Sleep) -> Manifest | None:
    if latest is None:
        return None
    try:
        return await load_manifest(store, latest.snapshot_id, sleep=sleep)
    except (SnapshotError, IntegrityError) as error:
        # A LATEST that names a missing or unreadable manifest must not stop backups: this
        # snapshot is taken in full and, once complete, replaces it.
        log.warning(
            "snapshot.parent_unreadable",
            extra={"fields": {"parent_id": latest.snapshot_id, "error": error.message}},
        )
        return None


async def take_snapshot(
    store: ObjectStore,
    source: Path,
    *,
    options: BackupOptions,
    writer: WriterInfo,
    clock: Clock,
    progress: ProgressSink | None = None,
) -> SnapshotResult:
    """Take one snapshot of ``source`` into ``store`` (see the module docstring)."""
    sink = progress or NoProgress()
    metered = MeteredStore(store)
    sleep = clock.sleep
    started = clock.monotonic()
    created_at = clock.wall()
    source = Path(await asyncio.to_thread(os.path.abspath, source))

    latest = await read_latest(metered, sleep=sleep)
    parent = await _parent(metered, latest, sleep)
    parent_id = latest.snapshot_id if latest is not None else None
    snapshot_id = new_snapshot_id(created_at, parent_id, secrets.token_hex(4))
    log.info(
        "snapshot.started",
        extra={
            "fields": {"snapshot_id": snapshot_id, "parent_id": parent_id, "source": str(source)}
        },
    )

    excludes = Excludes.parse(options.excludes)
    scan = await asyncio.to_thread(
        scan_tree, source, excludes, skip_unreadable=options.skip_unreadable
    )
    _scan_warnings_logged(scan.warnings)
    plan = plan_files(scan.entries, parent)
    file_count = sum(1 for e in scan.entries if e.kind == "file")
    sink.start(file_count, sum(e.size for e in scan.entries if e.kind == "file"))
    sink.advance(len(plan.reuse), sum(e.size for e in plan.reuse.values()))

    index = ChunkIndex(known=parent.chunks if parent is not None else {})
    pipeline = _Pipeline(metered, source, options, index, sink, sleep)
    await pipeline.run(plan.read)

    entries: list[FileEntry | DirEntry | SymlinkEntry] = []
    for scanned in scan.entries:
        if scanned.kind == "dir":
            entries.append(
                DirEntry(
                    type="dir",
                    path=scanned.path,
                    mode=scanned.mode,
                    mtime_ns=scanned.mtime_ns,
                    uid=scanned.uid,
                    gid=scanned.gid,
                )
            )
        elif scanned.kind == "symlink":
            assert scanned.target is not None
            entries.append(
                SymlinkEntry(
                    type="symlink",
                    path=scanned.path,
                    target=scanned.target,
                    mtime_ns=scanned.mtime_ns,
                    uid=scanned.uid,
                    gid=scanned.gid,
                )
            )
        else:
            entry = plan.reuse.get(scanned.path) or pipeline.files.get(scanned.path)
            if entry is not None:  # None: vanished or unreadable, and a warning says so
                entries.append(entry)
    files = [e for e in entries if isinstance(e, FileEntry)]
    counters = pipeline.counters
    warnings = (*scan.warnings, *pipeline.warnings)
    total_bytes = sum(e.size for e in files)
    summary = Summary(
        files=len(files),
        dirs=sum(1 for e in entries if isinstance(e, DirEntry)),
        symlinks=sum(1 for e in entries if isinstance(e, SymlinkEntry)),
        bytes=total_bytes,
        bytes_read=counters.bytes_read,
        files_read=counters.files_read,
        files_reused=len(plan.reuse),
        new_chunks=counters.new_chunks,
        new_packs=pipeline.uploads.packs,
        new_bytes_stored=pipeline.uploads.bytes,
        unstable_files=counters.unstable,
        skipped=sum(1 for w in warnings if w.kind != "unstable"),
        duration_s=round(max(0.0, clock.monotonic() - started), 3),
    )
    header = ManifestHeader(
        format=MANIFEST_FORMAT,
        version=MANIFEST_VERSION,
        snapshot_id=snapshot_id,
        parent_id=parent_id,
        created_at=created_at,
        source=SourceInfo(host=socket.gethostname(), path=str(source)),
        writer=writer,
        chunking=ChunkingParams(
            algorithm="fixed",
            chunk_size=options.chunk_size,
            hash="sha256",
            compression="zstd",
            level=options.compression_level,
            pack_size=options.pack_size,
        ),
        summary=summary,
    )
    body = ManifestBody(entries=tuple(entries), packs=pack_table(tuple(entries), index.location))
    manifest = Manifest(header, body)
    key = manifest_key(snapshot_id)
    check_manifest(manifest, key)  # never store a manifest that restore would refuse
    data = await asyncio.to_thread(encode_manifest, manifest)

    # Every pack is stored (pipeline.run waited for all uploads): now the manifest, then LATEST.
    await write_manifest(metered, key, data, sleep=sleep)
    record = LatestRecord(
        format=LATEST_FORMAT,
        snapshot_id=snapshot_id,
        manifest=key,
        created_at=created_at,
        written_at=clock.wall(),
        writer=writer,
    )
    await swap_latest(metered, latest, record, sleep=sleep)

    duration = max(0.0, clock.monotonic() - started)
    result = SnapshotResult(
        snapshot_id=snapshot_id,
        parent_id=parent_id,
        manifest_key=key,
        files=summary.files,
        dirs=summary.dirs,
        symlinks=summary.symlinks,
        bytes_scanned=total_bytes,
        bytes_read=counters.bytes_read,
        files_read=counters.files_read,
        files_reused=summary.files_reused,
        new_chunks=counters.new_chunks,
        new_packs=summary.new_packs,
        new_bytes_stored=summary.new_bytes_stored,
        bytes_uploaded=metered.bytes_uploaded,
        requests=metered.requests,
        duration_s=round(duration, 3),
        dedup_ratio=round(1 - counters.new_raw_bytes / total_bytes, 4) if total_bytes else 1.0,
        warnings=warnings,
    )
    log.info(
        "snapshot.completed",
        extra={
            "fields": {
                "snapshot_id": snapshot_id,
                "files": result.files,
                "bytes_scanned": result.bytes_scanned,
                "bytes_read": result.bytes_read,
                "new_bytes_stored": result.new_bytes_stored,
                "bytes_uploaded": result.bytes_uploaded,
                "requests": result.requests,
                "duration_s": result.duration_s,
                "warnings": len(warnings),
            }
        },
    )
    return result
