"""Reading one source file consistently: hashing while reading, noticing it change underneath.

Everything here blocks and runs in worker threads (``os.pread``, hashlib and zstandard release
the GIL). A file is read from one open descriptor; its identity is ``fstat``-ed when it is
opened and again after its last byte was read. If size, mtime_ns, ctime_ns or inode differ, or
fewer bytes came back than its size promised, the read was not of one version of the file:
the caller reads it again, up to ``BackupOptions.max_read_attempts`` times in all, and then
either stores the last read flagged ``unstable`` (with a warning) or fails, as configured.

* :func:`read_small` -- a file of at most one chunk, read, checked, retried, hashed and (if its
  chunk is new) compressed in one call; its whole-file hash *is* its chunk id.
* :class:`OpenFile` -- one attempt at a larger file: :meth:`OpenFile.read_into` is called for
  its chunks in order from a single thread (it feeds the whole-file hash),
  :meth:`OpenFile.finish` after the last one.

Files are opened ``O_NOFOLLOW | O_NONBLOCK`` (a name swapped for a symlink or a FIFO since the
scan is not followed or waited on) and ``O_NOATIME`` where the kernel allows it.

Not detected: a write that keeps the size and lands within the same tick of the filesystem's
timestamp clock as the read (the kernel stamps mtime/ctime from a coarse clock, a few ms). The
same limit applies to change detection between snapshots; restic and rsync share it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from .pack import compress_chunk

_BASE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NOATIME = getattr(os, "O_NOATIME", 0)


def after_read(path: str, attempt: int) -> None:
    """Called between the last read of an attempt and the second ``fstat`` (a seam for tests
    that change a file while it is being read). Does nothing."""


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What a file's ``fstat`` says about its identity and content version."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    dev: int
    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_ino,
            st.st_dev,
            stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_gid,
        )


def settled(before: FileStamp, after: FileStamp, bytes_read: int) -> bool:
    """Whether one read saw a single version of the file: same size, mtime, ctime and inode
    before and after, and exactly ``size`` bytes read."""
    return (
        before.size == after.size == bytes_read
        and before.mtime_ns == after.mtime_ns
        and before.ctime_ns == after.ctime_ns
        and before.inode == after.inode
    )


class NotRegularFile(OSError):
    """The name no longer refers to a regular file (replaced since the scan)."""


def _open(path: str) -> tuple[int, FileStamp]:
    try:
        fd = os.open(path, _BASE_FLAGS | _NOATIME)
    except PermissionError:
        if not _NOATIME:
            raise
        fd = os.open(path, _BASE_FLAGS)  # O_NOATIME needs ownership; retry without it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is no longer a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, FileStamp.of(st)


@dataclass(frozen=True, slots=True)
class SmallRead:
    """The outcome of :func:`read_small`. ``grew``: the file is now larger than one chunk (read
    it as a large file instead); then the other fields are meaningless."""

    stamp: FileStamp
    size: int
    digest: str
    frame: bytes | None
    attempts: int
    unstable: bool
    grew: bool = False


def read_small(
    path: str,
    limit: int,
    max_attempts: int,
    level: int,
    is_new: Callable[[str], bool],
) -> SmallRead:
    """Read a file expected to hold at most ``limit`` bytes (one chunk), retrying while it
    changes; compress it if ``is_new(digest)``. OSError for a file that cannot be read."""
    attempt = 0
    while True:
        attempt += 1
        fd, before = _open(path)
        try:
            data = os.pread(fd, limit + 1, 0)
            after_read(path, attempt)
            after = FileStamp.of(os.fstat(fd))
        finally:
            os.close(fd)
        if len(data) > limit:
            return SmallRead(before, 0, "", None, attempt, False, grew=True)
        stable = settled(before, after, len(data))
        if stable or attempt >= max_attempts:
            break
    digest = hashlib.sha256(data).hexdigest()
    frame = compress_chunk(data, level) if data and is_new(digest) else None
    return SmallRead(before, len(data), digest, frame, attempt, not stable)


def read_small_batch(
    paths: list[str],
    limit: int,
    max_attempts: int,
    level: int,
    is_new: Callable[[str], bool],
) -> list[SmallRead | OSError]:
    """:func:`read_small` for several files in one call (one thread hand-off for many small
    files); a file that cannot be read gives its OSError in its place."""
    results: list[SmallRead | OSError] = []
    for path in paths:
        try:
            results.append(read_small(path, limit, max_attempts, level, is_new))
        except OSError as error:
            results.append(error)
    return results


def hash_and_compress(
    data: bytes | memoryview, level: int, is_new: Callable[[str], bool]
) -> tuple[str, bytes | None]:
    """A chunk's id, and its zstd frame if ``is_new(id)`` (else None: nothing to store)."""
    digest = hashlib.sha256(data).hexdigest()
    return digest, (compress_chunk(data, level) if is_new(digest) else None)


class OpenFile:
    """One attempt at reading a file larger than a chunk (see the module docstring). Not
    thread-safe: use it from one thread at a time, in order."""

    def __init__(self, path: str, attempt: int) -> None:
        self.path = path
        self.attempt = attempt
        self.fd: int | None
        self.fd, self.before = _open(path)
        self.hasher = hashlib.sha256()
        self.bytes_read = 0

    def read_into(self, buffer: bytearray, offset: int, length: int) -> memoryview:
        """Read ``length`` bytes at ``offset`` (fewer at the end) into ``buffer`` and feed them
        to the whole-file hash; returns the part of ``buffer`` filled. Must be called in file
        order. (A caller-owned buffer: reading a large file allocates nothing per chunk.)"""
        if self.fd is None:
            raise ValueError(f"{self.path} is closed")
        view = memoryview(buffer)[:length]
        filled = 0
        while filled < length:
            count = os.preadv(self.fd, [view[filled:]], offset + filled)
            if count == 0:
                break
            filled += count
        data = view[:filled]
        self.hasher.update(data)
        self.bytes_read += filled
        return data

    def finish(self) -> tuple[FileStamp, bool]:
        """The second ``fstat`` and whether the read settled; closes the file."""
        if self.fd is None:
            raise ValueError(f"{self.path} is closed")
        try:
            after_read(self.path, self.attempt)
            after = FileStamp.of(os.fstat(self.fd))
        finally:
            self.close()
        return after, settled(self.before, after, self.bytes_read)

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
