"""Process-lease records and fences: the one canonical encoding, the rules a record and a
certificate keep, key names, TTLs and bounds (pure functions, tables)."""

from __future__ import annotations

import random
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from mushroom_backup.errors import ProcessLeaseInvalid
from mushroom_backup.lease.process.record import (
    DEFAULT_BOUNDS,
    MAX_FENCE_BYTES,
    MAX_I64,
    MAX_RECORD_BYTES,
    MAX_U64,
    Participant,
    ProcessLease,
    ProcessLeaseBounds,
    ProcessLeaseFence,
    expiry_ms,
    fence_key,
    lease_key,
    parse_uuid,
    sequence_from_key,
    successor_fence_key,
    ttl_to_ms,
    wall_ms,
)

A = UUID("1b4e28ba-2fa1-41d2-883f-0016d3cca427")
B = UUID("9f0c1d2e-3a4b-4c5d-8e6f-708192a3b4c5")
A_TEXT = str(A)
CANONICAL = (
    b'{"node":7,"owner":"1b4e28ba-2fa1-41d2-883f-0016d3cca427","term":2,"seq":41,'
    b'"expires_at_ms":1796000000000}'
)
RECORD = ProcessLease(7, A, 2, 41, 1_796_000_000_000)


def test_encoding_is_compact_json_with_the_fixed_field_order() -> None:
    assert RECORD.encode() == CANONICAL


def test_canonical_body_decodes_to_the_record() -> None:
    assert ProcessLease.decode(CANONICAL, node=7, seq=41) == RECORD


def test_longest_possible_records_fit_their_bounds() -> None:
    longest = ProcessLease(MAX_U64, A, MAX_U64, MAX_U64, MAX_I64)
    assert len(longest.encode()) == 167 <= MAX_RECORD_BYTES
    fence = ProcessLeaseFence(
        ProcessLease(MAX_U64, A, MAX_U64 - 1, MAX_U64 - 1, MAX_I64),
        ProcessLease(MAX_U64, B, MAX_U64, MAX_U64, MAX_I64),
    )
    assert len(fence.encode()) == 363 <= MAX_FENCE_BYTES


def _body(text: str) -> bytes:
    return text.replace("OWNER", A_TEXT).encode()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (
            _body('{"node": 7,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":1796000000000}'),
            "canonical",
        ),
        (CANONICAL + b"\n", "canonical"),
        (
            _body('{"owner":"OWNER","node":7,"term":2,"seq":41,"expires_at_ms":1796000000000}'),
            "exactly the fields",
        ),
        (_body('{"node":7,"owner":"OWNER","term":2,"seq":41}'), "exactly the fields"),
        (
            _body(
                '{"node":7,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":1796000000000,"x":1}'
            ),
            "exactly the fields",
        ),
        (
            _body(
                '{"node":7,"node":7,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":1796000000000}'
            ),
            "canonical",
        ),
        (
            _body('{"node":7.0,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":1796000000000}'),
            "node",
        ),
        (
            _body('{"node":true,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":1796000000000}'),
            "node",
        ),
        (
            _body('{"node":7,"owner":"OWNER","term":"2","seq":41,"expires_at_ms":1796000000000}'),
            "term",
        ),
        (
            _body('{"node":7,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":NaN}'),
            "not valid JSON",
        ),
        (
            CANONICAL.replace(A_TEXT.encode(), A_TEXT.upper().encode()),
            "canonical UUID",
        ),
        (
            CANONICAL.replace(A_TEXT.encode(), A.hex.encode()),
            "canonical UUID",
        ),
        (
            CANONICAL.replace(A_TEXT.encode(), b"00000000-0000-0000-0000-000000000000"),
            "non-nil",
        ),
        (
            _body('{"node":7,"owner":"OWNER","term":0,"seq":41,"expires_at_ms":1796000000000}'),
            "term",
        ),
        (
            _body('{"node":7,"owner":"OWNER","term":42,"seq":41,"expires_at_ms":1796000000000}'),
            "exceeds its sequence",
        ),
        (
            _body('{"node":7,"owner":"OWNER","term":2,"seq":41,"expires_at_ms":0}'),
            "expires_at_ms",
        ),
        (b'["node",7]', "exactly the fields"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"{", "not valid JSON"),
    ],
)
def test_noncanonical_or_malformed_bodies_are_rejected(body: bytes, why: str) -> None:
    with pytest.raises(ProcessLeaseInvalid, match=why):
        ProcessLease.decode(body, node=7, seq=41)


