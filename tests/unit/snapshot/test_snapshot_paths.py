"""Manifest path safety and --exclude matching, as tables."""

from __future__ import annotations

import pytest

from mushroom_backup.snapshot.paths import Excludes, path_problem, tree_problem


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("a", None),
        ("a/b/c.txt", None),
        ("..a/b..", None),
        ("a b/\u00e9t\u00e9", None),
        ("caf\udce9", None),  # an undecodable name, kept as a surrogate escape
        ("", "the path is empty"),
        ("/etc/passwd", "the path is absolute"),
        ("/", "the path is absolute"),
        ("..", "the path contains '..'"),
        ("../x", "the path contains '..'"),
        ("a/../b", "the path contains '..'"),
        ("a/..", "the path contains '..'"),
        ("a//b", "the path is not normalised (an empty or '.' segment)"),
        ("a/", "the path is not normalised (an empty or '.' segment)"),
        ("./a", "the path is not normalised (an empty or '.' segment)"),
        ("a/./b", "the path is not normalised (an empty or '.' segment)"),
        ("a\x00b", "the path contains a NUL byte"),
    ],
)
def test_path_problem(path: str, problem: str | None) -> None:
    assert path_problem(path) == problem


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([("a", "dir"), ("a/b", "file"), ("c", "symlink")], None),
        ([], None),
        # an entry below a symlink would be written through it: the symlink escape
        ([("link", "symlink"), ("link/passwd", "file")], ("link/passwd", "symlink")),
        ([("f", "file"), ("f/x", "file")], ("f/x", "not a directory")),
        ([("a/b", "file")], ("a/b", "not in the manifest")),
        ([("a", "dir"), ("a", "file")], ("a", "twice")),
        ([("a", "dir"), ("a/../../etc", "file")], ("a/../../etc", "'..'")),
        ([("/abs", "file")], ("/abs", "absolute")),
    ],
)
def test_tree_problem(entries: list[tuple[str, str]], expected: tuple[str, str] | None) -> None:
    found = tree_problem(entries)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found[0] == expected[0]
        assert expected[1] in found[1]


@pytest.mark.parametrize(
    ("patterns", "path", "is_dir", "excluded"),
    [
        (["*.tmp"], "x.tmp", False, True),
        (["*.tmp"], "deep/down/x.tmp", False, True),
        (["*.tmp"], "x.tmp.keep", False, False),
        (["pg_stat_tmp"], "pg_stat_tmp", True, True),
        (["pg_stat_tmp"], "base/pg_stat_tmp", True, True),  # a name matches at any depth
        (["/pg_wal/archive_status"], "pg_wal/archive_status", True, True),
        (["/pg_wal/archive_status"], "x/pg_wal/archive_status", True, False),  # anchored
        (["cache/*"], "cache/a/b", False, True),  # '*' crosses '/' in a path pattern
        (["cache/*"], "cache", True, False),
        (["tmp/"], "tmp", True, True),  # trailing '/': directories only
        (["tmp/"], "tmp", False, False),
        (["a/b"], "a/b", False, True),
        (["a/b"], "z/a/b", False, False),
        (["*.LOG"], "x.log", False, False),  # case-sensitive
        (["x", "*.y"], "d/q.y", False, True),
        ([], "anything", False, False),
    ],
)
def test_excludes(patterns: list[str], path: str, is_dir: bool, excluded: bool) -> None:
    assert Excludes.parse(patterns).excluded(path, is_dir=is_dir) is excluded


@pytest.mark.parametrize("pattern", ["", "/", "  ", "//"])
def test_empty_exclude_pattern_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="matches nothing"):
        Excludes.parse([pattern])
