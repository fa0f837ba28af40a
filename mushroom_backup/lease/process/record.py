"""Process-lease records, fence certificates, their one byte encoding, key names and bounds.

This is the pure half of the process lease (the seed's ``mod.rs``, which was not given: the
names, encodings and bounds below are ours, with the reasons written next to them).

Records
-------
A :class:`ProcessLease` is one create-only object per sequence number of one stable node id::

    {"node":7,"owner":"1b4e28ba-2fa1-11d2-883f-0016d3cca427","term":2,"seq":41,"expires_at_ms":1796...}

* exactly these five fields, in this order, compact (no spaces), ASCII, no trailing newline:
  the bytes :meth:`ProcessLease.encode` produces are the only accepted body
  (:meth:`ProcessLease.decode` re-encodes what it parsed and compares bytes);
* ``node``, ``term``, ``seq``: integers in ``1..2**64-1`` (the seed's ``u64``; 20 digits, so the
  zero-padded key fits); ``term <= seq`` (a history starts at term 1, seq 1, and every takeover
  adds one to both, every renewal one to ``seq``);
* ``owner``: the holder's boot incarnation, a non-nil UUID as a canonical lowercase hyphenated
  string;
* ``expires_at_ms``: the writer's wall clock at the write plus its TTL, in ``1..2**63-1``
  milliseconds. Informational only: nobody decides anything from another host's wall clock.

A :class:`ProcessLeaseFence` is a certificate that ``successor`` took the node over from
``predecessor``: same node, ``term+1``, ``seq+1``, different owners. It is canonical *by
construction* (the constructor raises :class:`~mushroom_backup.errors.ProcessLeaseInvalid`),
so every fence object in memory is one that could be sealed. Encoding:
``{"predecessor":<record>,"successor":<record>}``.

Anything else -- a noncanonical body, one too large, another node's record, a sequence that does
not match its key -- is :class:`~mushroom_backup.errors.ProcessLeaseInvalid`: rejected, never
repaired.

Keys (relative to the cluster root store; numbers zero-padded to 20 digits, so byte order of
keys is numeric order)::

    process-lease/{node:020d}/lease/{seq:020d}
    process-lease/{node:020d}/fence/by-predecessor/{owner}
    process-lease/{node:020d}/fence/by-successor/{owner}/{term:020d}

Bounds: :class:`ProcessLeaseBounds` (defaults and reasons in its docstring).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from ...errors import ProcessLeaseInvalid

MAX_U64 = 2**64 - 1
MAX_I64 = 2**63 - 1

#: The longest canonical record is 167 bytes (20-digit node, term and seq, a 19-digit expiry,
#: a 36-char UUID); anything longer than 256 cannot be canonical and is refused before it is
#: parsed.
MAX_RECORD_BYTES = 256
#: The longest canonical fence is 363 bytes (two maximal records and 29 bytes of frame).
MAX_FENCE_BYTES = 512
#: The longest TTL accepted: the same one hour the bucket lease treats as the most a sane
#: holder asks for. Fencing waits one TTL, so a longer one would leave a dead node unfenceable
#: for hours; the seed only refuses overflow, we refuse the absurd too.
MAX_TTL = timedelta(hours=1)

ROOT = "process-lease"
_SEQ_DIGITS = 20
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RECORD_FIELDS = ("node", "owner", "term", "seq", "expires_at_ms")
_FENCE_FIELDS = ("predecessor", "successor")
_DIGITS = re.compile(r"[0-9]{20}")


@dataclass(frozen=True, slots=True)
class ProcessLeaseBounds:
    """Every bound of the process-lease store, in one place (defaults are the production ones;
    tests pass small ones to reach the edges quickly).

    ``history_to_retain = 64``
        Records kept after a prune. At least 2 are needed (a won takeover is rebuilt from the
        head and its predecessor); 64 is ~21 TTLs of renewals (every TTL/3), about ten minutes at
        the default 30 s TTL, shown by ``node status`` for forensics. The history fallback of
        ``find_takeover_from`` reads all of it, so it must stay small: at most
        ``retain + writes_per_prune`` = 96 GETs, 12 rounds at 8 in flight, well under a second
        on S3, inside the default 10 s fencing I/O budget.
    ``writes_per_prune = 32``
        A prune (one LIST and a window of GETs) every 32 writes, about every 11 TTLs: cheap
        amortised, and the history stays below 96 records between prunes.
    ``max_list_records = 1000``
        The most keys a history scan accepts before failing closed ("invalid inventory", which
        triggers a repair prune). 1000 is one S3 ListObjectsV2 page, and ten times the healthy
        maximum, so a store whose prunes keep failing has hours of slack before it stops.
    ``prune_batch_records = 32``
        Records deleted per batch. A batch reads 33 records (the batch and the first retained
        one, so the transition at the boundary is sealed too), seals each transition
        (2 x PUT + GET) and deletes 32: about 9 request rounds at 8 in flight.
    ``max_prune_batches = 32``
        Batches per prune run: 32 x 32 = 1024 >= 1000 - 64, so one run brings a history at the
        list bound back to retention. A larger backlog takes several runs, each bounded.
    ``prune_io_timeout_s = 10.0``
        The I/O timeout of one batch (on the injected clock). ~9 rounds take well under a second
        on a healthy service; ten seconds tolerates a slow one and cuts off a hung connection
        so the prune slot is never held forever.
    ``read_concurrency = 8``
        GETs in flight while reading a window or the history: fast, yet below aiobotocore's
        default pool of 10 connections, leaving room for the holder's renewals.
    ``head_read_attempts = 3``
        How often ``load`` and a history read start over when the head moved (or a concurrent
        pruner deleted a record) between the LIST and the GET, as the bucket lease looks again
        up to 3 times: one renewal and one prune batch may land during a read; more means churn,
        and we fail closed instead of spinning.
    """

    history_to_retain: int = 64
    writes_per_prune: int = 32
    max_list_records: int = 1000
    prune_batch_records: int = 32
    max_prune_batches: int = 32
    prune_io_timeout_s: float = 10.0
    read_concurrency: int = 8
    head_read_attempts: int = 3

    def __post_init__(self) -> None:
        problems = []
        if self.history_to_retain < 2:
            problems.append("history_to_retain must be at least 2 (a takeover is two records)")
        if self.writes_per_prune < 1:
            problems.append("writes_per_prune must be at least 1")
        if self.max_list_records <= self.history_to_retain + self.writes_per_prune:
            problems.append(
                "max_list_records must exceed history_to_retain + writes_per_prune, "
                "or a healthy history would fail its own scan"
            )
        if self.prune_batch_records < 1 or self.max_prune_batches < 1:
            problems.append("prune_batch_records and max_prune_batches must be at least 1")
        if self.prune_batch_records * self.max_prune_batches < (
            self.max_list_records - self.history_to_retain
        ):
            problems.append(
                "one prune run (prune_batch_records x max_prune_batches) must be able to bring "
                "a history at max_list_records back to history_to_retain"
            )
        if not self.prune_io_timeout_s > 0:
            problems.append("prune_io_timeout_s must be positive")
        if self.read_concurrency < 1 or self.head_read_attempts < 1:
            problems.append("read_concurrency and head_read_attempts must be at least 1")
        if problems:
            raise ValueError("invalid process lease bounds: " + "; ".join(problems))


DEFAULT_BOUNDS = ProcessLeaseBounds()


# --- values ----------------------------------------------------------------------------------


def _check_u64(name: str, value: int) -> None:
    if type(value) is not int or not 1 <= value <= MAX_U64:
        raise ProcessLeaseInvalid(f"process lease {name} must be an integer in 1..2**64-1")


def _check_owner(name: str, owner: UUID) -> None:
    if not isinstance(owner, UUID) or owner.int == 0:
        raise ProcessLeaseInvalid(f"process lease {name} must be a non-nil UUID")


def check_node(node: int) -> int:
    """``node`` if it is a valid stable node id (a nonzero integer that fits a key)."""
    _check_u64("node id", node)
    return node


def parse_uuid(text: str) -> UUID:
    """A UUID given as its canonical lowercase hyphenated string (nothing else is accepted, so
    one incarnation has one spelling in keys and records)."""
    try:
        value = UUID(text)
    except (ValueError, TypeError, AttributeError):
        raise ProcessLeaseInvalid(f"{text!r} is not a UUID") from None
    if str(value) != text:
        raise ProcessLeaseInvalid(
            f"{text!r} is not a canonical UUID; write it lowercase with hyphens: {value}"
        )
    return value


@dataclass(frozen=True, slots=True)
class ProcessLease:
    """One durable record of a node's history. Valid by construction (see the module doc);
    :meth:`validate` adds the namespace check."""

    node: int
    owner: UUID
    term: int
    seq: int
    expires_at_ms: int

    def __post_init__(self) -> None:
        _check_u64("node", self.node)
        _check_owner("owner", self.owner)
        _check_u64("term", self.term)
        _check_u64("seq", self.seq)
        if self.term > self.seq:
            raise ProcessLeaseInvalid(
                f"process lease term {self.term} exceeds its sequence {self.seq}; "
                "every term starts with a new sequence number"
            )
        if type(self.expires_at_ms) is not int or not 1 <= self.expires_at_ms <= MAX_I64:
            raise ProcessLeaseInvalid("process lease expires_at_ms must be in 1..2**63-1")

    def validate(self, node: int) -> None:
        """Refuse a record from another node's namespace."""
        if self.node != node:
            raise ProcessLeaseInvalid(
                f"process lease record names node {self.node} but lives under node {node}"
            )

    def as_json(self) -> dict[str, Any]:
        """The record as a JSON object, fields in their fixed order."""
        return {
            "node": self.node,
            "owner": str(self.owner),
            "term": self.term,
            "seq": self.seq,
            "expires_at_ms": self.expires_at_ms,
        }

    def encode(self) -> bytes:
        """The one canonical body of this record."""
        return _dumps(self.as_json())

    @classmethod
    def from_json(cls, value: object) -> ProcessLease:
        """A record from a parsed JSON value; exactly the five fields, with exact types."""
        if not isinstance(value, dict) or tuple(value) != _RECORD_FIELDS:
            raise ProcessLeaseInvalid(
                "process lease record must be an object with exactly the fields "
                + ", ".join(_RECORD_FIELDS)
                + " in that order"
            )
        owner = value["owner"]
        if not isinstance(owner, str):
            raise ProcessLeaseInvalid("process lease owner must be a UUID string")
        return cls(
            node=value["node"],
            owner=parse_uuid(owner),
            term=value["term"],
            seq=value["seq"],
            expires_at_ms=value["expires_at_ms"],
        )

    @classmethod
    def decode(cls, data: bytes, *, node: int, seq: int | None = None) -> ProcessLease:
        """Parse a stored body of node ``node`` (stored at sequence ``seq`` when given) and
        accept it only if it is exactly the canonical encoding."""
        if not 1 <= len(data) <= MAX_RECORD_BYTES:
            raise ProcessLeaseInvalid(
                f"process lease record is {len(data)} bytes; expected 1..={MAX_RECORD_BYTES}"
            )
        lease = cls.from_json(_loads(data, "process lease record"))
        lease.validate(node)
        if seq is not None and lease.seq != seq:
            raise ProcessLeaseInvalid(
                f"process lease record at sequence {seq} says seq {lease.seq}: "
                "record sequence does not match its object name"
            )
        if lease.encode() != data:
            raise ProcessLeaseInvalid(
                f"process lease record {lease.seq} does not use its canonical body"
            )
        return lease


