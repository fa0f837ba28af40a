"""The bucket lease's pure rules, as tables with an explicit ``now``: the record format (byte
compatible with the Rust agent), freshness, suspicion, the suspect watch, the probe verdict,
the write fence, the best-effort switch and the status description."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from mushroom_backup.config import load_settings
from mushroom_backup.errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    PreconditionsIgnored,
    StoreError,
    UsageError,
)
from mushroom_backup.lease.record import (
    MAX_SANE_TTL_S,
    Exclusion,
    LeaseCondition,
    LeaseRecord,
    LeaseView,
    Sighting,
    Verdict,
    decode_record,
    describe,
    format_rfc3339,
    is_fresh,
    is_suspect,
    judge_foreign,
    new_instance_id,
    parse_rfc3339,
    probe_verdict,
    write_deadline,
)
from mushroom_backup.store.base import Version

NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def record(renewed: datetime | str, ttl_s: int = 30, instance_id: str = "x") -> LeaseRecord:
    stamp = renewed if isinstance(renewed, str) else format_rfc3339(renewed)
    return LeaseRecord(instance_id, stamp, stamp, ttl_s)


# --- stamps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (NOW, "2026-11-29T10:00:00Z"),
        (NOW + timedelta(microseconds=500_000), "2026-11-29T10:00:00.5Z"),
        (NOW + timedelta(microseconds=123_456), "2026-11-29T10:00:00.123456Z"),
        (NOW + timedelta(microseconds=120), "2026-11-29T10:00:00.00012Z"),
        (NOW + timedelta(microseconds=1), "2026-11-29T10:00:00.000001Z"),
        # Another offset is written in UTC, as the Rust agent (OffsetDateTime from SystemTime).
        (datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone(timedelta(hours=2))), NOW),
    ],
)
def test_stamps_are_written_like_the_rust_time_crate(
    moment: datetime, text: str | datetime
) -> None:
    expected = text if isinstance(text, str) else "2026-11-29T10:00:00Z"
    assert format_rfc3339(moment) == expected
    assert parse_rfc3339(expected) == moment


def test_a_naive_time_is_not_stamped() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        format_rfc3339(datetime(2026, 11, 29, 10, 0, 0))


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-11-29T10:00:00Z", NOW),
        ("2026-11-29t10:00:00z", NOW),
        ("2026-11-29T11:30:00+01:30", NOW),
        ("2026-11-29T09:00:00-01:00", NOW),
        # Rust writes nanoseconds; we keep microseconds (truncated).
        ("2026-11-29T10:00:00.123456789Z", NOW + timedelta(microseconds=123_456)),
        ("2026-11-29T10:00:00.5Z", NOW + timedelta(microseconds=500_000)),
        ("2026-12-31T23:59:60Z", datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)),
    ],
)
def test_any_rfc3339_stamp_is_read(text: str, moment: datetime) -> None:
    assert parse_rfc3339(text) == moment


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "",
        "2026-11-29 10:00:00Z",  # a space is not RFC 3339
        "2026-11-29T10:00:00",  # no offset
        "2026-11-29T10:00Z",
        "2026-02-30T10:00:00Z",
        "2026-11-29T25:00:00Z",
        "2026-11-29T10:00:00+24:00",
        "2026-11-29T10:00:00.Z",
        "0000-01-01T00:00:00Z",
        "２０２６-11-29T10:00:00Z",  # non-ASCII digits
        " 2026-11-29T10:00:00Z",
    ],
)
def test_garbage_stamps_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_rfc3339(text)


# --- the record format ---------------------------------------------------------------------

RUST_BYTES = (
    b'{"instance_id":"abc","acquired_at":"2026-11-29T10:00:00Z",'
    b'"renewed_at":"2026-11-29T10:00:00.5Z","ttl_s":30}'
)
RUST_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d*[1-9])?Z")


def strict_rust_reader(data: bytes) -> dict[str, object]:
    """What the Rust agent's serde reader needs: UTF-8 JSON whose first four fields are exactly
    the struct's, in order and of the right types (anything after them is ignored)."""
    fields = json.loads(data.decode("utf-8"))
    assert list(fields)[:4] == ["instance_id", "acquired_at", "renewed_at", "ttl_s"]
    assert set(fields) - {"instance_id", "acquired_at", "renewed_at", "ttl_s"} <= {"host", "pid"}
    assert all(isinstance(fields[k], str) for k in ("instance_id", "acquired_at", "renewed_at"))
    assert type(fields["ttl_s"]) is int
    assert 0 <= fields["ttl_s"] < 2**64
    assert RUST_STAMP.fullmatch(fields["acquired_at"])
    assert RUST_STAMP.fullmatch(fields["renewed_at"])
    return dict(fields)


