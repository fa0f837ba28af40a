"""Compare-and-swap under real concurrency: of several clients racing one conditional write,
exactly one wins and the object holds the winner's bytes.

Run on the stores that promise real compare-and-swap: memory, local (threads, and separate
processes), and S3 on SeaweedFS. Not on moto: it checks preconditions without a lock, so
racing conditional PUTs can all win there (DESIGN.md, "How real S3 services behave").
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mushroom_backup.errors import AlreadyExists, PreconditionFailed
from mushroom_backup.store import CREATE, ObjectStore, PutMode, Update, Version, open_store

CONTENDERS = 6


@pytest.fixture(params=["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)])
def cas_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://race-{secrets.token_hex(8)}"
    if request.param == "local":
        return (tmp_path / "store").as_uri()
    url: str = request.getfixturevalue("seaweed_url")
    return url


@pytest.fixture
def rounds(cas_store_url: str) -> int:
    """Races per test: SeaweedFS resolves a contended round in seconds, so one there."""
    return 1 if cas_store_url.startswith("s3://") else 5


@pytest.fixture
async def clients(cas_store_url: str) -> AsyncIterator[list[ObjectStore]]:
    """One independent client per contender (own connection pool, own file handles)."""
    stores = [open_store(cas_store_url) for _ in range(CONTENDERS)]
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


async def race(
    clients: list[ObjectStore], key: str, mode_for: dict[int, PutMode]
) -> tuple[list[int], list[BaseException]]:
    """Every contender puts its own body at once; returns (winners, refusals)."""

    async def contend(n: int) -> int:
        await clients[n].put(key, f"contender {n}".encode(), mode_for[n])
        return n

    results = await asyncio.gather(
        *(contend(n) for n in range(len(clients))), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, int)]
    refusals = [r for r in results if isinstance(r, BaseException)]
    return winners, refusals


async def test_racing_creates_have_exactly_one_winner(
    clients: list[ObjectStore], rounds: int
) -> None:
    for round_ in range(rounds):
        key = f"race/create-{round_}"
        modes: dict[int, PutMode] = dict.fromkeys(range(CONTENDERS), CREATE)
        winners, refusals = await race(clients, key, modes)

        assert len(winners) == 1, (key, winners, refusals)
        assert all(isinstance(r, AlreadyExists) for r in refusals), refusals
        stored = await clients[0].get(key)
        assert stored.data == f"contender {winners[0]}".encode()


async def test_racing_updates_from_one_version_have_exactly_one_winner(
    clients: list[ObjectStore], rounds: int
) -> None:
    for round_ in range(rounds):
        key = f"race/LATEST-{round_}"
        start: Version = await clients[0].put(key, b"start", CREATE)
        modes: dict[int, PutMode] = dict.fromkeys(range(CONTENDERS), Update(start))
        winners, refusals = await race(clients, key, modes)

        assert len(winners) == 1, (key, winners, refusals)
        assert all(
            isinstance(r, PreconditionFailed) and not isinstance(r, AlreadyExists) for r in refusals
        ), refusals
        assert (await clients[0].get(key)).data == f"contender {winners[0]}".encode()


# --- separate processes on one local directory ---------------------------------------------

_CONTENDER = textwrap.dedent(
    """
    import asyncio, json, sys
    from mushroom_backup.errors import AlreadyExists
    from mushroom_backup.store import CREATE
    from mushroom_backup.store.local import LocalStore

    async def main(root, me, keys):
        store = LocalStore(root)
        won = []
        print("ready", flush=True)
        sys.stdin.readline()  # everyone starts together, after every process is ready
        for key in keys:
            try:
                await store.put(key, me.encode(), CREATE)
                won.append(key)
            except AlreadyExists:
                pass
        print(json.dumps(won))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
    """
)


def test_racing_creates_from_separate_processes_have_exactly_one_winner(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    keys = [f"data/k{n:02d}" for n in range(40)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, str(root), f"process-{p}", *keys],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    won = {}
    for p, process in enumerate(processes):
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        won[f"process-{p}"] = json.loads(out)

    winners_of = {key: [who for who, keys_won in won.items() if key in keys_won] for key in keys}
    assert all(len(w) == 1 for w in winners_of.values()), winners_of
    stored = asyncio.run(read_all(root, keys))
    assert stored == {key: winner.encode() for key, [winner] in winners_of.items()}


async def read_all(root: Path, keys: list[str]) -> dict[str, bytes]:
    async with open_store(root.as_uri()) as store:
        return {key: (await store.get(key)).data for key in keys}