@pytest.mark.parametrize("size", [0, MAX_RECORD_BYTES + 1, 10_000])
def test_empty_and_oversized_records_are_rejected_before_parsing(size: int) -> None:
    body = (CANONICAL + b" " * size)[:size] if size <= len(CANONICAL) else CANONICAL.ljust(size)
    with pytest.raises(ProcessLeaseInvalid, match=f"is {size} bytes"):
        ProcessLease.decode(body, node=7, seq=41)


def test_record_of_another_node_is_rejected() -> None:
    with pytest.raises(ProcessLeaseInvalid, match="names node 7 but lives under node 8"):
        ProcessLease.decode(CANONICAL, node=8, seq=41)


def test_record_whose_sequence_does_not_match_its_key_is_rejected() -> None:
    with pytest.raises(ProcessLeaseInvalid, match="does not match its object name"):
        ProcessLease.decode(CANONICAL, node=7, seq=40)


@pytest.mark.parametrize(
    ("node", "owner", "term", "seq", "expires", "why"),
    [
        (0, A, 1, 1, 1, "node"),
        (MAX_U64 + 1, A, 1, 1, 1, "node"),
        (True, A, 1, 1, 1, "node"),
        (7, UUID(int=0), 1, 1, 1, "owner"),
        (7, A, 0, 1, 1, "term"),
        (7, A, 1, 0, 1, "seq"),
        (7, A, 2, 1, 1, "exceeds its sequence"),
        (7, A, 1, 1, 0, "expires_at_ms"),
        (7, A, 1, 1, MAX_I64 + 1, "expires_at_ms"),
    ],
)
def test_records_keep_their_rules_by_construction(
    node: int, owner: UUID, term: int, seq: int, expires: int, why: str
) -> None:
    with pytest.raises(ProcessLeaseInvalid, match=why):
        ProcessLease(node, owner, term, seq, expires)


# --- fences ------------------------------------------------------------------------------------

P = ProcessLease(7, A, 1, 5, 1000)


@pytest.mark.parametrize(
    ("successor", "why"),
    [
        (ProcessLease(8, B, 2, 6, 1000), "two nodes"),
        (ProcessLease(7, B, 3, 6, 1000), "noncanonical term transition"),
        (ProcessLease(7, B, 1, 6, 1000), "noncanonical term transition"),
        (ProcessLease(7, B, 2, 7, 1000), "noncanonical term transition"),
        (ProcessLease(7, A, 2, 6, 1000), "one owner"),
    ],
)
def test_fence_certificates_are_canonical_by_construction(
    successor: ProcessLease, why: str
) -> None:
    with pytest.raises(ProcessLeaseInvalid, match=why):
        ProcessLeaseFence(P, successor)


def test_fence_encoding_round_trips_and_only_canonical_bytes_decode() -> None:
    fence = ProcessLeaseFence(P, ProcessLease(7, B, 2, 6, 2000))
    body = fence.encode()
    assert body.startswith(b'{"predecessor":{"node":7,')
    assert b',"successor":{"node":7,' in body
    assert ProcessLeaseFence.decode(body) == fence
    with pytest.raises(ProcessLeaseInvalid, match="canonical body"):
        ProcessLeaseFence.decode(body.replace(b'"successor":', b'"successor": '))
    with pytest.raises(ProcessLeaseInvalid, match="exactly predecessor, successor"):
        ProcessLeaseFence.decode(b'{"successor":{},"predecessor":{}}')
    with pytest.raises(ProcessLeaseInvalid, match="bytes"):
        ProcessLeaseFence.decode(body.ljust(MAX_FENCE_BYTES + 1))
    forged = body.replace(b'"term":2', b'"term":3')
    with pytest.raises(ProcessLeaseInvalid, match="noncanonical term transition"):
        ProcessLeaseFence.decode(forged)


def test_participants_need_a_node_and_a_non_nil_incarnation() -> None:
    assert Participant(7, A).node_id == 7
    for node, incarnation in [(0, A), (7, UUID(int=0)), (-1, A)]:
        with pytest.raises(ProcessLeaseInvalid, match="participant is not canonical"):
            Participant(node, incarnation)


# --- keys --------------------------------------------------------------------------------------


def test_keys_are_zero_padded_under_the_node() -> None:
    assert lease_key(7, 41) == "process-lease/00000000000000000007/lease/00000000000000000041"
    assert fence_key(7, A) == f"process-lease/00000000000000000007/fence/by-predecessor/{A}"
    assert (
        successor_fence_key(7, B, 2)
        == f"process-lease/00000000000000000007/fence/by-successor/{B}/00000000000000000002"
    )


