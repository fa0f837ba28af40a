"""Object stores: one async interface (:mod:`.base`), three backends, and URL parsing.

``open_store(url)`` is the only way the rest of the package makes a store:

* ``s3://bucket/prefix`` -- :class:`.s3.S3Store` (aiobotocore; endpoint, region and credentials
  from the standard AWS environment variables and profiles);
* ``file:///abs/path`` -- :class:`.local.LocalStore` (a directory with real compare-and-swap);
* ``memory://[name]`` -- :class:`.memory.MemoryStore` (tests).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from ..errors import UsageError
from .base import (
    CREATE,
    OVERWRITE,
    Create,
    ObjectInfo,
    ObjectStore,
    Overwrite,
    PutMode,
    StoredObject,
    Update,
    Version,
    join_key,
)

__all__ = [
    "CREATE",
    "OVERWRITE",
    "Create",
    "ObjectInfo",
    "ObjectStore",
    "Overwrite",
    "PutMode",
    "StoredObject",
    "Update",
    "Version",
    "join_key",
    "open_store",
    "parse_store_url",
]

_HELP = "use s3://BUCKET/PREFIX, file:///ABSOLUTE/PATH or memory://NAME"
# Letters, digits, '.', '-', '_' (AWS allows fewer; some S3-compatible services allow more).
_BUCKET = re.compile(r"[A-Za-z0-9._-]+")


def parse_store_url(url: str) -> tuple[str, str, str]:
    """Split a store URL into ``(scheme, location, prefix)``; a bad URL is a UsageError.

    ``s3``: location is the bucket, prefix the key prefix (no leading/trailing slash).
    ``file``: location is the absolute directory path, prefix empty.
    ``memory``: location is the name, prefix empty.
    """
    if not url or not url.strip():
        raise UsageError(f"no store URL given; {_HELP}")
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        raise UsageError(f"store URL {url!r} cannot be parsed; {_HELP}") from None
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        raise UsageError(
            "store URLs must not carry credentials; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"store URL {url!r} must not have a query or fragment; {_HELP}")
    if scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET.fullmatch(bucket):
            raise UsageError(f"store URL {url!r} names no valid bucket; {_HELP}")
        prefix = unquote(parts.path).strip("/")
        if any(seg in ("", ".", "..") for seg in prefix.split("/")) and prefix:
            raise UsageError(f"store URL {url!r} has an empty, '.' or '..' path segment")
        return "s3", bucket, prefix
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(
                f"store URL {url!r} names a host; a local store is file:///ABSOLUTE/PATH"
            )
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise UsageError(f"store URL {url!r} needs an absolute path: file:///ABSOLUTE/PATH")
        return "file", path.rstrip("/") or "/", ""
    if scheme == "memory":
        return "memory", parts.netloc + parts.path, ""
    if not scheme and url.strip().startswith("/"):
        raise UsageError(f"store URL {url!r} is a bare path; write it as file://{url.strip()}")
    raise UsageError(f"unsupported store URL {url!r}; {_HELP}")


def open_store(url: str, *, conditional: bool = True) -> ObjectStore:
    """The store a URL names. ``conditional=False`` is best-effort mode: the client refuses
    conditional writes with ConditionalWritesUnsupported and callers read, then write."""
    scheme, location, prefix = parse_store_url(url)
    if scheme == "s3":
        from .s3 import S3Store

        return S3Store(location, prefix, conditional=conditional)
    if scheme == "file":
        from .local import LocalStore

        return LocalStore(location, conditional=conditional)
    from .memory import MemoryStore

    return MemoryStore(location, conditional=conditional)
