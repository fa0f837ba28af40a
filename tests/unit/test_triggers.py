"""The service's triggers, as a table over an explicit now."""

from __future__ import annotations

import pytest

from mushroom_backup.agent.triggers import Due, Schedule, Triggers

HOURLY_WATCH = Schedule(interval_s=3600, watch=True, debounce_s=10, min_gap_s=60)


def test_first_snapshot_is_due_at_once() -> None:
    assert Triggers(HOURLY_WATCH).due(0.0) == Due("interval", 0.0)


def test_interval_counts_from_the_previous_start() -> None:
    triggers = Triggers(HOURLY_WATCH)
    triggers.started(100.0)
    assert triggers.due(3699.9) == Due(None, 3700.0)
    assert triggers.due(3700.0) == Due("interval", 3700.0)


def test_a_taken_over_lease_counts_from_latest() -> None:
    triggers = Triggers(HOURLY_WATCH)
    triggers.previous_snapshot_at(-600.0)
    assert triggers.due(0.0) == Due(None, 3000.0)


@pytest.mark.parametrize(
    ("changes", "now", "expected"),
    [
        ([1000.0], 1009.9, Due(None, 1010.0)),  # still settling
        ([1000.0], 1010.0, Due("change", 1010.0)),  # settled
        ([1000.0, 1005.0], 1010.0, Due(None, 1015.0)),  # a later change restarts the debounce
        ([20.0], 30.0, Due(None, 60.0)),  # settled, but inside the minimum gap
        ([20.0], 60.0, Due("change", 60.0)),
    ],
)
def test_changes_settle_then_respect_the_gap(
    changes: list[float], now: float, expected: Due
) -> None:
    triggers = Triggers(HOURLY_WATCH)
    triggers.started(0.0)
    for moment in changes:
        triggers.on_change(moment)
    assert triggers.due(now) == expected


def test_changes_are_ignored_without_watch() -> None:
    triggers = Triggers(Schedule(interval_s=3600, watch=False, debounce_s=10, min_gap_s=60))
    triggers.started(0.0)
    triggers.on_change(100.0)
    assert triggers.due(500.0) == Due(None, 3600.0)


def test_a_request_is_due_at_once_even_inside_the_gap() -> None:
    triggers = Triggers(HOURLY_WATCH)
    triggers.started(0.0)
    triggers.on_request()
    assert triggers.due(1.0) == Due("request", 1.0)


def test_triggers_during_a_snapshot_coalesce_into_one_follow_up() -> None:
    triggers = Triggers(HOURLY_WATCH)
    triggers.on_change(0.0)
    triggers.started(100.0)  # covers the change at 0
    assert triggers.due(200.0) == Due(None, 3700.0)
    for moment in (101.0, 102.0, 103.0):  # arrive while the snapshot runs
        triggers.on_change(moment)
        triggers.on_request()
    assert triggers.due(150.0).reason == "request"
    triggers.started(150.0)  # the one follow-up covers all of them
    assert triggers.due(151.0) == Due(None, 3750.0)
