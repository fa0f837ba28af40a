"""Walking the source directory: what a snapshot will contain.

:func:`scan_tree` lists every regular file, directory and symlink below the source (the source
directory itself is not an entry), with the metadata a manifest records and change detection
compares. It runs in a worker thread (blocking calls only).

Promises
--------
* Symlinks are recorded as links (their target text), never followed; the source itself may be
  a symlink to a directory (it is the root the user named).
* Sockets, FIFOs and device nodes are skipped, each with a ``special-file`` warning.
* ``--exclude`` patterns apply as :mod:`.paths` describes; an excluded directory is not read.
* An unreadable directory is a :class:`~mushroom_backup.errors.SnapshotError` naming it, unless
  ``skip_unreadable`` (then its entry is kept, empty, with an ``unreadable`` warning). An entry
  that vanishes during the walk is left out with a ``vanished`` warning.
* Entries come back sorted by path (code point order), so every directory precedes its contents.

Not promised: a consistent view of a tree that changes during the walk (files are checked again
when they are read, see :mod:`.reader`); hard links are not detected (each name is a file).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import SnapshotError
from .paths import Excludes

EntryKind = Literal["file", "dir", "symlink"]
WarningKind = Literal["special-file", "unreadable", "vanished", "unstable"]


@dataclass(frozen=True, slots=True)
class SnapshotWarning:
    """Something left out or stored imperfectly, with the relative path it concerns."""

    kind: WarningKind
    path: str
    message: str


@dataclass(frozen=True, slots=True)
class ScannedEntry:
    """One entry of the source as ``lstat`` saw it during the walk."""

    path: str
    kind: EntryKind
    mode: int
    mtime_ns: int
    ctime_ns: int
    size: int
    inode: int
    dev: int
    uid: int
    gid: int
    target: str | None = None


@dataclass
class ScanResult:
    entries: list[ScannedEntry] = field(default_factory=list)
    warnings: list[SnapshotWarning] = field(default_factory=list)


def _entry(path: str, kind: EntryKind, st: os.stat_result, target: str | None) -> ScannedEntry:
    return ScannedEntry(
        path=path,
        kind=kind,
        mode=stat.S_IMODE(st.st_mode),
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
        size=st.st_size if kind == "file" else 0,
        inode=st.st_ino,
        dev=st.st_dev,
        uid=st.st_uid,
        gid=st.st_gid,
        target=target,
    )


def _special_kind(mode: int) -> str:
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        return "device node"
    return "special file"


def scan_tree(source: Path, excludes: Excludes, *, skip_unreadable: bool) -> ScanResult:
    """Walk ``source`` as the module docstring says."""
    try:
        root = os.stat(source)
    except OSError as e:
        raise SnapshotError(f"cannot read the source directory {source}: {e.strerror}") from None
    if not stat.S_ISDIR(root.st_mode):
        raise SnapshotError(f"the source {source} is not a directory")
    result = ScanResult()
    pending: list[tuple[str, str]] = [(os.fspath(source), "")]
    while pending:
        directory, prefix = pending.pop()
        try:
            with os.scandir(directory) as listing:
                children = sorted(listing, key=lambda child: child.name)
        except FileNotFoundError:
            result.warnings.append(
                SnapshotWarning("vanished", prefix.rstrip("/"), "directory vanished")
            )
            continue
        except OSError as e:
            where = prefix.rstrip("/") or "."
            if not skip_unreadable:
                raise SnapshotError(
                    f"cannot read directory {os.path.join(os.fspath(source), prefix)}: "
                    f"{e.strerror}; fix its permissions, exclude it (--exclude), or pass "
                    "--skip-unreadable"
                ) from None
            result.warnings.append(
                SnapshotWarning("unreadable", where, f"directory not read: {e.strerror}")
            )
            continue
        for child in children:
            path = prefix + child.name
            try:
                st = child.stat(follow_symlinks=False)
            except FileNotFoundError:
                result.warnings.append(SnapshotWarning("vanished", path, "vanished during scan"))
                continue
            mode = st.st_mode
            if excludes.excluded(path, is_dir=stat.S_ISDIR(mode)):
                continue
            if stat.S_ISDIR(mode):
                result.entries.append(_entry(path, "dir", st, None))
                pending.append((child.path, path + "/"))
            elif stat.S_ISREG(mode):
                result.entries.append(_entry(path, "file", st, None))
            elif stat.S_ISLNK(mode):
                try:
                    target = os.readlink(child.path)
                except FileNotFoundError:
                    result.warnings.append(SnapshotWarning("vanished", path, "vanished"))
                    continue
                result.entries.append(_entry(path, "symlink", st, target))
            else:
                what = _special_kind(mode)
                result.warnings.append(
                    SnapshotWarning("special-file", path, f"{what} skipped (not backed up)")
                )
    result.entries.sort(key=lambda entry: entry.path)
    return result
