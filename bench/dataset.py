"""A deterministic data set that looks like a database data directory, for the benchmarks.

Promises:

* The same ``--seed``, ``--size`` and ``--largest`` give byte-identical trees (file names,
  sizes, content and modification times) on every machine and Python version: content comes
  from SHAKE-128 of a key naming the file and the 64 KiB block, never from a shared random
  state, so the pieces can be written in any order by any number of processes.
* Shape (defaults, for 1 GiB): a few large "segment" files (the largest is ``--largest``,
  300 MiB; the others at most that, at least 32 MiB), a dozen 16 MiB log segments, and ~2,000
  small files of 4-64 KiB in a nested tree. Below 1 GiB the logs and small files shrink in
  proportion so that quick runs keep the same mix.
* Content is built from 8 KiB "pages": a header, incompressible bytes (ids, hashes), rows
  (a template from a seeded pool of text pieces, repeated within the page with 16 random bytes
  per row) and zero-filled free space. All redundancy is local to a page, so the ratio does
  not depend on the compressor's window or the chunk size: zstd level 3 gets about 2.5x on
  64 KiB or 1 MiB blocks alike; ``generate`` measures it on a sample and prints it.
* ``mutate`` rewrites 1 % of the tree's bytes (``--fraction``) in place, as whole 64 KiB extents
  aligned to 64 KiB, scattered over the large and log files in proportion to their sizes.
  Round ``N`` always picks the same extents and writes the same new bytes; sizes never change.
* Fast: no per-byte Python loops (SHAKE, ``struct`` and joins run in C), ~270 MB/s of content
  per core; files are written in 32 MiB pieces by one process per core.

Does not promise: realism beyond size mix and compressibility (no real page checksums, no
relation between files), nor stable output across versions of this file.

Usage::

    python bench/dataset.py generate DIR [--size 1GiB] [--largest 300MiB] [--seed 1]
    python bench/dataset.py mutate DIR [--round 1] [--fraction 0.01] [--seed 1]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import re
import shutil
import struct
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import zstandard

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

BLOCK = 64 * KiB  #: unit of generation, and of mutation (the "64 KiB extent")
PAGE = 8 * KiB
PAGES_PER_BLOCK = BLOCK // PAGE
HEADER = 24

LOG_SIZE = 16 * MiB
LOGS_PER_GIB = 12
SMALL_PER_GIB = 2000
SMALL_MIN, SMALL_MAX = 4 * KiB, 64 * KiB
LARGE_MIN = 32 * MiB
DEFAULT_LARGEST = 300 * MiB

#: Share of each page's body (after header and free space) that holds rows; the rest is
#: incompressible (ids, hashes, packed numbers).
ROW_SHARE = 0.65
#: Each row: a template from the pool (80-160 bytes, repeated within the page, as rows of one
#: table share most of their bytes) followed by FIELD random bytes (a key, a timestamp).
FIELD = 16
#: Free space per page is uniform in [FREE_MIN, FREE_MIN + FREE_SPAN) bytes, zero-filled.
FREE_MIN, FREE_SPAN = 512, 1024
#: Random bytes drawn per page (header words, incompressible part, row fields).
PAGE_STREAM = 6 * KiB
POOL_SIZE = 4096

# Templates are text over a skewed alphabet (letters by frequency, digits, separators, NULs).
_ALPHABET_WEIGHTS = (
    (b" ", 38),
    (b"e", 22),
    (b"t", 16),
    (b"a", 15),
    (b"o", 14),
    (b"i", 13),
    (b"n", 13),
    (b"s", 12),
    (b"r", 11),
    (b"h", 10),
    (b"l", 8),
    (b"d", 7),
    (b"c", 5),
    (b"u", 5),
    (b"m", 5),
    (b"0", 5),
    (b"1", 5),
    (b"2", 4),
    (b"|", 4),
    (b"\x00", 44),
)
TEXT_TABLE = b"".join(symbol * weight for symbol, weight in _ALPHABET_WEIGHTS)
assert len(TEXT_TABLE) == 256
ZEROS = bytes(PAGE)


@functools.cache
def template_pool(seed: int) -> tuple[bytes, ...]:
    """The seeded pool of row templates (the "precomputed pieces")."""
    stream = hashlib.shake_128(f"mushroom-bench/pool/{seed}".encode()).digest(POOL_SIZE * 161)
    lengths = stream[POOL_SIZE * 160 :]
    return tuple(
        stream[i * 160 : i * 160 + 80 + lengths[i] % 81].translate(TEXT_TABLE)
        for i in range(POOL_SIZE)
    )


@functools.cache
def _fields(count: int) -> struct.Struct:
    return struct.Struct(f"{FIELD}s" * count)


@dataclass(frozen=True)
class FileSpec:
    """One file of the data set: where it goes, how big, and which kind (large/log/small)."""

    path: str
    size: int
    kind: str


def parse_size(text: str) -> int:
    """``"1GiB"``, ``"300MiB"``, ``"64KiB"``, ``"1.5GiB"`` or a plain byte count."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1GiB, 300MiB, 4096)")
    number, unit = match.groups()
    scale = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1024 * GiB}[(unit or "")[:1].upper()]
    return int(float(number) * scale)


