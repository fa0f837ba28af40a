"""Snapshot ids: format, ordering by time, never before the parent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from mushroom_backup.snapshot.ids import (
    format_snapshot_id,
    is_snapshot_id,
    new_snapshot_id,
    snapshot_time,
)

NOW = datetime(2026, 11, 29, 10, 15, 0, 123456, tzinfo=UTC)


def test_format_and_parse_round_trip() -> None:
    snapshot_id = format_snapshot_id(NOW, "3f9a1c2e")
    assert snapshot_id == "20261129T101500.123Z-3f9a1c2e"
    assert is_snapshot_id(snapshot_id)
    assert snapshot_time(snapshot_id) == NOW.replace(microsecond=123000)


def test_other_timezones_are_converted_to_utc() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=2)))
    assert format_snapshot_id(local, "00000000") == "20261129T101500.123Z-00000000"


@pytest.mark.parametrize(
    "text",
    [
        "20261129T101500.123Z-3F9A1C2E",
        "20261129T101500Z-3f9a1c2e",
        "20261129T101500.123Z",
        "20261129T101500.123Z-3f9a1c2e/../x",
        "",
        "latest",
    ],
)
def test_malformed_ids(text: str) -> None:
    assert not is_snapshot_id(text)
    with pytest.raises(ValueError, match="not a snapshot id"):
        snapshot_time(text)


def test_ids_sort_by_time_as_strings() -> None:
    times = [NOW + timedelta(milliseconds=ms) for ms in (0, 1, 999, 1000, 86_400_000)]
    ids = [format_snapshot_id(t, "ffffffff" if i % 2 else "00000000") for i, t in enumerate(times)]
    assert sorted(ids) == ids


@pytest.mark.parametrize(
    ("now", "parent_ms_offset", "expected_ms_offset"),
    [
        (NOW, None, 0),
        (NOW, -5000, 0),  # normal: parent is older
        (NOW, 0, 1),  # same millisecond as the parent: one later
        (NOW, 60_000, 60_001),  # the wall clock stepped back a minute
    ],
)
def test_new_id_sorts_after_its_parent(
    now: datetime, parent_ms_offset: int | None, expected_ms_offset: int
) -> None:
    base = NOW.replace(microsecond=123000)
    parent = None
    if parent_ms_offset is not None:
        parent = format_snapshot_id(base + timedelta(milliseconds=parent_ms_offset), "ffffffff")
    new = new_snapshot_id(now, parent, "00000000")
    assert snapshot_time(new) == base + timedelta(milliseconds=expected_ms_offset)
    if parent is not None:
        assert new > parent


def test_naive_times_and_bad_randomness_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        format_snapshot_id(datetime(2026, 1, 1), "00000000")
    with pytest.raises(ValueError, match="8 lowercase hex"):
        format_snapshot_id(NOW, "xyz")
