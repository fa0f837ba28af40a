"""Write a small deterministic tree that looks like a database data directory (demo only).

Re-running changes nothing that exists except one "hot" table file, whose first page is
rewritten so that a second backup has something new to store.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path


def text_block(rng: random.Random, size: int) -> bytes:
    words = [b"tuple", b"page", b"xid", b"insert", b"update", b"index", b"vacuum", b"wal"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b" " + str(rng.randrange(1 << 30)).encode() + b"\n"
    return bytes(out[:size])


def main(target: Path) -> None:
    rng = random.Random(20261129)
    (target / "base" / "16384").mkdir(parents=True, exist_ok=True)
    (target / "pg_wal").mkdir(exist_ok=True)
    (target / "global").mkdir(exist_ok=True)
    for index in range(3):
        path = target / "base" / "16384" / f"{16400 + index}"
        if not path.exists():
            path.write_bytes(text_block(rng, 3 << 20))
    for index in range(2):
        path = target / "pg_wal" / f"00000001000000000000000{index}"
        if not path.exists():
            path.write_bytes(text_block(rng, 1 << 20))
    for index in range(40):
        path = target / "global" / f"{1200 + index}"
        if not path.exists():
            path.write_bytes(text_block(rng, rng.randrange(4096, 65536)))
    (target / "PG_VERSION").write_text("16\n")
    (target / "postgresql.auto.conf").write_text("# managed by ALTER SYSTEM\n")
    os.chmod(target / "postgresql.auto.conf", 0o600)
    link = target / "current_wal"
    if not link.is_symlink():
        link.symlink_to("pg_wal/000000010000000000000001")
    (target / "empty_dir").mkdir(exist_ok=True)
    hot = target / "base" / "16384" / "16400"
    with hot.open("r+b") as handle:
        handle.write(text_block(random.Random(), 8192))
    print(f"sample data ready: {sum(1 for _ in target.rglob('*'))} entries under {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
