"""The one retry layer: what is retried, how often, how long it pauses, when it stops.

No test sleeps for real: pauses are recorded by an injected sleep, or taken on a FakeClock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    FenceClosed,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from mushroom_backup.retry import is_retryable, retrying


def busy(n: int = 0) -> StoreError:
    return StoreError(f"S3 put of 'k' failed: HTTP 503 SlowDown (#{n})", key="k", retryable=True)


class Script:
    """A call that raises the scripted errors in turn, then returns ``result``."""

    def __init__(self, *errors: BaseException, result: str = "done") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


class Pauses:
    """An injected sleep that records each pause and returns at once."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)


async def test_a_call_that_succeeds_is_called_once() -> None:
    call, pauses = Script(), Pauses()

    assert await retrying(call, what="put k", sleep=pauses) == "done"
    assert (call.calls, pauses.taken) == (1, [])


async def test_a_lambda_returning_a_coroutine_is_awaited_and_retried() -> None:
    call, pauses = Script(busy(1)), Pauses()

    assert await retrying(lambda: call(), what="get k", sleep=pauses) == "done"
    assert call.calls == 2


async def test_retryable_failures_are_retried_until_the_call_succeeds() -> None:
    call, pauses = Script(busy(1), busy(2)), Pauses()

    assert await retrying(call, what="put k", sleep=pauses) == "done"
    assert call.calls == 3
    assert len(pauses.taken) == 2


async def test_when_attempts_run_out_the_last_error_itself_is_raised() -> None:
    errors = [busy(n) for n in range(4)]
    call, pauses = Script(*errors), Pauses()

    with pytest.raises(StoreError) as failed:
        await retrying(call, what="put k", attempts=3, sleep=pauses)

    assert failed.value is errors[2]
    assert call.calls == 3
    assert len(pauses.taken) == 2


NEVER_RETRIED: list[BaseException] = [
    PreconditionFailed("LATEST", "the object changed"),
    AlreadyExists("data/ab"),
    NotFound("LEASE"),
    ConditionalWritesUnsupported("LEASE"),
    StoreError("S3 get of 'k' failed: HTTP 403 AccessDenied", retryable=False),
    FenceClosed("the write deadline passed"),
    ValueError("a bug"),
]


@pytest.mark.parametrize("error", NEVER_RETRIED, ids=lambda e: type(e).__name__)
async def test_answers_and_permanent_errors_are_raised_at_once(error: BaseException) -> None:
    call, pauses = Script(error), Pauses()

    with pytest.raises(type(error)) as raised:
        await retrying(call, what="put k", sleep=pauses)

    assert raised.value is error
    assert (call.calls, pauses.taken) == (1, [])


def test_a_refusal_is_never_retryable_even_if_marked_so() -> None:
    refused = PreconditionFailed("LATEST")
    refused.retryable = True

    assert not is_retryable(refused)
    assert is_retryable(busy())
    assert not is_retryable(StoreError("x"))
    assert not is_retryable(OSError("not ours"))


BACKOFF = [
    # (first_delay, max_delay, attempts, upper bounds of the pauses in order)
    (0.2, 5.0, 5, [0.2, 0.4, 0.8, 1.6]),
    (0.1, 0.5, 7, [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]),
    (1.0, 1.0, 3, [1.0, 1.0]),
]


@pytest.mark.parametrize(("first", "cap", "attempts", "bounds"), BACKOFF)
async def test_pauses_widen_exponentially_up_to_the_cap_with_full_jitter(
    monkeypatch: pytest.MonkeyPatch, first: float, cap: float, attempts: int, bounds: list[float]
) -> None:
    windows: list[tuple[float, float]] = []

    def top_of_window(low: float, high: float) -> float:
        windows.append((low, high))
        return high

    monkeypatch.setattr("random.uniform", top_of_window)  # tenacity draws the jitter here
    call, pauses = Script(*[busy(n) for n in range(attempts)]), Pauses()

    with pytest.raises(StoreError):
        await retrying(
            call, what="put k", attempts=attempts, first_delay=first, max_delay=cap, sleep=pauses
        )

    assert pauses.taken == pytest.approx(bounds)
    assert all(low == 0 for low, _ in windows)  # full jitter: down to no pause at all


async def test_real_jittered_pauses_stay_inside_their_windows() -> None:
    call, pauses = Script(*[busy(n) for n in range(8)]), Pauses()

    with pytest.raises(StoreError):
        await retrying(call, what="put k", attempts=8, first_delay=0.1, max_delay=1.0, sleep=pauses)

    windows = [min(1.0, 0.1 * 2**n) for n in range(7)]
    assert all(0 <= p <= w for p, w in zip(pauses.taken, windows, strict=True)), pauses.taken


async def test_retries_stop_as_soon_as_the_fence_closes() -> None:
    fence = {"open": True}
    errors = [busy(n) for n in range(5)]

    async def call() -> str:
        calls.append(1)
        if len(calls) == 2:
            fence["open"] = False  # the deadline passed during the second attempt
        raise errors[len(calls) - 1]

    calls: list[int] = []
    pauses = Pauses()
    with pytest.raises(StoreError) as failed:
        await retrying(call, what="put k", while_open=lambda: fence["open"], sleep=pauses)

    assert failed.value is errors[1]
    assert (len(calls), len(pauses.taken)) == (2, 1)


async def test_a_closed_fence_still_lets_the_first_attempt_through() -> None:
    call, pauses = Script(busy()), Pauses()

    with pytest.raises(StoreError):
        await retrying(call, what="put k", while_open=lambda: False, sleep=pauses)

    assert (call.calls, pauses.taken) == (1, [])


def fake_sleep(clock: FakeClock, asleep: asyncio.Event) -> Callable[[float], Awaitable[None]]:
    """``clock.sleep`` that first says it is about to sleep (the sleeper registers before the
    test task runs again, so the test can advance the clock past it)."""

    async def sleep(seconds: float) -> None:
        asleep.set()
        await clock.sleep(seconds)

    return sleep


async def test_pauses_are_taken_on_the_injected_fake_clock() -> None:
    clock, asleep = FakeClock(), asyncio.Event()
    call = Script(busy(1), busy(2))
    started = clock.monotonic()
    task = asyncio.create_task(
        retrying(call, what="put k", first_delay=1.0, sleep=fake_sleep(clock, asleep))
    )

    for expected_calls in (1, 2):
        await asleep.wait()
        asleep.clear()
        assert call.calls == expected_calls
        assert not task.done()
        deadline = clock.next_deadline()
        assert deadline is not None
        clock.advance(deadline - clock.monotonic())

    assert await task == "done"
    assert call.calls == 3
    assert clock.monotonic() - started <= 1.0 + 2.0


async def test_cancelling_during_a_pause_cancels_the_retry() -> None:
    clock, asleep = FakeClock(), asyncio.Event()
    call = Script(busy(1))
    task = asyncio.create_task(retrying(call, what="put k", sleep=fake_sleep(clock, asleep)))
    await asleep.wait()

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert call.calls == 1


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        asyncio.run(retrying(Script(), what="put k", attempts=0))
