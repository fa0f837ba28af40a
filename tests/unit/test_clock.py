"""The fake clock and deadlines on a clock: deterministic, no real sleeps."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from mushroom_backup.clock import DeadlinePassed, FakeClock, finished_by, run_until


async def test_sleepers_wake_in_deadline_order_when_time_passes() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("late", 5), ("early", 1))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2
    assert clock.next_deadline() == clock.monotonic() + 1
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(10)
    await asyncio.gather(*tasks)
    assert woke == ["early", "late"]


def test_the_wall_clock_steps_alone_and_monotonic_never_goes_back() -> None:
    clock = FakeClock()
    before = (clock.monotonic(), clock.wall())
    clock.step_wall(timedelta(hours=-1))
    assert clock.monotonic() == before[0]
    assert clock.wall() == before[1] - timedelta(hours=1)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)


async def test_run_until_returns_a_result_in_time() -> None:
    clock = FakeClock()

    async def quick() -> int:
        return 42

    assert await run_until(clock, clock.monotonic() + 1, quick()) == 42


async def test_run_until_cancels_a_late_step_and_waits_for_it_to_unwind() -> None:
    clock = FakeClock()
    unwound = asyncio.Event()
    started = asyncio.Event()

    async def stuck() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    outcome = asyncio.create_task(run_until(clock, clock.monotonic() + 3, stuck()))
    await started.wait()
    clock.advance(3)
    with pytest.raises(DeadlinePassed):
        await outcome
    assert unwound.is_set(), "the step had finished unwinding before run_until returned"


async def test_finished_by_leaves_the_task_running_at_the_deadline() -> None:
    clock = FakeClock()
    gate = asyncio.Event()
    task = asyncio.ensure_future(gate.wait())
    waiting = asyncio.create_task(finished_by(clock, task, clock.monotonic() + 1))
    await asyncio.sleep(0)
    clock.advance(1)
    assert await waiting is False
    assert not task.done()
    gate.set()
    assert await finished_by(clock, task, clock.monotonic() + 1) is True