@dataclass(frozen=True, slots=True)
class ProcessLeaseFence:
    """Takeover evidence: ``successor`` superseded ``predecessor``. Canonical by construction:
    same node, ``term+1``, ``seq+1``, different owners."""

    predecessor: ProcessLease
    successor: ProcessLease

    def __post_init__(self) -> None:
        p, s = self.predecessor, self.successor
        if p.node != s.node:
            raise ProcessLeaseInvalid("process lease fence spans two nodes")
        if s.term != p.term + 1 or s.seq != p.seq + 1:
            raise ProcessLeaseInvalid(
                f"process lease fence must advance term and seq by one "
                f"(term {p.term}->{s.term}, seq {p.seq}->{s.seq}): a noncanonical term transition"
            )
        if p.owner == s.owner:
            raise ProcessLeaseInvalid("process lease fence predecessor and successor are one owner")

    @property
    def node(self) -> int:
        return self.predecessor.node

    def as_json(self) -> dict[str, Any]:
        return {"predecessor": self.predecessor.as_json(), "successor": self.successor.as_json()}

    def encode(self) -> bytes:
        """The one canonical body of this certificate."""
        return _dumps(self.as_json())

    @classmethod
    def decode(cls, data: bytes) -> ProcessLeaseFence:
        """Parse a stored certificate; only its canonical encoding is accepted."""
        if not 1 <= len(data) <= MAX_FENCE_BYTES:
            raise ProcessLeaseInvalid(
                f"process lease fence is {len(data)} bytes; expected 1..={MAX_FENCE_BYTES}"
            )
        value = _loads(data, "process lease fence")
        if not isinstance(value, dict) or tuple(value) != _FENCE_FIELDS:
            raise ProcessLeaseInvalid(
                "process lease fence must be an object with exactly predecessor, successor"
            )
        fence = cls(
            ProcessLease.from_json(value["predecessor"]),
            ProcessLease.from_json(value["successor"]),
        )
        if fence.encode() != data:
            raise ProcessLeaseInvalid("indexed process lease fence does not use its canonical body")
        return fence


