"""Snapshot ids: names that sort by time as plain strings.

A snapshot id is ``YYYYmmddTHHMMSS.mmmZ-xxxxxxxx``: the UTC wall time the snapshot was started,
to the millisecond, and 8 random hex digits (``20261129T101500.123Z-3f9a1c2e``).

Promises
--------
* Ids compare as strings in the order of their times; two ids of the same millisecond are
  ordered by their random part, which is all that tells them apart.
* :func:`new_snapshot_id` never returns an id that sorts at or before its parent's, even when
  the wall clock stepped back: it then uses the parent's time plus one millisecond. So "the
  newest snapshot" is always the greatest id, and ``LATEST`` never names an older-looking one.

Not promised: that the time in an id is exact (it is the writer's wall clock, see above).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

SNAPSHOT_ID_PATTERN = r"^[0-9]{8}T[0-9]{6}\.[0-9]{3}Z-[0-9a-f]{8}$"
_ID = re.compile(SNAPSHOT_ID_PATTERN)
_TIME_FORMAT = "%Y%m%dT%H%M%S"


def is_snapshot_id(text: str) -> bool:
    """Whether ``text`` is a well-formed snapshot id."""
    return _ID.fullmatch(text) is not None


def snapshot_time(snapshot_id: str) -> datetime:
    """The UTC time written in a snapshot id. ValueError for a malformed id."""
    if not is_snapshot_id(snapshot_id):
        raise ValueError(f"{snapshot_id!r} is not a snapshot id (YYYYmmddTHHMMSS.mmmZ-xxxxxxxx)")
    seconds, millis = snapshot_id[:15], int(snapshot_id[16:19])
    stamp = datetime.strptime(seconds, _TIME_FORMAT).replace(tzinfo=UTC)
    return stamp + timedelta(milliseconds=millis)


def format_snapshot_id(at: datetime, random_hex: str) -> str:
    """The id for wall time ``at`` (timezone-aware) and 8 hex digits of randomness."""
    if at.tzinfo is None:
        raise ValueError("a snapshot time must be timezone-aware")
    if re.fullmatch(r"[0-9a-f]{8}", random_hex) is None:
        raise ValueError("the random part of a snapshot id is 8 lowercase hex digits")
    at = at.astimezone(UTC)
    return f"{at.strftime(_TIME_FORMAT)}.{at.microsecond // 1000:03d}Z-{random_hex}"


def new_snapshot_id(now: datetime, parent_id: str | None, random_hex: str) -> str:
    """The id of a snapshot started at ``now`` whose parent is ``parent_id``: ``now`` to the
    millisecond, or the parent's time plus 1 ms if that is not later (a wall clock that stepped
    back), so the new id always sorts after its parent."""
    at = now.astimezone(UTC).replace(microsecond=now.microsecond // 1000 * 1000)
    if parent_id is not None and is_snapshot_id(parent_id):
        floor = snapshot_time(parent_id) + timedelta(milliseconds=1)
        at = max(at, floor)
    return format_snapshot_id(at, random_hex)
