"""The metrics text keeps every digit of a sample (a Unix timestamp, a byte counter)."""

from __future__ import annotations

import pytest

from mushroom_backup.agent.metrics import Metrics


@pytest.mark.parametrize(
    ("wall", "duration", "uploaded", "expected"),
    [
        (1_795_960_123.456, 4.5, 1234, ("1795960123.456", "4.5", "1234")),
        (1_795_960_000.0, 0.001, 98_765_432_109, ("1795960000", "0.001", "98765432109")),
    ],
)
def test_samples_keep_every_digit(
    wall: float, duration: float, uploaded: int, expected: tuple[str, str, str]
) -> None:
    metrics = Metrics(
        last_snapshot_wall=wall, last_snapshot_duration=duration, bytes_uploaded_total=uploaded
    )
    samples = dict(
        line.rsplit(" ", 1)
        for line in metrics.render(wall + 30).splitlines()
        if not line.startswith("#")
    )
    timestamp, seconds, counted = expected
    assert samples["mushroom_backup_last_snapshot_timestamp"] == timestamp
    assert samples["mushroom_backup_snapshot_duration_seconds"] == seconds
    assert samples["mushroom_backup_bytes_uploaded_total"] == counted
    assert float(samples["mushroom_backup_seconds_since_last_snapshot"]) == pytest.approx(30)