@dataclass(frozen=True, slots=True)
class Participant:
    """An exact process incarnation of a stable node: ``(node_id, boot_incarnation)``."""

    node_id: int
    boot_incarnation: UUID

    def __post_init__(self) -> None:
        if (
            type(self.node_id) is not int
            or not 1 <= self.node_id <= MAX_U64
            or not isinstance(self.boot_incarnation, UUID)
            or self.boot_incarnation.int == 0
        ):
            raise ProcessLeaseInvalid(
                "process lease participant is not canonical: "
                "it needs a nonzero node id and a non-nil boot incarnation"
            )


# --- outcomes and observations -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acquired:
    """The caller's record is the durable head."""

    lease: ProcessLease


@dataclass(frozen=True, slots=True)
class Held:
    """Another record is the head (or the observation was too short): nothing was written."""

    lease: ProcessLease


Outcome = Acquired | Held


@dataclass(frozen=True, slots=True)
class ProcessLeaseObservation:
    """A rival head as first seen, and when (the candidate's own monotonic clock, seconds)."""

    lease: ProcessLease
    started: float


# --- keys ------------------------------------------------------------------------------------


def _pad(number: int) -> str:
    return f"{number:0{_SEQ_DIGITS}d}"


def node_prefix(node: int) -> str:
    return f"{ROOT}/{_pad(node)}/"


