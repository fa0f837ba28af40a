"""The keep rule as tables: restic's semantics, UTC buckets, ISO weeks, gaps, boundaries,
equal timestamps, keep-within from an explicit ``now``, LATEST always kept."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import pytest

from mushroom_backup.config import RetentionSettings
from mushroom_backup.errors import UsageError
from mushroom_backup.snapshot.ids import format_snapshot_id
from mushroom_backup.snapshot.retention import (
    Reason,
    RetentionPolicy,
    SnapshotStamp,
    bucket_of,
    format_duration,
    plan_retention,
    policy_from_settings,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(text: str, tail: str = "00000000") -> SnapshotStamp:
    """A snapshot taken at ``text`` (ISO 8601; UTC unless it says otherwise)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return SnapshotStamp(format_snapshot_id(moment, tail), moment)


@dataclass(frozen=True)
class Case:
    name: str
    snapshots: tuple[str, ...]
    policy: RetentionPolicy
    #: every kept snapshot (by its time text) and the reasons it is kept
    kept: dict[str, tuple[Reason, ...]]
    now: datetime = NOW
    latest: str | None = None


CASES = [
    Case(
        "last keeps the newest N",
        ("2026-11-01T00:00", "2026-11-02T00:00", "2026-11-03T00:00", "2026-11-04T00:00"),
        RetentionPolicy(last=2),
        {"2026-11-03T00:00": ("last",), "2026-11-04T00:00": ("last",)},
    ),
    Case(
        "last larger than the list keeps all",
        ("2026-11-01T00:00", "2026-11-02T00:00"),
        RetentionPolicy(last=5),
        {"2026-11-01T00:00": ("last",), "2026-11-02T00:00": ("last",)},
    ),
    Case(
        "hourly: the newest of each hour, hours without snapshots are skipped, not counted",
        (
            "2026-11-29T10:05",
            "2026-11-29T10:55",
            "2026-11-29T11:30",
            "2026-11-29T13:10",
            "2026-11-29T13:20",
        ),
        RetentionPolicy(hourly=3),
        {
            "2026-11-29T10:55": ("hourly",),
            "2026-11-29T11:30": ("hourly",),
            "2026-11-29T13:20": ("hourly",),
        },
    ),
    Case(
        "daily: a UTC day ends at 23:59:59.999",
        ("2026-11-27T23:59:59.999", "2026-11-28T00:00:00.000", "2026-11-28T12:00"),
        RetentionPolicy(daily=2),
        {"2026-11-27T23:59:59.999": ("daily",), "2026-11-28T12:00": ("daily",)},
    ),
    Case(
        "daily with a gap of days: the N most recent days that have snapshots",
        ("2026-10-01T08:00", "2026-10-15T08:00", "2026-11-28T08:00", "2026-11-28T20:00"),
        RetentionPolicy(daily=3),
        {
            "2026-10-01T08:00": ("daily",),
            "2026-10-15T08:00": ("daily",),
            "2026-11-28T20:00": ("daily",),
        },
    ),
    Case(
        "weekly: ISO weeks run Monday to Sunday across the new year (2026-W53)",
        (
            "2026-12-27T12:00",  # Sunday of 2026-W52
            "2026-12-28T12:00",  # Monday of 2026-W53
            "2026-12-31T12:00",  # Thursday, 2026-W53
            "2027-01-03T23:59",  # Sunday, still 2026-W53
            "2027-01-04T00:00",  # Monday of 2027-W01
        ),
        RetentionPolicy(weekly=3),
        {
            "2026-12-27T12:00": ("weekly",),
            "2027-01-03T23:59": ("weekly",),
            "2027-01-04T00:00": ("weekly",),
        },
        now=datetime(2027, 1, 5, tzinfo=UTC),
    ),
    Case(
        "monthly and yearly count their own buckets",
        ("2025-06-30T00:00", "2025-12-31T23:00", "2026-01-15T00:00", "2026-02-01T00:00"),
        RetentionPolicy(monthly=2, yearly=2),
        {
            "2025-12-31T23:00": ("yearly",),
            "2026-01-15T00:00": ("monthly",),
            "2026-02-01T00:00": ("monthly", "yearly"),
        },
    ),
    Case(
        "a snapshot kept by one rule still uses up the others' counts (restic)",
        ("2026-11-26T10:00", "2026-11-27T10:00", "2026-11-28T09:00", "2026-11-28T10:00"),
        RetentionPolicy(last=1, daily=2),
        {"2026-11-27T10:00": ("daily",), "2026-11-28T10:00": ("last", "daily")},
    ),
    Case(
        "within: at most D before now is kept (inclusive); the future counts as within",
        ("2026-11-28T11:59:59.999", "2026-11-28T12:00", "2026-11-29T11:00", "2026-11-30T00:00"),
        RetentionPolicy(within=timedelta(days=1)),
        {
            "2026-11-28T12:00": ("within",),
            "2026-11-29T11:00": ("within",),
            "2026-11-30T00:00": ("within",),
        },
    ),
    Case(
        "within counts from now, not from the newest snapshot: old snapshots age out",
        ("2026-10-01T00:00", "2026-10-02T00:00"),
        RetentionPolicy(within=timedelta(days=7)),
        {"2026-10-02T00:00": ("latest",)},
        latest="2026-10-02T00:00",
    ),
    Case(
        "LATEST is kept even when no rule keeps it",
        ("2026-11-01T00:00", "2026-11-02T00:00", "2026-11-03T00:00"),
        RetentionPolicy(last=1),
        {"2026-11-02T00:00": ("latest",), "2026-11-03T00:00": ("last",)},
        latest="2026-11-02T00:00",
    ),
    Case(
        "other time zones are bucketed by their UTC time",
        ("2026-11-28T01:30+02:00", "2026-11-28T22:30"),  # 2026-11-27 23:30 UTC, then 11-28
        RetentionPolicy(daily=5),
        {"2026-11-28T01:30+02:00": ("daily",), "2026-11-28T22:30": ("daily",)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_keep_rule(case: Case) -> None:
    stamps = [at(text) for text in case.snapshots]
    by_text = dict(zip(case.snapshots, stamps, strict=True))
    latest = by_text[case.latest].snapshot_id if case.latest else None
    decisions = plan_retention(stamps, case.policy, now=case.now, latest_id=latest)
    expected = {by_text[text].snapshot_id: reasons for text, reasons in case.kept.items()}
    got = {d.snapshot_id: d.reasons for d in decisions if d.keep}
    assert got == expected
    assert all(d.reasons == () for d in decisions if not d.keep)
    # one decision per snapshot, oldest first
    assert [d.snapshot_id for d in decisions] == sorted(s.snapshot_id for s in stamps)


def test_equal_timestamps_the_greater_id_is_newer() -> None:
    moment = "2026-11-28T10:00"
    a, b, c = at(moment, "00000001"), at(moment, "ffffffff"), at(moment, "7fffffff")
    assert a.created_at == b.created_at == c.created_at
    for policy in (RetentionPolicy(last=1), RetentionPolicy(daily=1), RetentionPolicy(hourly=5)):
        decisions = plan_retention([a, b, c], policy, now=NOW, latest_id=None)
        assert [d.snapshot_id for d in decisions if d.keep] == [b.snapshot_id]
    # and keep-last 2 takes the two greatest ids
    decisions = plan_retention([c, a, b], RetentionPolicy(last=2), now=NOW, latest_id=None)
    assert {d.snapshot_id for d in decisions if d.keep} == {b.snapshot_id, c.snapshot_id}


def test_no_daylight_saving_in_utc_hours() -> None:
    """The night Europe springs forward (2026-03-29) and falls back (2026-10-25): hourly
    snapshots all night give 24 distinct hourly buckets per UTC day, never 23 or 25."""
    for day in ("2026-03-29", "2026-10-25"):
        start = datetime.fromisoformat(f"{day}T00:30").replace(tzinfo=UTC)
        stamps = [
            SnapshotStamp(format_snapshot_id(t, "00000000"), t)
            for t in (start + timedelta(hours=h) for h in range(24))
        ]
        decisions = plan_retention(
            stamps, RetentionPolicy(hourly=100), now=start + timedelta(days=1), latest_id=None
        )
        assert all(d.keep for d in decisions)
        kept = plan_retention(stamps, RetentionPolicy(daily=100), now=start, latest_id=None)
        assert sum(d.keep for d in kept) == 1


def test_a_week_of_hourly_snapshots_under_a_typical_policy() -> None:
    start = datetime(2026, 11, 23, 0, 15, tzinfo=UTC)  # Monday
    stamps = [
        SnapshotStamp(format_snapshot_id(t, "abcdef01"), t)
        for t in (start + timedelta(hours=h) for h in range(7 * 24))
    ]
    now = stamps[-1].created_at + timedelta(minutes=5)
    policy = RetentionPolicy(last=3, hourly=6, daily=3, weekly=2)
    decisions = plan_retention(stamps, policy, now=now, latest_id=stamps[-1].snapshot_id)
    kept = [d for d in decisions if d.keep]
    # Sunday's 6 newest hours (3 of them also "last"), and Saturday's and Friday's newest
    # (23:15) as daily; the whole week is one ISO week, so "weekly 2" finds one bucket only.
    assert len(kept) == 8
    newest = kept[-1]
    assert newest.reasons == ("last", "hourly", "daily", "weekly", "latest")
    assert [d.created_at.hour for d in kept[:2]] == [23, 23]
    assert [d.reasons for d in kept[:2]] == [("daily",), ("daily",)]


def test_empty_list_and_empty_policy() -> None:
    assert plan_retention([], RetentionPolicy(last=1), now=NOW, latest_id=None) == ()
    with pytest.raises(UsageError, match="--keep-last"):
        plan_retention([at("2026-11-01T00:00")], RetentionPolicy(), now=NOW, latest_id=None)
    assert RetentionPolicy().empty
    assert not RetentionPolicy(within=timedelta(0)).empty


@pytest.mark.parametrize("field", ["last", "hourly", "daily", "weekly", "monthly", "yearly"])
def test_negative_counts_are_refused(field: str) -> None:
    with pytest.raises(UsageError, match=f"--keep-{field}"):
        RetentionPolicy(**{field: -1})  # type: ignore[arg-type]


def test_buckets_need_aware_times() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        bucket_of("daily", datetime(2026, 1, 1))  # naive on purpose
    assert bucket_of("weekly", datetime(2027, 1, 1, tzinfo=UTC)) == (2026, 53)
    local = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=3)))
    assert bucket_of("yearly", local) == (2025,)


def test_policy_from_settings() -> None:
    assert policy_from_settings(RetentionSettings()) is None
    policy = policy_from_settings(
        RetentionSettings.model_validate({"keep_last": 2, "keep_weekly": 4, "keep_within_s": "36h"})
    )
    assert policy is not None
    assert policy == RetentionPolicy(last=2, weekly=4, within=timedelta(hours=36))
    assert policy.describe() == "last 2, weekly 4, within 1d12h"


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(days=9, hours=1), "1w2d1h"),
    ],
)
def test_format_duration(span: timedelta, text: str) -> None:
    assert format_duration(span) == text