def test_listing_order_of_keys_is_numeric_order() -> None:
    seqs = [1, 9, 10, 99, 100, 12345, MAX_U64, 2**40, *random.Random(5).sample(range(10**9), 50)]
    keys = [lease_key(3, seq) for seq in seqs]
    assert [sequence_from_key(3, key) for key in sorted(keys)] == sorted(seqs)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (lease_key(8, 1), "not in the process lease namespace of node 7"),
        ("process-lease/00000000000000000007/lease/1", "20-digit"),
        ("process-lease/00000000000000000007/lease/00000000000000000000", "nonzero"),
        ("process-lease/00000000000000000007/lease/0000000000000000001x", "20-digit"),
        ("process-lease/00000000000000000007/lease/00000000000000000001.tmp", "20-digit"),
        ("process-lease/00000000000000000007/lease/99999999999999999999", "beyond"),
    ],
)
def test_keys_that_name_no_sequence_of_the_node_are_invalid(key: str, why: str) -> None:
    with pytest.raises(ProcessLeaseInvalid, match=why):
        sequence_from_key(7, key)


def test_only_canonical_uuid_spellings_are_accepted() -> None:
    assert parse_uuid(A_TEXT) == A
    for text in [A_TEXT.upper(), A.hex, "{" + A_TEXT + "}", "urn:uuid:" + A_TEXT, "nope"]:
        with pytest.raises(ProcessLeaseInvalid):
            parse_uuid(text)


# --- time, TTL, bounds -------------------------------------------------------------------------


def test_wall_ms_is_exact_and_expiry_saturates() -> None:
    assert wall_ms(datetime(1970, 1, 1, 0, 0, 1, 999_999, tzinfo=UTC)) == 1999
    stamp = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert wall_ms(stamp) == int(stamp.timestamp()) * 1000
    assert expiry_ms(1000, 30_000) == 31_000
    assert expiry_ms(MAX_I64 - 5, 30_000) == MAX_I64


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        (timedelta(seconds=30), 30_000),
        (timedelta(milliseconds=1), 1),
        (timedelta(seconds=0.25), 250),
        (timedelta(hours=1), 3_600_000),
    ],
)
def test_ttls_in_whole_milliseconds_are_accepted(ttl: timedelta, expected: int) -> None:
    assert ttl_to_ms(ttl) == expected


@pytest.mark.parametrize(
    ("ttl", "why"),
    [
        (timedelta(0), "positive"),
        (timedelta(seconds=-1), "positive"),
        (timedelta(microseconds=1500), "whole milliseconds"),
        (timedelta(microseconds=1), "whole milliseconds"),
        (timedelta(hours=1, milliseconds=1), "limit"),
    ],
)
def test_zero_fractional_and_oversized_ttls_are_rejected(ttl: timedelta, why: str) -> None:
    with pytest.raises(ProcessLeaseInvalid, match=why):
        ttl_to_ms(ttl)


def test_default_bounds_are_the_documented_ones() -> None:
    assert asdict(DEFAULT_BOUNDS) == dict(
        history_to_retain=64,
        writes_per_prune=32,
        max_list_records=1000,
        prune_batch_records=32,
        max_prune_batches=32,
        prune_io_timeout_s=10.0,
        read_concurrency=8,
        head_read_attempts=3,
    )


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"history_to_retain": 1}, "at least 2"),
        ({"max_list_records": 96}, "must exceed"),
        ({"max_prune_batches": 2}, "one prune run"),
        ({"prune_io_timeout_s": 0.0}, "positive"),
        ({"read_concurrency": 0}, "at least 1"),
        ({"head_read_attempts": 0}, "at least 1"),
        ({"writes_per_prune": 0}, "at least 1"),
    ],
)
def test_inconsistent_bounds_are_refused(changes: dict[str, int | float], why: str) -> None:
    values: dict[str, int | float] = {
        "history_to_retain": 64,
        "writes_per_prune": 32,
        "max_list_records": 1000,
        "prune_batch_records": 32,
        "max_prune_batches": 32,
        "prune_io_timeout_s": 10.0,
        "read_concurrency": 8,
        "head_read_attempts": 3,
    } | changes
    with pytest.raises(ValueError, match=why):
        ProcessLeaseBounds(**values)  # type: ignore[arg-type]