def test_a_rust_written_record_is_read() -> None:
    assert decode_record(RUST_BYTES) == LeaseRecord(
        "abc", "2026-11-29T10:00:00Z", "2026-11-29T10:00:00.5Z", 30
    )


def test_our_record_is_compact_json_in_the_rust_field_order() -> None:
    ours = LeaseRecord(
        "0123456789abcdef0123456789abcdef",
        "2026-11-29T10:00:00Z",
        "2026-11-29T10:00:10.25Z",
        30,
        host="db1",
        pid=4242,
    )
    data = ours.encode()
    assert data == (
        b'{"instance_id":"0123456789abcdef0123456789abcdef","acquired_at":"2026-11-29T10:00:00Z",'
        b'"renewed_at":"2026-11-29T10:00:10.25Z","ttl_s":30,"host":"db1","pid":4242}'
    )
    assert strict_rust_reader(data)["ttl_s"] == 30
    assert decode_record(data) == ours


def test_without_host_and_pid_the_record_is_exactly_the_rust_one() -> None:
    assert decode_record(RUST_BYTES).encode() == RUST_BYTES


def test_unknown_fields_are_ignored_like_serde() -> None:
    data = RUST_BYTES[:-1] + b',"future":{"x":[1,2]},"host":7,"pid":"nine"}'
    parsed = decode_record(data)
    assert (parsed.instance_id, parsed.ttl_s, parsed.host, parsed.pid) == ("abc", 30, None, None)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not JSON"),
        (b"not json", "not JSON"),
        (b'{"instance_id":"a"', "not JSON"),
        (RUST_BYTES + b"x", "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[]", "not a JSON object"),
        (b'"LEASE"', "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"instance_id":"a"}', "lacks acquired_at, renewed_at, ttl_s"),
        (RUST_BYTES.replace(b'"abc"', b"17"), "instance_id is not a string"),
        (RUST_BYTES.replace(b'"2026-11-29T10:00:00.5Z"', b"null"), "renewed_at is not a string"),
        (RUST_BYTES.replace(b":30", b':"30"'), "ttl_s '30' is not a whole number"),
        (RUST_BYTES.replace(b":30", b":30.0"), "ttl_s 30.0 is not a whole number"),
        (RUST_BYTES.replace(b":30", b":-1"), "ttl_s -1 is not a whole number"),
        (RUST_BYTES.replace(b":30", b":true"), "ttl_s True is not a whole number"),
        (RUST_BYTES.replace(b":30", b":18446744073709551616"), "is not a whole number"),
        (RUST_BYTES.replace(b":30", b":NaN"), "NaN is not JSON"),
        (RUST_BYTES.replace(b":30", b":" + b"9" * 5000), "not a lease record"),
        (RUST_BYTES[:-1] + b',"ttl_s":31}', "'ttl_s' appears twice"),
        (b"[" * 100_000 + b"]" * 100_000, "not a lease record"),
        (b" " * (64 * 1024 + 1), "bytes, not a lease record"),
    ],
)
def test_anything_else_is_unparseable_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        decode_record(data)


