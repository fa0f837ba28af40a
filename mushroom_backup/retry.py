"""The one retry layer: retry a store call that failed in a way that trying again may fix.

:func:`retrying` runs an async call and, on a :class:`~mushroom_backup.errors.StoreError` whose
``retryable`` is true (throttling, 5xx, timeouts, connection failures), calls it again after an
exponentially widening, randomly jittered pause ("full jitter": attempt *n* waits a uniform
random time in ``[0, min(max_delay, first_delay * 2**(n-1))]``), up to ``attempts`` calls in all.

Promises
--------
* Only retryable StoreErrors are retried. A 412 is an answer, not a fault:
  :class:`~mushroom_backup.errors.PreconditionFailed`, ``AlreadyExists``, ``NotFound``,
  ``ConditionalWritesUnsupported``, every other error and cancellation propagate at once.
* When the attempts run out, the last error itself is raised (not a wrapper).
* ``while_open`` (e.g. "the lease's write fence is still open") is asked after each failure,
  before sleeping: once it says False, the last error is raised and nothing is tried again.
* Time passes only through the injected ``sleep`` (default :func:`asyncio.sleep`; tests pass
  ``FakeClock.sleep``). Nothing here reads a clock.
* Each retry is logged as ``store_retry`` with the operation, attempt, pause and error.

Not promised
------------
* Idempotence. Retrying a write whose answer was lost may find the write already applied: a
  retried CREATE may then raise ``AlreadyExists``, a retried ``Update`` ``PreconditionFailed``.
  Callers reconcile that by reading, never by guessing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_random_exponential,
)

from .errors import (
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    StoreError,
)

T = TypeVar("T")

log = logging.getLogger("mushroom_backup.retry")

DEFAULT_ATTEMPTS = 5
DEFAULT_FIRST_DELAY_S = 0.2
DEFAULT_MAX_DELAY_S = 5.0


def is_retryable(error: BaseException) -> bool:
    """Whether trying the same call again may help: a StoreError marked retryable, and never
    an answer (precondition refused, not found, conditional writes unsupported)."""
    if isinstance(error, PreconditionFailed | NotFound | ConditionalWritesUnsupported):
        return False
    return isinstance(error, StoreError) and error.retryable


def _log_retry(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "store_retry",
            extra={
                "fields": {
                    "what": what,
                    "attempt": state.attempt_number,
                    "pause_s": round(state.upcoming_sleep, 3),
                    "error": str(error),
                }
            },
        )

    return before_sleep


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int = DEFAULT_ATTEMPTS,
    first_delay: float = DEFAULT_FIRST_DELAY_S,
    max_delay: float = DEFAULT_MAX_DELAY_S,
    while_open: Callable[[], bool] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``await call()``, retried as the module docstring says. ``what`` names the operation
    in logs (e.g. ``"put data/ab/cdef"``). ``call`` must make a fresh request each time."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= attempts:
            return True
        return while_open is not None and not while_open()

    controller = AsyncRetrying(
        sleep=sleep,
        stop=stop,
        wait=wait_random_exponential(multiplier=first_delay, max=max_delay),
        retry=retry_if_exception(is_retryable),
        before_sleep=_log_retry(what),
        reraise=True,
    )

    # tenacity awaits only coroutine *functions*; a lambda returning a coroutine would come
    # back unawaited. Wrapping makes every awaitable-returning callable work.
    async def attempt() -> T:
        return await call()

    return await controller(attempt)
