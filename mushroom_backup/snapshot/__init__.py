"""Snapshots: scanning, chunking, hashing, compression, the bucket format, ``LATEST``, restore.

API (everything takes an :class:`~mushroom_backup.store.base.ObjectStore`; pass a
:class:`~mushroom_backup.lease.fenced.FencedStore` to fence the writes by the lease):

* :func:`take_snapshot` (:class:`BackupOptions`, :class:`WriterInfo` -> :class:`SnapshotResult`)
* :func:`restore_snapshot` (-> :class:`RestoreResult`), also ``verify_only``
* :func:`list_snapshots` (-> :class:`SnapshotInfo`, oldest first), :func:`read_latest`
  (-> :class:`LatestRef` or None), :func:`load_manifest` (-> :class:`Manifest`)
* :class:`ProgressSink` -- ``start(total_files, total_bytes)``, ``advance(files, nbytes)``

Bucket format (version 1)
=========================

Everything lives under the store's prefix::

    data/{id[:2]}/{id}       pack: many compressed chunks; id = SHA-256 of the object
    manifests/{snapshot_id}  manifest: what one snapshot contains and where each chunk is
    LATEST                   which complete snapshot is the newest

Chunks. A file is cut into **fixed-size chunks at file offsets** (default 512 KiB; the last
one shorter). A chunk's id is the SHA-256 of its bytes; it is stored once per bucket, as one
**zstd frame** (level 3 by default) inside a pack. Files of at most one chunk are one chunk,
whose id is then also the file's hash.

Packs (:mod:`.pack`). Chunks are appended, in the order they are read, to a pack that is
uploaded once it reaches 4 MiB (configurable). A pack is ``frames | trailer | u64 LE trailer
length | b"MBPACK\\x00\\x01"``; the trailer is a zstd frame of JSON listing every chunk as
``[sha256, offset, length, raw_length]``, so a pack can be checked or re-indexed without any
manifest. Packs are written create-only (``If-None-Match: *``); "already exists" means the same
bytes are there, which is fine.

Manifests (:mod:`.manifest`). Two zstd frames = two lines of canonical JSON: a small
**header** (format version, snapshot id, parent id, created_at, source host and path, writer
with instance id and lease exclusion -- and node id, boot incarnation and process term in a
cluster --, chunking parameters, and a **summary**: files, dirs, symlinks, bytes, bytes read,
new chunks/packs/bytes stored, unstable and skipped entries), then the **body**: every entry
(path relative, normalised, sorted; type file/dir/symlink; mode, mtime_ns, uid/gid; for
files size, SHA-256 of the whole content, chunk ids in order, inode, dev and ctime_ns for
change detection, ``unstable`` if it never stopped changing while read; for symlinks the target)
and the snapshot's **chunk table**: per pack, the chunks it uses with offset, stored length and
raw length. A manifest is validated strictly on every read; a bad one is an IntegrityError (exit
5) naming it, never repaired.

Snapshot ids are ``YYYYmmddTHHMMSS.mmmZ-xxxxxxxx`` (UTC start time, 8 random hex digits): they
sort by time as strings, and a new id always sorts after its parent's (:mod:`.ids`).

``LATEST`` is JSON ``{"format", "snapshot_id", "manifest", "created_at", "written_at",
"writer"}``; its body differs for every snapshot, so its ETag changes at every swap.

Write order (DESIGN.md): every pack (create-only, concurrently), then the manifest
(create-only), then ``LATEST`` (``If-Match`` the version read when the backup started;
``If-None-Match: *`` if there was none). A manifest is written only after every pack it needs
was stored, and ``LATEST`` moves only to a stored manifest, so it always names a complete,
restorable snapshot. If any upload fails or the lease's fence closes, the snapshot is abandoned:
no manifest, ``LATEST`` untouched; its packs are orphans for ``prune``. A refused ``LATEST`` swap
means another writer moved it: ``LatestMoved``, exit 4, the lease is lost.

Dedup. The chunks known to be stored are those in the chunk table of the snapshot ``LATEST``
names when the backup starts; files whose size, mtime_ns, ctime_ns and inode match that
snapshot are not read at all. Chunks only abandoned snapshots stored are uploaded again.

Why this layout
---------------
* **Few requests for many small files.** 2,000 files of 4-64 KiB become ~7 pack uploads, not
  2,000 PUTs; restore fetches them with ranged GETs of adjacent chunks, shared by consecutive
  runs of the restore (a pack read front to back costs one GET; gaps up to 1 MiB are read
  through so that a rewritten chunk does not split a GET). On S3 a request costs as much as
  storing ~100 KiB for a month; on a local SeaweedFS each GET or PUT costs ~5 ms of server
  CPU and a few ms of ours (measured), as much as compressing ~2 MiB.
* **Packs of 4 MiB**: one PUT per 4 MiB stored (~100 for the 1 GiB bench set), while the packs
  in flight (4 by default, each held twice: ours and the HTTP client's copy) keep the
  client's memory well under 200 MiB; 8 MiB packs measured 15-25% more peak RSS.
* **Small changes upload little.** Databases rewrite pages in place and append to logs. With
  chunks aligned to file offsets, a changed 8 KiB page or 64 KiB extent dirties exactly the one
  chunk it lies in (or two, when it straddles a boundary): one 64 KiB change costs one 512 KiB
  chunk, ~200 KiB compressed, plus the new manifest. An appended log re-uploads only its last
  chunk and the new ones. The trade-off: bytes *inserted* in the middle of a file shift every
  later chunk and re-upload the rest of that file -- which is not how databases write.
  Content-defined chunking would survive insertions, but costs a rolling hash over every byte
  in Python and produces chunks that do not line up with pages.
* **Unchanged files are not read**, so an unchanged re-backup uploads only the manifest and
  ``LATEST``.
* **Speed on few cores.** No rolling hash; SHA-256 (SHA-NI, ~1.4 GB/s per core) and zstd level 3
  run in threads with the GIL released; 512 KiB chunks keep per-chunk Python overhead negligible
  while compressing about as well as larger ones (redundancy in database pages is local).
* **Listing is cheap.** ``snapshots`` reads only each manifest's first frame (one ranged GET).
* **Self-describing packs** let ``check`` verify a pack without manifests and a future index
  rebuild recover chunk locations.

Not provided: encryption at rest (use the bucket's server-side encryption), hard links, sparse
files, xattrs/ACLs.
"""

from __future__ import annotations

from .backup import BackupOptions, SnapshotResult, take_snapshot
from .catalog import LatestRef, SnapshotInfo, list_snapshots, load_manifest, read_latest
from .manifest import (
    ChunkLocation,
    DirEntry,
    FileEntry,
    LatestRecord,
    Manifest,
    ManifestHeader,
    Summary,
    SymlinkEntry,
    WriterInfo,
)
from .progress import NoProgress, ProgressSink
from .restore import RestoreResult, restore_snapshot
from .scan import SnapshotWarning

__all__ = [
    "BackupOptions",
    "ChunkLocation",
    "DirEntry",
    "FileEntry",
    "LatestRecord",
    "LatestRef",
    "Manifest",
    "ManifestHeader",
    "NoProgress",
    "ProgressSink",
    "RestoreResult",
    "SnapshotInfo",
    "SnapshotResult",
    "SnapshotWarning",
    "Summary",
    "SymlinkEntry",
    "WriterInfo",
    "list_snapshots",
    "load_manifest",
    "read_latest",
    "restore_snapshot",
    "take_snapshot",
]
