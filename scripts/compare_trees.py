"""Compare two trees byte for byte, with modes, mtimes and symlink targets (demo and bench).

Exit 0 and print a one-line summary when they match; exit 1 listing every difference.
"""

from __future__ import annotations

import filecmp
import os
import stat
import sys
from pathlib import Path


def entries(root: Path) -> dict[str, os.stat_result]:
    found: dict[str, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = path.lstat()
    return found


def compare(left: Path, right: Path) -> list[str]:
    a, b = entries(left), entries(right)
    problems = [f"missing in restore: {p}" for p in sorted(a.keys() - b.keys())]
    problems += [f"extra in restore: {p}" for p in sorted(b.keys() - a.keys())]
    for rel in sorted(a.keys() & b.keys()):
        sa, sb = a[rel], b[rel]
        if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
            problems.append(f"type differs: {rel}")
            continue
        if stat.S_ISLNK(sa.st_mode):
            if os.readlink(left / rel) != os.readlink(right / rel):
                problems.append(f"link target differs: {rel}")
            continue
        if stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
            problems.append(f"mode differs: {rel}")
        if stat.S_ISREG(sa.st_mode):
            if sa.st_mtime_ns != sb.st_mtime_ns:
                problems.append(f"mtime differs: {rel}")
            if not filecmp.cmp(left / rel, right / rel, shallow=False):
                problems.append(f"content differs: {rel}")
    return problems


def main() -> int:
    left, right = Path(sys.argv[1]), Path(sys.argv[2])
    problems = compare(left, right)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    total = sum(s.st_size for s in entries(left).values() if stat.S_ISREG(s.st_mode))
    print(f"identical: {len(entries(left))} entries, {total} bytes, modes, mtimes and links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