def human(size: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"


# --- layout -----------------------------------------------------------------------------------


def plan(size: int, largest: int | None, seed: int) -> list[FileSpec]:
    """The files of a data set of about ``size`` bytes whose largest file is ``largest``
    (``None``: 300 MiB, or all that is left for large files in a smaller set).

    Large and log files are whole multiples of 64 KiB; the total is ``size`` within one
    small file's worth. A ``largest`` that does not fit beside the logs and small files is
    an error (raise ``size``).
    """
    scale = min(1.0, size / GiB)
    n_logs = round(LOGS_PER_GIB * scale)
    n_small = max(10, round(SMALL_PER_GIB * scale))
    rng = random.Random(f"mushroom-bench-layout-{seed}")
    small_sizes = [rng.randrange(SMALL_MIN, SMALL_MAX + 1) for _ in range(n_small)]
    large_total = size - n_logs * LOG_SIZE - sum(small_sizes)
    if largest is None:
        largest = min(DEFAULT_LARGEST, large_total)
    largest = largest // BLOCK * BLOCK
    if largest < BLOCK or large_total < largest:
        raise ValueError(
            f"a largest file of {human(largest)} does not fit in {human(size)} beside "
            f"{n_logs} log segments and {n_small} small files; raise --size to at least "
            f"{human(largest + n_logs * LOG_SIZE + sum(small_sizes))}"
        )

    specs: list[FileSpec] = []
    remaining = large_total // BLOCK * BLOCK
    sizes = [largest]
    remaining -= largest
    # The rest in files of shrinking size (each 5/6 of the previous, at least LARGE_MIN, never
    # above the largest), the last one taking whatever is left.
    current = largest
    while remaining > 0:
        current = min(largest, max(LARGE_MIN, current * 5 // 6 // BLOCK * BLOCK))
        fits = remaining <= largest and remaining - current < LARGE_MIN
        take = remaining if fits else min(current, remaining)
        sizes.append(take)
        remaining -= take
    for index, file_size in enumerate(sizes):
        specs.append(FileSpec(f"base/16384/{16400 + index}", file_size, "large"))
    for index in range(n_logs):
        specs.append(FileSpec(f"pg_wal/{1:08X}{0:08X}{index + 1:08X}", LOG_SIZE, "log"))
    for index, file_size in enumerate(small_sizes):
        db = 16385 + index % 5
        group = (index // 5) % 8
        parts = [f"base/{db}", f"ns{group:02d}"]
        if (index // 40) % 3 == 0:
            parts.append("fsm")
            if (index // 120) % 2 == 0:
                parts.append(f"t{index % 7}")
        specs.append(FileSpec("/".join([*parts, f"{20000 + index}"]), file_size, "small"))
    return specs


# --- content ----------------------------------------------------------------------------------


def block(seed: int, path: str, index: int, round_: int = 0) -> bytes:
    """The 64 KiB block ``index`` of file ``path`` (``round_`` > 0: its mutated versions)."""
    key = f"mushroom-bench/{seed}/{round_}/{path}/{index}".encode()
    stream = hashlib.shake_128(key).digest(PAGES_PER_BLOCK * PAGE_STREAM)
    pool = template_pool(seed)
    parts: list[bytes] = []
    for page in range(PAGES_PER_BLOCK):
        base = page * PAGE_STREAM
        free = FREE_MIN + ((stream[base] << 8 | stream[base + 1]) * FREE_SPAN >> 16)
        template = pool[(stream[base + 2] << 8 | stream[base + 3]) % POOL_SIZE]
        body = PAGE - HEADER - free
        rows = int(body * ROW_SHARE) + stream[base + 4] % 64
        raw = body - rows
        count = rows // (len(template) + FIELD) + 2
        # header: an LSN-like random word, the page number, a checksum-like random word
        parts.append(stream[base + 8 : base + 16])
        parts.append(struct.pack("<Q", index * PAGES_PER_BLOCK + page))
        parts.append(stream[base + 16 : base + 24])
        parts.append(stream[base + 24 : base + 24 + raw])
        fields = _fields(count).unpack_from(stream, base + 24 + raw)
        parts.append(template.join(fields)[:rows])
        parts.append(ZEROS[:free])
    out = b"".join(parts)
    assert len(out) == BLOCK
    return out


PIECE = 32 * MiB
#: Generated files get fixed modification times (2026-01-01 plus their index in seconds).
MTIME_EPOCH = 1_767_225_600


def _write_piece(root: str, path: str, size: int, start: int, seed: int) -> int:
    """Write bytes [start, start + PIECE) of one (pre-sized) file; return the bytes written."""
    end = min(size, start + PIECE)
    fd = os.open(os.path.join(root, path), os.O_WRONLY)
    try:
        offset = start
        while offset < end:
            stop = min(offset + MiB, end)
            batch = b"".join(
                block(seed, path, index)
                for index in range(offset // BLOCK, (stop + BLOCK - 1) // BLOCK)
            )[: stop - offset]
            os.pwrite(fd, batch, offset)
            offset += len(batch)
    finally:
        os.close(fd)
    return end - start


def write_tree(root: Path, specs: list[FileSpec], seed: int, workers: int) -> None:
    """Create every file at its size, then fill them in 32 MiB pieces on ``workers`` processes."""
    for spec in specs:
        path = root / spec.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.truncate(spec.size)
    jobs = [
        (str(root), spec.path, spec.size, start, seed)
        for spec in specs
        for start in range(0, spec.size, PIECE)
    ]
    if workers <= 1:
        for job in jobs:
            _write_piece(*job)
        return
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_write_piece, *zip(*jobs, strict=True), chunksize=8))


def measure_ratio(root: Path, specs: list[FileSpec], sample: int = 64 * MiB) -> float:
    """zstd level 3 ratio over independent 1 MiB blocks read back from a sample of the files
    (whole small files count as one block each)."""
    compressor = zstandard.ZstdCompressor(level=3)
    raw = packed = 0
    by_kind: dict[str, list[FileSpec]] = {}
    for spec in specs:
        by_kind.setdefault(spec.kind, []).append(spec)
    total = sum(s.size for s in specs)
    for kind_specs in by_kind.values():
        budget = max(MiB, sample * sum(s.size for s in kind_specs) // total)
        for spec in kind_specs:
            with open(root / spec.path, "rb") as handle:
                while budget > 0:
                    data = handle.read(MiB)
                    if not data:
                        break
                    raw += len(data)
                    packed += len(compressor.compress(data))
                    budget -= len(data)
            if budget <= 0:
                break
    return raw / packed


@dataclass(frozen=True)
class Summary:
    root: str
    seed: int
    files: int
    bytes: int
    largest: int
    large_files: int
    log_files: int
    small_files: int
    seconds: float
    mb_per_s: float
    zstd3_ratio: float


def generate(
    root: Path, size: int, largest: int | None, seed: int, force: bool = False, workers: int = 0
) -> Summary:
    """Write the data set under ``root`` (which must be absent or empty, unless ``force``)."""
    specs = plan(size, largest, seed)
    if root.exists() and any(root.iterdir()):
        if not force:
            raise FileExistsError(f"{root} is not empty; remove it or pass --force")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    write_tree(root, specs, seed, workers or os.cpu_count() or 1)
    for index, spec in enumerate(specs):
        stamp = (MTIME_EPOCH + index) * 1_000_000_000
        os.utime(root / spec.path, ns=(stamp, stamp))
    seconds = time.perf_counter() - started
    total = sum(s.size for s in specs)
    kinds = [s.kind for s in specs]
    return Summary(
        root=str(root),
        seed=seed,
        files=len(specs),
        bytes=total,
        largest=max(s.size for s in specs),
        large_files=kinds.count("large"),
        log_files=kinds.count("log"),
        small_files=kinds.count("small"),
        seconds=round(seconds, 3),
        mb_per_s=round(total / seconds / 1e6, 1),
        zstd3_ratio=round(measure_ratio(root, specs), 3),
    )


# --- mutation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Extent:
    path: str
    offset: int


def plan_mutation(
    files: list[tuple[str, int]], total: int, fraction: float, seed: int, round_: int
) -> list[Extent]:
    """Which 64 KiB extents round ``round_`` rewrites: ``fraction`` of ``total`` bytes, spread
    over ``files`` (path, size) in proportion to their sizes (largest remainder), at distinct
    block-aligned offsets chosen by a seeded generator."""
    wanted = max(1, round(total * fraction / BLOCK))
    capacity = sum(size // BLOCK for _, size in files)
    if wanted > capacity:
        raise ValueError(f"cannot change {wanted} extents in files holding {capacity}")
    weight = sum(size for _, size in files)
    shares = [(wanted * size / weight, path, size) for path, size in files]
    counts = {path: min(int(share), size // BLOCK) for share, path, size in shares}
    by_remainder = sorted(shares, key=lambda s: (s[0] - int(s[0]), s[1]), reverse=True)
    while sum(counts.values()) < wanted:
        for _, path, size in by_remainder:
            if sum(counts.values()) < wanted and counts[path] < size // BLOCK:
                counts[path] += 1
    extents: list[Extent] = []
    for path, size in sorted(files):
        rng = random.Random(f"mushroom-bench-mutate-{seed}-{round_}-{path}")
        for index in sorted(rng.sample(range(size // BLOCK), counts[path])):
            extents.append(Extent(path, index * BLOCK))
    return extents


def mutate(root: Path, seed: int, round_: int, fraction: float) -> dict[str, object]:
    """Rewrite the extents of round ``round_`` in place (see :func:`plan_mutation`)."""
    files: list[tuple[str, int]] = []
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            size = path.stat().st_size
            total += size
            rel = path.relative_to(root).as_posix()
            if rel.startswith(("base/16384/", "pg_wal/")):
                files.append((rel, size))
    if not files:
        raise FileNotFoundError(f"{root} holds no large or log files: generate it first")
    started = time.perf_counter()
    extents = plan_mutation(files, total, fraction, seed, round_)
    for rel in sorted({e.path for e in extents}):
        with open(root / rel, "r+b") as handle:
            for extent in (e for e in extents if e.path == rel):
                handle.seek(extent.offset)
                handle.write(block(seed, rel, extent.offset // BLOCK, round_))
    return {
        "root": str(root),
        "round": round_,
        "extents": len(extents),
        "files_touched": len({e.path for e in extents}),
        "bytes_changed": len(extents) * BLOCK,
        "tree_bytes": total,
        "fraction": round(len(extents) * BLOCK / total, 5),
        "seconds": round(time.perf_counter() - started, 3),
    }


# --- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write a fresh data set")
    gen.add_argument("root", type=Path)
    gen.add_argument("--size", type=parse_size, default=GiB, help="total size (default 1GiB)")
    gen.add_argument(
        "--largest", type=parse_size, default=None, help="largest file (default 300MiB)"
    )
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--force", action="store_true", help="replace a non-empty ROOT")
    gen.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    mut = sub.add_parser("mutate", help="rewrite 1%% of the bytes in 64 KiB extents, in place")
    mut.add_argument("root", type=Path)
    mut.add_argument("--round", type=int, default=1, dest="round_")
    mut.add_argument("--fraction", type=float, default=0.01)
    mut.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            summary = generate(
                args.root, args.size, args.largest, args.seed, args.force, args.workers
            )
            print(
                f"generated {summary.files} files, {human(summary.bytes)} "
                f"(largest {human(summary.largest)}) in {summary.seconds:.1f} s "
                f"({summary.mb_per_s:.0f} MB/s); zstd-3 ratio on 1 MiB blocks "
                f"{summary.zstd3_ratio:.2f}x",
                file=sys.stderr,
            )
            print(json.dumps(asdict(summary)))
        else:
            if args.round_ < 1:
                parser.error("--round must be 1 or more (round 0 is the generated content)")
            result = mutate(args.root, args.seed, args.round_, args.fraction)
            print(
                f"mutated {result['extents']} extents of 64 KiB in {result['files_touched']} "
                f"files ({human(int(str(result['bytes_changed'])))}, "
                f"{float(str(result['fraction'])):.2%} of the tree)",
                file=sys.stderr,
            )
            print(json.dumps(result))
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"dataset: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