def test_the_largest_u64_ttl_is_a_record() -> None:
    assert decode_record(RUST_BYTES.replace(b":30", b":18446744073709551615")).ttl_s == 2**64 - 1


def test_instance_ids_are_32_random_hex_digits() -> None:
    ids = {new_instance_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


# --- freshness and suspicion ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease", "fresh"),
    [
        (record(NOW - 29 * S), True),
        (record(NOW - 29.999999 * S), True),
        (record(NOW - 30 * S), False),
        (record(NOW - 31 * S), False),
        (record(NOW), True),
        (record(NOW + 5 * S), True),  # the holder's clock runs ahead: still fresh
        (record(NOW + 1 * timedelta(days=1)), True),
        (record("yesterday"), False),
        (record("2026-11-29T10:00:00"), False),
        (record(NOW, ttl_s=0), False),
        (record(NOW + S, ttl_s=0), True),
        (record(NOW - timedelta(days=3650), ttl_s=2**64 - 1), True),
        (record(NOW, ttl_s=2**64 - 1), True),
        # The holder's TTL governs, not ours.
        (record(NOW - 100 * S, ttl_s=120), True),
        # Another offset is the same instant.
        (record("2026-11-29T11:59:31+02:00"), True),
        (record("2026-11-29T11:59:30+02:00"), False),
    ],
)
def test_freshness_is_strictly_less_than_the_holders_ttl(lease: LeaseRecord, fresh: bool) -> None:
    assert is_fresh(lease, NOW) is fresh


@pytest.mark.parametrize(
    ("lease", "suspect"),
    [
        (record(NOW), False),
        (record(NOW + 20 * S), False),
        (record(NOW + 30 * S), False),
        (record(NOW + 31 * S), True),
        (record(NOW + timedelta(days=1)), True),  # a holder whose clock is a day ahead
        (record(NOW - timedelta(days=1)), False),
        (record(NOW, ttl_s=MAX_SANE_TTL_S), False),
        (record(NOW, ttl_s=MAX_SANE_TTL_S + 1), True),
        (record(NOW, ttl_s=2**64 - 1), True),
        (record("yesterday"), False),
        (record("yesterday", ttl_s=MAX_SANE_TTL_S + 1), True),
    ],
)
def test_far_future_stamps_and_absurd_ttls_are_suspect(lease: LeaseRecord, suspect: bool) -> None:
    assert is_suspect(lease, NOW) is suspect


# --- the suspect watch ---------------------------------------------------------------------

V1, V2 = Version('"v1"'), Version('"v2"')
AHEAD = record(NOW + timedelta(days=1), instance_id="clock-a-day-ahead")


def judge(
    lease: LeaseRecord, version: Version, seen: Sighting | None, mono: float
) -> tuple[Verdict, Sighting | None]:
    return judge_foreign(lease, version, our_ttl_s=30, seen=seen, now_wall=NOW, now_mono=mono)


def test_a_stale_record_is_taken_over_and_leaves_the_watch_alone() -> None:
    seen = Sighting(V1, AHEAD, 5.0)
    assert judge(record(NOW - 30 * S), V2, seen, 100.0) == (Verdict.TAKE_OVER_STALE, seen)
    assert judge(record("garbage"), V2, None, 100.0) == (Verdict.TAKE_OVER_STALE, None)


def test_a_fresh_record_blocks_and_clears_the_watch() -> None:
    seen = Sighting(V1, AHEAD, 5.0)
    assert judge(record(NOW - 29 * S), V2, seen, 100.0) == (Verdict.BLOCKED, None)


def test_a_suspect_record_is_taken_over_after_sitting_unchanged_for_our_ttl() -> None:
    verdict, seen = judge(AHEAD, V1, None, 100.0)
    assert verdict is Verdict.SUSPECT_NOTICED
    assert seen == Sighting(V1, AHEAD, 100.0)
    for mono in (100.0, 110.0, 129.999):
        assert judge(AHEAD, V1, seen, mono) == (Verdict.SUSPECT_WAITING, seen)
    assert judge(AHEAD, V1, seen, 130.0) == (Verdict.TAKE_OVER_SUSPECT, seen)


