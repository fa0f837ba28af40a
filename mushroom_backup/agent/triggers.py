"""When the service takes its next snapshot: a pure state machine over an explicit ``now``.

Three triggers feed :class:`Triggers`:

* the **interval**: a snapshot ``interval_s`` after the previous one started (or after the
  snapshot ``LATEST`` names, when a holder takes over);
* **changes** in the source (watch mode): a snapshot once no change has arrived for
  ``debounce_s``, and never sooner than ``min_gap_s`` after the previous start;
* a **request** (SIGUSR1): a snapshot as soon as none is running.

Triggers that arrive while a snapshot runs coalesce into one follow-up: :meth:`started` clears
what the starting snapshot covers, and anything arriving after that is pending again.

Promises: :meth:`due` never returns a moment in the past unless a snapshot is due now; nothing
here reads a clock or sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    interval_s: float
    watch: bool
    debounce_s: float
    min_gap_s: float


@dataclass(frozen=True)
class Due:
    """``reason`` is set when a snapshot is due now; otherwise wake at ``wake_at``."""

    reason: str | None
    wake_at: float


@dataclass
class Triggers:
    schedule: Schedule
    last_start: float | None = None
    changed_at: float | None = None
    requested: bool = False

    def on_change(self, now: float) -> None:
        if self.schedule.watch:
            self.changed_at = now

    def on_request(self) -> None:
        self.requested = True

    def previous_snapshot_at(self, moment: float) -> None:
        """Seed the interval from an existing snapshot (e.g. the one LATEST names)."""
        if self.last_start is None or moment > self.last_start:
            self.last_start = moment

    def started(self, now: float) -> None:
        """A snapshot starts now: it covers every trigger seen so far."""
        self.last_start = now
        self.changed_at = None
        self.requested = False

    def due(self, now: float) -> Due:
        if self.requested:
            return Due("request", now)
        if self.last_start is None:
            return Due("interval", now)
        interval_at = self.last_start + self.schedule.interval_s
        if now >= interval_at:
            return Due("interval", now)
        wake = interval_at
        if self.changed_at is not None:
            change_at = max(
                self.changed_at + self.schedule.debounce_s,
                self.last_start + self.schedule.min_gap_s,
            )
            if now >= change_at:
                return Due("change", now)
            wake = min(wake, change_at)
        return Due(None, wake)
