"""An :class:`~mushroom_backup.store.base.ObjectStore` in a local directory (``file:///abs/path``):
the embedded default, with real compare-and-swap between threads and processes on one host.

Layout
------
Key ``a/b/c`` is the file ``ROOT/a/b/c``. The store's own files live in ``ROOT/.mushroom-store/``
(``lock``, and ``tmp/`` for writes in progress); that name is reserved and never listed.

Each object file starts with a fixed 59-byte header, ``b"mushroom-backup object v1 "`` + 32 hex
digits + ``b"\\n"``, followed by the object's bytes. The 32 hex digits are a random 128-bit nonce
drawn for every write; the object's :class:`~mushroom_backup.store.base.Version` is that nonce,
quoted like an ETag. Why a header: the version must change on *every* write, identical bytes
included, and be read atomically with the bytes it describes. A stamp from ``stat`` (inode,
mtime, size) can repeat -- inodes are reused and mtimes are coarse -- which would let a stale
``Update`` succeed (ABA). A sidecar file or an xattr cannot be swapped atomically together with
the data (and tmpfs or NFS may lack user xattrs). A header inside the one file that is swapped
in whole is both atomic and unique.

Promises
--------
* A write is atomic and durable before it returns: the header and bytes go to a fresh temp file
  in ``.mushroom-store/tmp/``, which is fsynced, then linked or renamed into place, and the
  directory is fsynced. A reader sees the old object or the whole new one, never a part; temp
  files are never visible to ``get``/``head``/``list``.
* ``CREATE`` is ``os.link(temp, target)``: atomic, and it fails if the target exists, so exactly
  one of any number of concurrent creates wins, across threads and processes.
* ``Update``, ``OVERWRITE`` and ``delete`` run under an exclusive ``flock`` on
  ``.mushroom-store/lock`` (one lock per store, held only for compare + rename + directory
  fsync; the data is written and fsynced before the lock is taken), so check-and-swap is atomic
  against every other writer on this host.
* Blocking filesystem calls run in worker threads: the event loop never waits on an fsync.
* ``list`` walks only the directories that can hold matching keys and yields keys relative to
  the root with ``/`` separators, in ascending byte order of the key.

Not promised
------------
* Keys must be usable as relative paths: non-empty segments, no ``.``/``..``, no absolute
  keys, no NUL, segments of at most 255 bytes, not starting with ``.mushroom-store``; anything
  else is refused with a StoreError that says why. A key cannot also be a "directory" of other
  keys (``a`` and ``a/b`` cannot both exist), which the mushroom-backup layout never needs.
* Compare-and-swap between *hosts* (e.g. the same directory over NFS from two machines) is only
  as good as the filesystem's ``link`` and ``flock``.
* A cancelled write may still land (the worker thread finishes what it started). Temp files of
  a crashed process stay in ``.mushroom-store/tmp/`` (invisible; safe to delete when no writer
  runs). Empty directories left by deletes are not removed.
* Files in the directory that were not written by this store (no header) are refused by
  ``get``/``head`` and skipped by ``list``, with a warning.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import re
import secrets
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ..errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from .base import (
    OVERWRITE,
    Create,
    ObjectInfo,
    ObjectStore,
    PutMode,
    StoredObject,
    Update,
    Version,
)

log = logging.getLogger("mushroom_backup.store.local")

RESERVED = ".mushroom-store"
MAGIC = b"mushroom-backup object v1 "
HEADER_LEN = len(MAGIC) + 32 + 1
_NONCE = re.compile(rb"[0-9a-f]{32}")
_LIST_BATCH = 256


def check_key(key: str) -> None:
    """Refuse a key that cannot be a relative path under the root (StoreError saying why)."""
    why = None
    segments = key.split("/")
    if not key:
        why = "it is empty"
    elif key.startswith("/"):
        why = "it is absolute (starts with '/')"
    elif "\0" in key:
        why = "it contains a NUL byte"
    elif any(s == "" for s in segments):
        why = "it has an empty path segment"
    elif any(s in (".", "..") for s in segments):
        why = "it has a '.' or '..' path segment"
    elif segments[0] == RESERVED:
        why = f"{RESERVED!r} is reserved for the store's own files"
    elif any(len(s.encode()) > 255 for s in segments):
        why = "a path segment is longer than 255 bytes"
    if why is not None:
        raise StoreError(f"key {key!r} cannot be stored in a local directory: {why}", key=key)


def _version(nonce: bytes) -> Version:
    return Version(f'"{nonce.decode()}"')


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Directory:
    """The blocking half of :class:`LocalStore`: every method runs in a worker thread."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.own = root / RESERVED
        self.tmp = self.own / "tmp"
        self.lock_file = self.own / "lock"

    # --- helpers ----------------------------------------------------------------------------

    def path(self, key: str) -> Path:
        check_key(key)
        return self.root.joinpath(*key.split("/"))

    def _foreign(self, key: str) -> StoreError:
        return StoreError(
            f"{self.root / key} is not an object written by mushroom-backup (no header); "
            "move it out of the store directory",
            key=key,
        )

    def _read_header(self, key: str, f: BinaryIO) -> bytes:
        header = f.read(HEADER_LEN)
        nonce = header[len(MAGIC) : len(MAGIC) + 32]
        if (
            len(header) != HEADER_LEN
            or not header.startswith(MAGIC)
            or not header.endswith(b"\n")
            or not _NONCE.fullmatch(nonce)
        ):
            raise self._foreign(key)
        return nonce

    @contextmanager
    def _open(self, key: str) -> Iterator[tuple[BinaryIO, bytes, os.stat_result]]:
        """The object file, open for reading, with its nonce and stat. NotFound if absent."""
        path = self.path(key)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, after the caller's block
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(key) from None
        with f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise NotFound(key)
            yield f, self._read_header(key, f), st

    def current_version(self, key: str) -> Version:
        with self._open(key) as (_f, nonce, _st):
            return _version(nonce)

    def _make_dirs(self, directory: Path, key: str) -> None:
        """Create ``directory`` and its missing parents, fsyncing each new entry's parent."""
        if directory.is_dir():
            return
        missing: list[Path] = []
        d = directory
        while not d.is_dir():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not d.is_dir():
                    raise self._collides(key, d) from None
            except NotADirectoryError:
                raise self._collides(key, d) from None
            _fsync_dir(d.parent)

    def _collides(self, key: str, path: Path) -> StoreError:
        return StoreError(
            f"key {key!r} cannot be stored: {path} is an object, not a directory of keys",
            key=key,
        )

    def _write_temp(self, data: bytes) -> tuple[Path, bytes]:
        """A fresh, fsynced temp file holding header + data, and its nonce."""
        self._make_dirs(self.tmp, "")
        nonce = secrets.token_hex(16).encode()
        tmp = self.tmp / f".tmp-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb", closefd=True) as f:
                f.write(MAGIC + nonce + b"\n")
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp, nonce

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._make_dirs(self.own, "")
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    # --- operations -------------------------------------------------------------------------

    def get(self, key: str) -> StoredObject:
        with self._open(key) as (f, nonce, _st):
            data = f.read()
        return StoredObject(key, data, _version(nonce))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._open(key) as (f, _nonce, _st):
            return os.pread(f.fileno(), length, HEADER_LEN + start) if length else b""

    def head(self, key: str) -> ObjectInfo:
        with self._open(key) as (_f, nonce, st):
            return ObjectInfo(
                key,
                st.st_size - HEADER_LEN,
                _version(nonce),
                datetime.fromtimestamp(st.st_mtime_ns / 1e9, UTC),
            )

    def create(self, key: str, data: bytes) -> Version:
        target = self.path(key)
        tmp, nonce = self._write_temp(data)
        try:
            self._make_dirs(target.parent, key)
            try:
                os.link(tmp, target)
            except FileExistsError:
                if target.is_dir():
                    raise self._is_directory(key) from None
                raise AlreadyExists(key) from None
            except OSError as e:
                if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise StoreError(
                        f"cannot create {key!r}: the filesystem under {self.root} does not "
                        "support hard links, which the local store needs for create-only "
                        "writes; use another filesystem",
                        key=key,
                    ) from e
                raise
            _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return _version(nonce)

    def _is_directory(self, key: str) -> StoreError:
        return StoreError(
            f"key {key!r} cannot be stored: it is a directory of other keys here", key=key
        )

    def swap(self, key: str, data: bytes, expected: Version | None) -> Version:
        """Replace the object, if ``expected`` is given only while it is the current version."""
        target = self.path(key)
        tmp, nonce = self._write_temp(data)
        try:
            self._make_dirs(target.parent, key)
            with self._locked():
                if expected is not None:
                    try:
                        current = self.current_version(key)
                    except NotFound:
                        raise PreconditionFailed(key, "the object does not exist") from None
                    if current != expected:
                        raise PreconditionFailed(key, "the object changed")
                try:
                    os.replace(tmp, target)
                except IsADirectoryError:
                    raise self._is_directory(key) from None
                _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return _version(nonce)

    def delete(self, key: str, expected: Version | None) -> None:
        target = self.path(key)
        if not os.path.lexists(target):
            # Absent now: the delete is done (or, conditional, refused) at this instant.
            if expected is not None:
                raise NotFound(key)
            return
        with self._locked():
            if expected is not None and self.current_version(key) != expected:
                raise PreconditionFailed(key, "the object changed")
            try:
                os.unlink(target)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return  # no such object: deleting it is done
            _fsync_dir(target.parent)

    def keys(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted by byte order."""
        found: list[str] = []

        def may_hold(rel_dir: str) -> bool:
            d = rel_dir + "/"
            return d.startswith(prefix) or prefix.startswith(d)

        def walk(directory: Path, rel: str) -> None:
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                return
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if not rel and entry.name == RESERVED:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if may_hold(name):
                        walk(Path(entry.path), name)
                elif entry.is_file(follow_symlinks=False) and name.startswith(prefix):
                    found.append(name)

        walk(self.root, "")
        # UTF-8 byte order is code point order, which is str order.
        found.sort()
        return found

    def infos(self, keys: list[str]) -> list[ObjectInfo]:
        """``head`` of each key; keys deleted meanwhile and foreign files are left out."""
        out = []
        for key in keys:
            try:
                out.append(self.head(key))
            except NotFound:
                continue
            except StoreError as e:
                log.warning(
                    "local_store_foreign_file",
                    extra={"fields": {"key": key, "error": e.message}},
                )
        return out


class LocalStore(ObjectStore):
    """A directory as an object store. See the module docstring."""

    def __init__(self, root: str | os.PathLike[str], *, conditional: bool = True) -> None:
        path = Path(root)
        if not path.is_absolute():
            raise StoreError(f"a local store needs an absolute path, not {str(root)!r}")
        self._dir = _Directory(path)
        self.root = path
        self.url = path.as_uri()
        self.conditional = conditional

    async def get(self, key: str) -> StoredObject:
        return await asyncio.to_thread(self._dir.get, key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError("range start and length must not be negative")
        return await asyncio.to_thread(self._dir.get_range, key, start, length)

    async def head(self, key: str) -> ObjectInfo:
        return await asyncio.to_thread(self._dir.head, key)

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        if isinstance(mode, Create | Update) and not self.conditional:
            raise ConditionalWritesUnsupported(key)
        if isinstance(mode, Create):
            return await asyncio.to_thread(self._dir.create, key, bytes(data))
        expected = mode.version if isinstance(mode, Update) else None
        return await asyncio.to_thread(self._dir.swap, key, bytes(data), expected)

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        await asyncio.to_thread(self._dir.delete, key, if_match)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        keys = await asyncio.to_thread(self._dir.keys, prefix)
        for i in range(0, len(keys), _LIST_BATCH):
            for info in await asyncio.to_thread(self._dir.infos, keys[i : i + _LIST_BATCH]):
                yield info