@pytest.mark.parametrize(
    ("version", "lease"),
    [
        (V2, AHEAD),  # rewritten (a new ETag)
        (V1, record(NOW + timedelta(days=1, seconds=10), instance_id="clock-a-day-ahead")),
        (V1, record(NOW + timedelta(days=1), instance_id="someone-else")),
    ],
)
def test_a_changed_suspect_record_restarts_the_watch(version: Version, lease: LeaseRecord) -> None:
    seen = Sighting(V1, AHEAD, 100.0)
    assert judge(lease, version, seen, 200.0) == (
        Verdict.SUSPECT_NOTICED,
        Sighting(version, lease, 200.0),
    )


def test_which_verdicts_block() -> None:
    assert {v for v in Verdict if v.blocks} == {
        Verdict.BLOCKED,
        Verdict.SUSPECT_NOTICED,
        Verdict.SUSPECT_WAITING,
    }


# --- the probe -----------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["If-None-Match", "If-Match"])
def test_an_accepted_probe_fails_closed_naming_the_header_and_the_switch(header: str) -> None:
    with pytest.raises(PreconditionsIgnored) as raised:
        probe_verdict(Version('"accepted"'), header)
    assert raised.value.header == header
    assert header in raised.value.message
    assert "MUSHROOM_BACKUP_LEASE_CONDITIONAL=off" in raised.value.message


@pytest.mark.parametrize(
    ("answer", "exclusion"),
    [
        (PreconditionFailed("LEASE"), Exclusion.CONDITIONAL),
        (AlreadyExists("LEASE"), Exclusion.CONDITIONAL),
        (NotFound("LEASE"), Exclusion.CONDITIONAL),
        (ConditionalWritesUnsupported("LEASE"), Exclusion.BEST_EFFORT),
    ],
)
def test_a_refused_probe_is_real_exclusion(answer: StoreError, exclusion: Exclusion) -> None:
    assert probe_verdict(answer, "If-Match") is exclusion


def test_a_failed_probe_is_a_store_error() -> None:
    failure = StoreError("503 Service Unavailable", retryable=True)
    with pytest.raises(StoreError) as raised:
        probe_verdict(failure, "If-Match")
    assert raised.value is failure


# --- the write fence -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mono", "wall", "lost", "deadline"),
    [
        (0.0, NOW, False, 120.0),
        (19.999, NOW + 19.999 * S, False, 120.0),  # open just before 2/3 of the TTL
        (20.0, NOW + 20 * S, False, None),  # closed at it
        (25.0, NOW + 25 * S, False, None),
        (0.0, NOW, True, None),  # lost: closed whatever the clocks say
        # The wall clock stepped back (an NTP correction): the monotonic clock decides.
        (10.0, NOW - timedelta(hours=1), False, 120.0),
        (19.999, NOW - timedelta(hours=1), False, 120.0),
        (20.0, NOW - timedelta(hours=1), False, None),
        # The wall clock ran ahead of the monotonic one (a suspended VM): the earlier wins.
        (5.0, NOW + 21 * S, False, None),
        (5.0, NOW + 20 * S, False, None),
        (5.0, NOW + 10 * S, False, 115.0),
        (5.0, NOW + 2 * S, False, 120.0),  # the wall clock lags: the monotonic clock decides
    ],
)
def test_the_write_fence_is_two_thirds_of_a_ttl_on_both_clocks(
    mono: float, wall: datetime, lost: bool, deadline: float | None
) -> None:
    got = write_deadline(
        confirmed_mono=100.0,
        confirmed_wall=NOW,
        ttl_s=30,
        now_mono=100.0 + mono,
        now_wall=wall,
        lost=lost,
    )
    assert got == (None if deadline is None else pytest.approx(deadline))


