"""FencedStore: writes start only while the fence is open; in-flight writes are cancelled at
the deadline; a renewal that moves the deadline lets an in-flight write finish."""

from __future__ import annotations

import asyncio

import pytest

from mushroom_backup.clock import FakeClock
from mushroom_backup.errors import FenceClosed, NotFound
from mushroom_backup.lease.fenced import FencedStore
from mushroom_backup.store import CREATE
from mushroom_backup.store.faults import FaultyStore
from mushroom_backup.store.memory import MemoryStore


class Fence:
    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def write_deadline(self) -> float | None:
        return self.deadline


def make(deadline: float | None) -> tuple[FakeClock, Fence, FaultyStore, FencedStore]:
    clock = FakeClock()
    fence = Fence(deadline if deadline is None else clock.monotonic() + deadline)
    inner = FaultyStore(MemoryStore())
    return clock, fence, inner, FencedStore(inner, fence, clock)


async def test_writes_pass_while_the_fence_is_open() -> None:
    _, _, inner, fenced = make(20.0)
    await fenced.put("a", b"1", CREATE)
    assert (await inner.get("a")).data == b"1"
    await fenced.delete("a")
    with pytest.raises(NotFound):
        await inner.get("a")


async def test_nothing_is_sent_once_the_fence_is_closed() -> None:
    _, _, inner, fenced = make(None)
    with pytest.raises(FenceClosed, match="not started"):
        await fenced.put("a", b"1")
    assert inner.calls == []


async def test_a_deadline_already_passed_sends_nothing() -> None:
    clock, _, inner, fenced = make(5.0)
    clock.advance(5.0)
    with pytest.raises(FenceClosed):
        await fenced.put("a", b"1")
    assert inner.calls == []


async def test_a_stalled_write_is_cancelled_at_the_deadline() -> None:
    clock, _, inner, fenced = make(20.0)
    stall = inner.stall("put")
    write = asyncio.create_task(fenced.put("a", b"1"))
    await stall.entered.wait()
    clock.advance(19.999)
    await asyncio.sleep(0)
    assert not write.done()
    clock.advance(0.001)
    with pytest.raises(FenceClosed, match="in flight"):
        await write
    assert stall.waiting == 0, "the stalled request was cancelled, not left waiting"
    stall.release()
    with pytest.raises(NotFound):
        await inner.inner.get("a")


async def test_a_renewal_during_the_write_extends_the_race() -> None:
    clock, fence, inner, fenced = make(20.0)
    stall = inner.stall("put")
    write = asyncio.create_task(fenced.put("a", b"1"))
    await stall.entered.wait()
    assert fence.deadline is not None
    fence.deadline += 10.0  # a renewal confirmed meanwhile
    clock.advance(20.0)
    await asyncio.sleep(0)
    assert not write.done()
    stall.release()
    await write
    assert (await inner.get("a")).data == b"1"


async def test_the_first_closure_is_final() -> None:
    _, fence, inner, fenced = make(None)
    with pytest.raises(FenceClosed):
        await fenced.put("a", b"1")
    fence.deadline = 10_000.0
    with pytest.raises(FenceClosed):
        await fenced.put("b", b"2")
    assert inner.calls == []


async def test_reads_are_not_fenced() -> None:
    _, _, inner, fenced = make(None)
    await inner.put("a", b"1")
    assert (await fenced.get("a")).data == b"1"
    assert [info.key async for info in fenced.list("")] == ["a"]


async def test_cancelling_the_caller_cancels_the_write() -> None:
    _, _, inner, fenced = make(20.0)
    stall = inner.stall("put")
    write = asyncio.create_task(fenced.put("a", b"1"))
    await stall.entered.wait()
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    await asyncio.sleep(0)
    assert stall.waiting == 0
