"""Deadlines and bounded concurrency for the process lease.

Every bounded step of the process lease is cut off with :func:`~mushroom_backup.clock.run_until`
(re-exported here): the step is raced against ``clock.sleep_until(deadline)``, so a
:class:`~mushroom_backup.clock.FakeClock` decides deterministically when a step is too late, and a
step that loses the race is cancelled and *waited for*. :func:`map_bounded` runs reads with a
bounded number in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ...clock import DeadlinePassed, run_until

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["StepTimedOut", "map_bounded", "run_until"]


#: The deadline came before the step finished (callers map it to their error).
StepTimedOut = DeadlinePassed


async def map_bounded(
    function: Callable[[T], Awaitable[R]], items: Sequence[T], limit: int
) -> list[R]:
    """``[await function(item) for item in items]`` with at most ``limit`` in flight, in input
    order. The first failure cancels the rest and is raised."""
    results: dict[int, R] = {}
    pending = iter(enumerate(items))

    async def worker() -> None:
        for index, item in pending:
            results[index] = await function(item)

    workers = [asyncio.ensure_future(worker()) for _ in range(min(limit, len(items)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return [results[index] for index in range(len(items))]
