"""The only place that reads time.

A :class:`Clock` gives a monotonic reading (seconds, for deadlines and "unchanged for a TTL"
observations), a wall reading (UTC, for the stamps other hosts read) and sleeps on the monotonic
scale. :class:`SystemClock` is the real one; :class:`FakeClock` is moved by hand in tests, the way
trio's MockClock is: nothing sleeps for real, sleepers wake exactly when :meth:`FakeClock.advance`
passes their deadline, and the wall clock can be stepped on its own to model NTP jumps.

Deadlines on a clock: :func:`finished_by` waits for a task or a deadline, whichever comes
first, and :func:`run_until` cuts a step off at a deadline (cancelling it and waiting for it to
unwind). Both race against ``clock.sleep_until``, so a FakeClock decides deterministically when
something is too late.

Promises: ``monotonic()`` never goes back; ``wall()`` is timezone-aware UTC and may go back.
Not promised: any relation between the two scales.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    """Monotonic and wall time, and sleeping on the monotonic scale."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (origin unspecified)."""
        ...

    def wall(self) -> datetime:
        """The wall clock, timezone-aware UTC. May step back."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` of monotonic time (0 or less: yield once)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``monotonic() >= deadline``."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic` and the system's UTC wall clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """A clock for tests: time moves only when :meth:`advance` is called.

    ``advance(dt)`` moves both the monotonic and the wall reading and wakes every sleeper whose
    deadline has been reached, in deadline order. ``step_wall(delta)`` moves the wall reading
    alone (an NTP correction, a VM restored from a snapshot).
    """

    def __init__(self, wall: datetime | None = None, monotonic: float = 1000.0) -> None:
        self._mono = monotonic
        self._wall = wall or datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
        if self._wall.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware wall time")
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> datetime:
        return self._wall

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._mono + seconds)

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._mono:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many tasks are asleep on this clock now."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        """The earliest deadline anyone sleeps until, if anyone does."""
        live = [d for d, _, f in self._sleepers if not f.done()]
        return min(live) if live else None

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline is reached."""
        if seconds < 0:
            raise ValueError("monotonic time does not go back; use step_wall for the wall clock")
        self._mono += seconds
        self._wall += timedelta(seconds=seconds)
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def step_wall(self, delta: timedelta) -> None:
        """Move the wall clock alone, forward or back."""
        self._wall += delta


class DeadlinePassed(TimeoutError):
    """A step did not finish before its deadline (it was cancelled)."""


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A cancelled task that failed anyway must not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()


async def finished_by(clock: Clock, task: asyncio.Future[Any], deadline: float) -> bool:
    """Wait until ``task`` is done or ``clock`` reaches ``deadline``; True when the task is done.
    The task is left alone either way (the caller decides whether to cancel it); if the caller
    is cancelled meanwhile, the task is cancelled too."""
    task.add_done_callback(_retrieve)
    sleeper = asyncio.ensure_future(clock.sleep_until(deadline))
    racers: set[asyncio.Future[Any]] = {task, sleeper}
    try:
        await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        sleeper.cancel()
    return task.done()


async def run_until(clock: Clock, deadline: float, step: Awaitable[T]) -> T:
    """The result of ``step`` if it finishes before ``clock`` reaches ``deadline``; otherwise
    cancel it, wait for it to unwind (nothing keeps running behind the caller's back), and
    raise :class:`DeadlinePassed`."""
    task: asyncio.Future[T] = asyncio.ensure_future(step)
    if await finished_by(clock, task, deadline):
        return task.result()
    task.cancel()
    await asyncio.wait({task})
    raise DeadlinePassed(f"no result within the deadline ({deadline - clock.monotonic():+.3f} s)")