def lease_prefix(node: int) -> str:
    return f"{node_prefix(node)}lease/"


def lease_key(node: int, seq: int) -> str:
    return f"{lease_prefix(node)}{_pad(seq)}"


def fence_prefix(node: int) -> str:
    """Where the predecessor-indexed certificates of a node live."""
    return f"{node_prefix(node)}fence/by-predecessor/"


def fence_key(node: int, predecessor: UUID) -> str:
    return f"{fence_prefix(node)}{predecessor}"


def successor_fence_key(node: int, successor: UUID, term: int) -> str:
    return f"{node_prefix(node)}fence/by-successor/{successor}/{_pad(term)}"


def sequence_from_key(node: int, key: str) -> int:
    """The sequence number a record key of ``node`` names; anything else is invalid."""
    prefix = lease_prefix(node)
    if not key.startswith(prefix):
        raise ProcessLeaseInvalid(
            f"object {key!r} is not in the process lease namespace of node {node}"
        )
    tail = key[len(prefix) :]
    if not _DIGITS.fullmatch(tail) or int(tail) == 0:
        raise ProcessLeaseInvalid(
            f"object {key!r} in the process lease history of node {node} is not named by a "
            f"{_SEQ_DIGITS}-digit nonzero sequence; remove it"
        )
    seq = int(tail)
    if seq > MAX_U64:
        raise ProcessLeaseInvalid(f"object {key!r} names a sequence beyond 2**64-1")
    return seq


# --- time and JSON -----------------------------------------------------------------------------


def wall_ms(wall: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware wall-clock reading (exact integer)."""
    return (wall - _EPOCH) // timedelta(milliseconds=1)


def expiry_ms(now_ms: int, ttl_ms: int) -> int:
    """``now_ms + ttl_ms``, saturating at the top of the record's range (as the seed does)."""
    return max(1, min(MAX_I64, now_ms + ttl_ms))


def ttl_to_ms(ttl: timedelta) -> int:
    """A TTL in whole milliseconds: positive, whole milliseconds, at most :data:`MAX_TTL`."""
    if ttl <= timedelta(0):
        raise ProcessLeaseInvalid("process lease TTL must be positive")
    if ttl % timedelta(milliseconds=1):
        raise ProcessLeaseInvalid("process lease TTL must use whole milliseconds")
    if ttl > MAX_TTL:
        raise ProcessLeaseInvalid(
            f"process lease TTL {ttl.total_seconds():g} s is over the {MAX_TTL.total_seconds():g}"
            " s limit"
        )
    return ttl // timedelta(milliseconds=1)


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed")


def _loads(data: bytes, what: str) -> object:
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ProcessLeaseInvalid(f"{what} is not valid JSON ({error})") from None
