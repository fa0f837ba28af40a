"""The bucket lease's record format and its pure rules (no I/O, no clock reads).

Everything here is a plain function of its inputs and an explicit ``now``;
:mod:`mushroom_backup.lease.bucket` reads the clock and the store and calls these.

The record (``LEASE`` at the backup prefix's root) is byte-compatible with the Rust agent::

    {"instance_id":"…","acquired_at":"…","renewed_at":"…","ttl_s":30,"host":"…","pid":42}

* The four Rust fields come first, in the Rust struct's order, compact like ``serde_json``; the
  optional ``host`` and ``pid`` follow (serde ignores unknown fields, so the Rust agent reads
  ours; we ignore any field we do not know).
* Stamps are RFC 3339 in UTC with ``Z`` and only as many fractional digits as needed, exactly
  as the Rust ``time`` crate writes them (``2026-11-29T10:00:00Z``,
  ``2026-11-29T10:00:00.5Z``). Any RFC 3339 stamp is read, whatever its offset.
* A record that is not UTF-8 JSON, not an object, lacks one of the four fields, has one twice, or
  has one of the wrong type (``ttl_s`` must be an integer in ``0..2**64-1``, like serde's u64) is
  *unparseable*: :func:`decode_record` raises ``ValueError`` saying what is wrong. A record
  whose ``renewed_at`` does not parse as RFC 3339 *is* a record, but never fresh.

Rules (all times are the *reader's* clock):

* fresh: ``now - renewed_at < ttl_s`` (the holder's TTL governs); a stamp in the future is
  fresh; an unparseable stamp is not.
* suspect: ``ttl_s > MAX_SANE_TTL_S``, or ``renewed_at - now > ttl_s``. A suspect record that
  is also fresh blocks only until a contender has seen it unchanged for one of *its own* TTLs
  on its monotonic clock (:func:`judge_foreign`).
* the write fence: a holder may start a write until 2/3 of its TTL after the moment it sent
  its last confirmed renewal, on the monotonic *and* the wall clock (:func:`write_deadline`).

Not here: anything that reads the clock, the store or the environment implicitly.
"""

from __future__ import annotations

import enum
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import (
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    PreconditionsIgnored,
)
from ..store.base import Version

#: How many times an acquire looks again after losing a race for the key before it reports
#: the winner.
ACQUIRE_RACES = 3

#: The longest TTL a lease record is trusted with (one hour). A longer one is suspect.
MAX_SANE_TTL_S = 3600

#: A lease record is a few hundred bytes; anything over this is not one (and is not parsed).
MAX_RECORD_BYTES = 64 * 1024

#: An ETag the probe sends with ``If-Match``; no service ever issues it. (The Rust agent's probe
#: ETag, so both agents' probes look alike in a service's access log.)
PROBE_ETAG = '"mushroomdb-lease-probe-not-an-etag"'

_U64_MAX = 2**64 - 1
_FIELDS = ("instance_id", "acquired_at", "renewed_at", "ttl_s")
_MICROSECOND = timedelta(microseconds=1)


def new_instance_id() -> str:
    """A new random instance id: 16 random bytes as 32 lowercase hex digits."""
    return secrets.token_hex(16)


class Exclusion(enum.Enum):
    """How strongly the lease excludes a second writer on this service."""

    #: Every acquire and renewal is one compare-and-swap on the service.
    CONDITIONAL = "conditional"
    #: No usable conditional PUT: each step reads, then writes, and two writers may overlap
    #: until the next renewal.
    BEST_EFFORT = "best-effort"

    def __str__(self) -> str:
        return self.value


# --- stamps --------------------------------------------------------------------------------

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


