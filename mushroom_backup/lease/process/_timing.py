"""Racing an awaitable against a deadline on an injected clock, and bounded concurrency.

``run_until`` is how every bounded step of the process lease is cut off: the step runs as its own
task raced against ``clock.sleep_until(deadline)`` (as :mod:`mushroom_backup.lease.fenced` does),
so a :class:`~mushroom_backup.clock.FakeClock` decides deterministically when a step is too late.
A step that loses the race is cancelled and *waited for*, so nothing it started keeps running
behind the caller's back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ...clock import Clock

T = TypeVar("T")
R = TypeVar("R")


class StepTimedOut(Exception):
    """Internal: the deadline came before the step finished (callers map it to their error)."""


def _retrieve(task: asyncio.Future[T]) -> None:
    # A cancelled step that failed anyway must not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()


async def run_until(clock: Clock, deadline: float, step: Awaitable[T]) -> T:
    """The result of ``step`` if it finishes before ``clock`` reaches ``deadline``; otherwise
    cancel it, wait for it to unwind, and raise :class:`StepTimedOut`."""
    task: asyncio.Future[T] = asyncio.ensure_future(step)
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
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})
    raise StepTimedOut


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