def test_a_one_second_ttl_fences_after_two_thirds_of_a_second() -> None:
    def at(dt: float) -> float | None:
        return write_deadline(
            confirmed_mono=0.0,
            confirmed_wall=NOW,
            ttl_s=1,
            now_mono=dt,
            now_wall=NOW + dt * S,
            lost=False,
        )

    assert at(0.66) == pytest.approx(2 / 3)
    assert at(0.67) is None


# --- the best-effort switch ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "conditional"),
    [
        ({}, True),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": "off"}, False),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": " OFF "}, False),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": "false"}, False),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": "0"}, False),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": "no"}, False),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": "on"}, True),
        ({"MUSHROOM_BACKUP_LEASE_CONDITIONAL": ""}, True),
        # The Rust agent's switch keeps an existing unit file working...
        ({"MUSHROOMDB_BACKUP_LEASE_CONDITIONAL": "off"}, False),
        # ...and ours wins when both are set.
        (
            {
                "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL": "off",
                "MUSHROOM_BACKUP_LEASE_CONDITIONAL": "on",
            },
            True,
        ),
        (
            {
                "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL": "on",
                "MUSHROOM_BACKUP_LEASE_CONDITIONAL": "off",
            },
            False,
        ),
    ],
)
def test_the_best_effort_switch(environ: dict[str, str], conditional: bool) -> None:
    # The switch is read where every setting is read: the config.
    assert load_settings(None, environ=environ).lease.conditional is conditional


@pytest.mark.parametrize(
    "name", ["MUSHROOM_BACKUP_LEASE_CONDITIONAL", "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL"]
)
def test_a_bad_switch_value_names_the_variable_and_the_values(name: str) -> None:
    with pytest.raises(UsageError) as raised:
        load_settings(None, environ={name: "maybe"})
    assert name in raised.value.message
    assert "'maybe'" in raised.value.message
    assert "on or off" in raised.value.message


# --- describing a lease --------------------------------------------------------------------


def view(lease: LeaseRecord | None, error: str | None = None) -> LeaseView:
    return LeaseView(lease, error, Version('"v"'), 120)


@pytest.mark.parametrize(
    ("seen", "condition", "holder", "age", "expires_in", "detail"),
    [
        (view(record(NOW - 10 * S)), LeaseCondition.FRESH, "x", 10.0, 20.0, "expires in 20.0 s"),
        (view(record(NOW - 30 * S)), LeaseCondition.STALE, "x", 30.0, 0.0, "expired 0.0 s ago"),
        (view(record(NOW - 95 * S)), LeaseCondition.STALE, "x", 95.0, -65.0, "expired 65.0 s"),
        (view(record(NOW + 5 * S)), LeaseCondition.FRESH, "x", -5.0, 35.0, "expires in 35.0 s"),
        (
            view(record(NOW + 100 * S)),
            LeaseCondition.SUSPECT,
            "x",
            -100.0,
            130.0,
            "stamped 100.0 s in the future",
        ),
        (
            view(record(NOW, ttl_s=7200)),
            LeaseCondition.SUSPECT,
            "x",
            0.0,
            7200.0,
            "ttl_s=7200 is over 3600",
        ),
        (
            view(record("yesterday")),
            LeaseCondition.UNPARSEABLE,
            "x",
            None,
            None,
            "'yesterday' is not an RFC 3339 time",
        ),
        (
            view(None, "the lease object is not JSON (Expecting value at 0)"),
            LeaseCondition.UNPARSEABLE,
            None,
            None,
            None,
            "not a lease record: the lease object is not JSON",
        ),
    ],
)
def test_describe_says_what_a_reader_sees(
    seen: LeaseView,
    condition: LeaseCondition,
    holder: str | None,
    age: float | None,
    expires_in: float | None,
    detail: str,
) -> None:
    state = describe(seen, NOW)
    assert state.condition is condition
    assert state.holder == holder
    assert state.age_s == age
    assert state.expires_in_s == expires_in
    assert detail in state.detail
    assert str(condition) == condition.value