def format_rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as the Rust ``time`` crate's ``Rfc3339`` writes it: ``Z``, and the
    fraction of a second only when it is not zero, without trailing zeros."""
    if moment.tzinfo is None:
        raise ValueError("a lease stamp needs a timezone-aware time")
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += "." + f"{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time as an aware UTC datetime; ``ValueError`` when it is not one.

    Fractions finer than a microsecond are truncated (a Rust stamp carries nanoseconds); a
    leap second (``:60``) reads as the last microsecond of its minute.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    fraction = match.group(7) or ""
    micro = int((fraction + "000000")[:6])
    if second == 60:
        second, micro = 59, 999_999
    offset = timedelta(0)
    if match.group(9) is not None:
        hours, minutes = int(match.group(10)), int(match.group(11))
        if hours > 23 or minutes > 59:
            raise ValueError(f"{text!r} is not an RFC 3339 time (impossible UTC offset)")
        offset = timedelta(hours=hours, minutes=minutes)
        if match.group(9) == "-":
            offset = -offset
    try:
        local = datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)
        return local - offset
    except (ValueError, OverflowError) as error:
        raise ValueError(f"{text!r} is not an RFC 3339 time ({error})") from None


# --- the record ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The ``LEASE`` object's contents. Stamps stay text: a foreign record with a stamp we
    cannot read is still a record (and never fresh)."""

    #: 32 hex digits, random per process start (any text in a foreign record).
    instance_id: str
    #: RFC 3339, the holder's wall clock, when it took the lease.
    acquired_at: str
    #: RFC 3339, the holder's wall clock, when it sent its last renewal.
    renewed_at: str
    #: How long after ``renewed_at`` the lease stays the holder's; the holder's value governs.
    ttl_s: int
    #: Where the holder runs (ours only; informational).
    host: str | None = None
    pid: int | None = None

    def encode(self) -> bytes:
        """The exact bytes written to the store (see the module docstring)."""
        fields: dict[str, Any] = {
            "instance_id": self.instance_id,
            "acquired_at": self.acquired_at,
            "renewed_at": self.renewed_at,
            "ttl_s": self.ttl_s,
        }
        if self.host is not None:
            fields["host"] = self.host
        if self.pid is not None:
            fields["pid"] = self.pid
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen and key in _FIELDS:
            raise ValueError(f"field {key!r} appears twice")
        seen[key] = value
    return seen


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_record(data: bytes) -> LeaseRecord:
    """Read a ``LEASE`` object as the Rust agent would. ``ValueError`` (one line saying what is
    wrong) when it is not a lease record; unknown fields are ignored."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"the lease object is {len(data)} bytes, not a lease record")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the lease object is not UTF-8 text") from None
    try:
        fields = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as error:
        raise ValueError(f"the lease object is not JSON ({error.msg} at {error.pos})") from None
    except RecursionError:
        raise ValueError("the lease object is not a lease record (nested too deeply)") from None
    except ValueError as error:  # a duplicate field, NaN, an integer too long to read
        raise ValueError(f"the lease object is not a lease record ({error})") from None
    if not isinstance(fields, dict):
        raise ValueError("the lease object is not a JSON object")
    missing = [name for name in _FIELDS if name not in fields]
    if missing:
        raise ValueError(f"the lease object lacks {', '.join(missing)}")
    for name in ("instance_id", "acquired_at", "renewed_at"):
        if not isinstance(fields[name], str):
            raise ValueError(f"the lease object's {name} is not a string")
    ttl = fields["ttl_s"]
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= _U64_MAX:
        raise ValueError(f"the lease object's ttl_s {ttl!r} is not a whole number of seconds")
    host = fields.get("host")
    pid = fields.get("pid")
    return LeaseRecord(
        instance_id=fields["instance_id"],
        acquired_at=fields["acquired_at"],
        renewed_at=fields["renewed_at"],
        ttl_s=ttl,
        host=host if isinstance(host, str) else None,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
    )


def _micros(delta: timedelta) -> int:
    return delta // _MICROSECOND


def _renewed(record: LeaseRecord) -> datetime | None:
    try:
        return parse_rfc3339(record.renewed_at)
    except ValueError:
        return None


def is_fresh(record: LeaseRecord, now: datetime) -> bool:
    """Whether the lease is still its holder's at ``now`` (the reader's wall clock):
    ``now - renewed_at < ttl_s``. A future stamp is fresh; an unparseable one is not."""
    renewed = _renewed(record)
    if renewed is None:
        return False
    # Whole microseconds as integers: exact at the boundary, and no overflow for a u64 TTL.
    return _micros(now - renewed) < record.ttl_s * 1_000_000


def is_suspect(record: LeaseRecord, now: datetime) -> bool:
    """Whether the record cannot be trusted to expire on time: a TTL over
    :data:`MAX_SANE_TTL_S`, or renewed more than its own TTL in the future."""
    if record.ttl_s > MAX_SANE_TTL_S:
        return True
    renewed = _renewed(record)
    if renewed is None:
        return False
    return _micros(renewed - now) > record.ttl_s * 1_000_000


# --- a contender's view of a foreign record ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sighting:
    """A suspect foreign record a contender has seen, and since when (its monotonic clock)."""

    version: Version
    record: LeaseRecord
    since: float


@dataclass(slots=True)
class LeaseWatch:
    """What one contender has seen of a suspect foreign lease across acquire attempts. Pass the
    same watch (and the same instance id) to every attempt."""

    seen: Sighting | None = None


class Verdict(enum.Enum):
    """What a contender does about a foreign record."""

    #: Not fresh (expired, or its stamp does not parse): take it over.
    TAKE_OVER_STALE = "stale"
    #: Fresh and trustworthy: it blocks.
    BLOCKED = "blocked"
    #: Suspect, seen for the first time (or changed since last seen): it blocks, and the watch
    #: starts now.
    SUSPECT_NOTICED = "suspect-noticed"
    #: Suspect and unchanged, but not yet for one of our TTLs: it blocks.
    SUSPECT_WAITING = "suspect-waiting"
    #: Suspect and unchanged for one of our TTLs: take it over.
    TAKE_OVER_SUSPECT = "suspect-takeover"

    @property
    def blocks(self) -> bool:
        return self in (Verdict.BLOCKED, Verdict.SUSPECT_NOTICED, Verdict.SUSPECT_WAITING)


def judge_foreign(
    record: LeaseRecord,
    version: Version,
    *,
    our_ttl_s: int,
    seen: Sighting | None,
    now_wall: datetime,
    now_mono: float,
) -> tuple[Verdict, Sighting | None]:
    """Whether a record naming another instance keeps us out, and the watch state to keep.

    A record that is not fresh is taken over (the watch is left as it was). A fresh record
    that is not suspect blocks and clears the watch. A fresh suspect record blocks until the
    same version of it has been seen unchanged for ``our_ttl_s`` seconds of our monotonic
    clock; a different version restarts the watch.
    """
    if not is_fresh(record, now_wall):
        return Verdict.TAKE_OVER_STALE, seen
    if not is_suspect(record, now_wall):
        return Verdict.BLOCKED, None
    if seen is None or seen.version != version or seen.record != record:
        return Verdict.SUSPECT_NOTICED, Sighting(version, record, now_mono)
    if now_mono - seen.since >= our_ttl_s:
        return Verdict.TAKE_OVER_SUSPECT, seen
    return Verdict.SUSPECT_WAITING, seen


# --- the probe -----------------------------------------------------------------------------


def probe_verdict(answer: Version | BaseException, header: str) -> Exclusion:
    """What one probe write (whose precondition is false) says about the service.

    Refused (412, 409, or 404 for ``If-Match``) → :attr:`Exclusion.CONDITIONAL`. The client
    cannot send the header → :attr:`Exclusion.BEST_EFFORT`. Accepted (a :class:`Version`) →
    :class:`~mushroom_backup.errors.PreconditionsIgnored` naming ``header``. Any other failure
    is raised as it is.
    """
    if isinstance(answer, Version):
        raise PreconditionsIgnored(header)
    if isinstance(answer, PreconditionFailed | NotFound):
        return Exclusion.CONDITIONAL
    if isinstance(answer, ConditionalWritesUnsupported):
        return Exclusion.BEST_EFFORT
    raise answer


# --- the holder's write fence --------------------------------------------------------------


def write_deadline(
    *,
    confirmed_mono: float,
    confirmed_wall: datetime,
    ttl_s: float,
    now_mono: float,
    now_wall: datetime,
    lost: bool,
) -> float | None:
    """The monotonic moment after which the holder must not start a write, or None when that
    moment has passed (on either clock) or the lease is lost.

    The fence is 2/3 of ``ttl_s`` after the moment the last confirmed renewal was *sent*
    (``confirmed_*``). On the wall clock it is counted from ``confirmed_wall``; a wall clock
    that stepped back past ``confirmed_wall`` leaves the monotonic clock to decide. The answer
    is the earlier of the two deadlines, expressed on the monotonic clock.
    """
    if lost:
        return None
    fence = ttl_s * 2 / 3
    deadline = confirmed_mono + fence
    wall_elapsed = (now_wall - confirmed_wall).total_seconds()
    if wall_elapsed >= 0:
        deadline = min(deadline, now_mono + (fence - wall_elapsed))
    return deadline if now_mono < deadline else None


# --- describing a lease for people ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The ``LEASE`` object as read: the record when it parses, else why not."""

    record: LeaseRecord | None
    #: Why the object is not a lease record (None when it is one).
    error: str | None
    version: Version
    size: int


