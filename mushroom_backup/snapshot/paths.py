"""Relative paths in manifests, and which source paths ``--exclude`` leaves out. Pure code.

Manifest paths
--------------
A manifest path is relative to the snapshot's source directory, POSIX (``/``-separated) and
normalised: not empty, no leading ``/``, no empty, ``.`` or ``..`` segment (so no trailing or
doubled ``/`` either), no NUL. :func:`path_problem` says what is wrong with one, or None.

A manifest as a whole must also not reach outside its target *through its own entries*:
every proper ancestor of an entry must be a directory entry of the same manifest (so nothing is
ever written through a symlink or into a file the manifest itself creates), and no path may
appear twice. :func:`tree_problem` checks both. Restore additionally refuses an existing symlink
in the target where the manifest has a directory (see :mod:`.restore`).

Excludes
--------
``--exclude PATTERN`` uses :func:`fnmatch.fnmatchcase` (``*``, ``?``, ``[...]``; case-sensitive):

* a pattern without ``/`` is matched against the *name* of every file, directory and symlink,
  at any depth (``*.tmp``, ``pg_stat_tmp``);
* a pattern with ``/`` is matched against the whole relative path, anchored at the source
  directory (a leading ``/`` is allowed and ignored: ``/pg_wal/archive_status``); ``*`` also
  matches ``/`` there, so ``cache/*`` is everything below ``cache``;
* a pattern ending in ``/`` only matches directories (``tmp/``);
* an excluded directory is not descended into: its whole subtree is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase


def path_problem(path: str) -> str | None:
    """What makes ``path`` unusable as a manifest path, or None if it is fine."""
    if not path:
        return "the path is empty"
    if "\x00" in path:
        return "the path contains a NUL byte"
    if path.startswith("/"):
        return "the path is absolute"
    for segment in path.split("/"):
        if segment == "..":
            return "the path contains '..'"
        if segment in ("", "."):
            return "the path is not normalised (an empty or '.' segment)"
    return None


def parent_of(path: str) -> str | None:
    """The parent of a manifest path, or None for a top-level one."""
    head, sep, _ = path.rpartition("/")
    return head if sep else None


def tree_problem(entries: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """For ``(path, type)`` pairs (type ``file``/``dir``/``symlink``), the first path that breaks
    the manifest rules and why, or None. Checks each path (:func:`path_problem`), duplicates,
    and that every proper ancestor is a directory entry (no entry below a symlink or a file)."""
    kinds: dict[str, str] = {}
    pairs = list(entries)
    for path, kind in pairs:
        problem = path_problem(path)
        if problem is not None:
            return path, problem
        if path in kinds:
            return path, "the path appears twice"
        kinds[path] = kind
    # Checking each entry's immediate parent covers every ancestor: the parent is an entry too.
    for path, _kind in pairs:
        parent = parent_of(path)
        if parent is None:
            continue
        parent_kind = kinds.get(parent)
        if parent_kind is None:
            return path, f"its parent directory {parent!r} is not in the manifest"
        if parent_kind == "symlink":
            return path, f"it would be written through the symlink {parent!r}"
        if parent_kind != "dir":
            return path, f"its parent {parent!r} is not a directory"
    return None


@dataclass(frozen=True, slots=True)
class _Pattern:
    glob: str
    whole_path: bool
    dirs_only: bool


@dataclass(frozen=True, slots=True)
class Excludes:
    """A compiled list of ``--exclude`` patterns (see the module docstring)."""

    patterns: tuple[_Pattern, ...] = ()

    @classmethod
    def parse(cls, patterns: Sequence[str]) -> Excludes:
        """Compile patterns; an empty pattern (or only ``/``) is a ValueError."""
        compiled = []
        for raw in patterns:
            text = raw.strip()
            dirs_only = text.endswith("/")
            text = text.rstrip("/")
            whole_path = "/" in text or raw.strip().startswith("/")
            text = text.lstrip("/")
            if not text:
                raise ValueError(f"exclude pattern {raw!r} matches nothing; give a name or path")
            compiled.append(_Pattern(text, whole_path, dirs_only))
        return cls(tuple(compiled))

    def excluded(self, path: str, *, is_dir: bool) -> bool:
        """Whether the entry at relative ``path`` is left out."""
        name = path.rpartition("/")[2]
        for pattern in self.patterns:
            if pattern.dirs_only and not is_dir:
                continue
            subject = path if pattern.whole_path else name
            if fnmatchcase(subject, pattern.glob):
                return True
        return False