class LeaseCondition(enum.Enum):
    """How a reader sees a lease at a given moment."""

    FRESH = "fresh"
    STALE = "stale"
    SUSPECT = "suspect"
    UNPARSEABLE = "unparseable"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What :func:`describe` says about a lease (for ``lease status``)."""

    condition: LeaseCondition
    holder: str | None
    ttl_s: int | None
    #: ``now - renewed_at`` in seconds (negative when stamped in the future).
    age_s: float | None
    #: ``ttl_s - age_s``: seconds until the lease may be taken over (negative: since when).
    expires_in_s: float | None
    #: One line for people.
    detail: str


def describe(view: LeaseView, now: datetime) -> LeaseState:
    """Classify a lease read at ``now`` (the reader's wall clock)."""
    record = view.record
    if record is None:
        return LeaseState(
            LeaseCondition.UNPARSEABLE,
            None,
            None,
            None,
            None,
            f"not a lease record: {view.error}; the next acquire takes it over",
        )
    renewed = _renewed(record)
    if renewed is None:
        return LeaseState(
            LeaseCondition.UNPARSEABLE,
            record.instance_id,
            record.ttl_s,
            None,
            None,
            f"renewed_at {record.renewed_at!r} is not an RFC 3339 time; "
            "the next acquire takes it over",
        )
    age = (now - renewed).total_seconds()
    expires_in = float(record.ttl_s) - age
    if not is_fresh(record, now):
        condition, detail = (
            LeaseCondition.STALE,
            f"expired {0.0 - expires_in:.1f} s ago; the next acquire takes it over",
        )
    elif is_suspect(record, now):
        why = (
            f"ttl_s={record.ttl_s} is over {MAX_SANE_TTL_S}"
            if record.ttl_s > MAX_SANE_TTL_S
            else f"stamped {-age:.1f} s in the future"
        )
        condition, detail = (
            LeaseCondition.SUSPECT,
            f"suspect: {why}; taken over once it has sat unchanged for a TTL",
        )
    else:
        condition, detail = LeaseCondition.FRESH, f"held, expires in {expires_in:.1f} s"
    return LeaseState(condition, record.instance_id, record.ttl_s, age, expires_in, detail)
