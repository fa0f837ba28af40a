"""The ObjectStore contract (mushroom_backup/store/base.py), one suite run against every
backend: memory, local directory, S3 on moto's server, S3 on SeaweedFS.

Bodies differ between writes wherever a version must change: S3 ETags are MD5s, so identical
bytes may keep the version (the contract says so).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import pytest

from mushroom_backup.errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from mushroom_backup.store import (
    CREATE,
    OVERWRITE,
    ObjectInfo,
    ObjectStore,
    Update,
    Version,
    open_store,
)
from mushroom_backup.store.faults import FaultyStore

MADE_UP = Version('"0123456789abcdef0123456789abcdef"')


@pytest.fixture
async def store(any_store_url: str) -> AsyncIterator[ObjectStore]:
    async with open_store(any_store_url) as opened:
        yield opened


async def listed(store: ObjectStore, prefix: str = "") -> list[ObjectInfo]:
    return [info async for info in store.list(prefix)]


def byte_order(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode())


def segment_order(keys: list[str]) -> list[str]:
    """SeaweedFS's directory-tree order (base.py allows it): ``a/b`` before ``a-c``."""
    return sorted(keys, key=lambda k: [s.encode() for s in k.split("/")])


def in_listing_order(keys: list[str]) -> bool:
    return keys in (byte_order(keys), segment_order(keys))


# --- reads ---------------------------------------------------------------------------------


async def test_reads_of_a_missing_key_raise_not_found(store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        await store.get("absent")
    with pytest.raises(NotFound):
        await store.head("absent")
    with pytest.raises(NotFound):
        await store.get_range("absent", 0, 10)
    with pytest.raises(NotFound):
        await store.get_range("absent", 0, 0)


async def test_put_then_get_and_head_return_the_bytes_and_the_same_version(
    store: ObjectStore,
) -> None:
    data = b"manifest \x00\xff bytes"
    version = await store.put("manifests/20261129T101500.123Z-3f9a1c2e", data)

    got = await store.get("manifests/20261129T101500.123Z-3f9a1c2e")
    head = await store.head("manifests/20261129T101500.123Z-3f9a1c2e")

    assert got.data == data
    assert got.key == "manifests/20261129T101500.123Z-3f9a1c2e"
    assert got.version == version
    assert head.version == version
    assert head.size == len(data)
    assert isinstance(head.last_modified, datetime)
    assert head.last_modified.tzinfo is not None


async def test_an_empty_object_is_an_object(store: ObjectStore) -> None:
    version = await store.put("empty", b"", CREATE)

    assert (await store.get("empty")).data == b""
    assert (await store.head("empty")).size == 0
    assert (await store.head("empty")).version == version
    assert await store.get_range("empty", 0, 5) == b""


RANGES = [
    # (start, length, expected slice of DATA)
    (0, 10, slice(0, 10)),
    (100, 28, slice(100, 128)),
    (1000, 24, slice(1000, 1024)),  # exactly to the end
    (1000, 100, slice(1000, 1024)),  # past the end: fewer bytes
    (1023, 1, slice(1023, 1024)),
    (1024, 10, slice(1024, 1024)),  # starts at the end: nothing
    (5000, 10, slice(5000, 5000)),  # starts beyond the end: nothing
    (7, 0, slice(7, 7)),  # zero length
]
DATA = bytes(range(256)) * 4


async def test_get_range_returns_the_requested_bytes(store: ObjectStore) -> None:
    await store.put("data/pack-1", DATA)
    for start, length, expected in RANGES:
        assert await store.get_range("data/pack-1", start, length) == DATA[expected], (
            start,
            length,
        )


async def test_get_range_refuses_negative_arguments(store: ObjectStore) -> None:
    await store.put("data/pack-1", DATA)
    with pytest.raises(ValueError, match="negative"):
        await store.get_range("data/pack-1", -1, 4)
    with pytest.raises(ValueError, match="negative"):
        await store.get_range("data/pack-1", 0, -4)


# --- writes --------------------------------------------------------------------------------


async def test_create_only_writes_once_and_then_refuses(store: ObjectStore) -> None:
    first = await store.put("LEASE", b"first", CREATE)

    with pytest.raises(AlreadyExists) as refused:
        await store.put("LEASE", b"second", CREATE)

    assert refused.value.key == "LEASE"
    assert not refused.value.retryable
    got = await store.get("LEASE")
    assert (got.data, got.version) == (b"first", first)


async def test_update_swaps_only_from_the_current_version(store: ObjectStore) -> None:
    v1 = await store.put("LATEST", b"one", CREATE)
    v2 = await store.put("LATEST", b"two", Update(v1))

    for stale in (v1, MADE_UP):
        with pytest.raises(PreconditionFailed) as refused:
            await store.put("LATEST", b"three", Update(stale))
        assert not isinstance(refused.value, AlreadyExists)
        assert not refused.value.retryable

    got = await store.get("LATEST")
    assert (got.data, got.version) == (b"two", v2)
    assert v2 != v1


async def test_update_of_a_missing_key_is_refused(store: ObjectStore) -> None:
    with pytest.raises((PreconditionFailed, NotFound)):
        await store.put("LATEST", b"x", Update(MADE_UP))
    with pytest.raises(NotFound):
        await store.get("LATEST")


async def test_overwrite_replaces_whatever_is_there(store: ObjectStore) -> None:
    await store.put("k", b"one", OVERWRITE)
    v2 = await store.put("k", b"two", OVERWRITE)

    got = await store.get("k")
    assert (got.data, got.version) == (b"two", v2)


async def test_every_write_returns_a_new_version_that_reads_return_exactly(
    store: ObjectStore,
) -> None:
    versions = [await store.put("LEASE", b"body 0", CREATE)]
    for n in range(1, 4):
        versions.append(await store.put("LEASE", f"body {n}".encode(), Update(versions[-1])))
        assert (await store.head("LEASE")).version == versions[-1]
    versions.append(await store.put("LEASE", b"body 4", OVERWRITE))

    assert len(set(versions)) == len(versions)
    assert (await store.get("LEASE")).version == versions[-1]
    [info] = await listed(store, "LEASE")
    assert info.version.etag == versions[-1].etag


# --- deletes -------------------------------------------------------------------------------


async def test_delete_removes_and_is_idempotent(store: ObjectStore) -> None:
    await store.put("manifests/a", b"a")

    await store.delete("manifests/a")
    await store.delete("manifests/a")  # already gone: fine
    await store.delete("never-existed")

    with pytest.raises(NotFound):
        await store.get("manifests/a")


async def test_conditional_delete_needs_the_current_version(store: ObjectStore) -> None:
    v1 = await store.put("LEASE", b"mine", CREATE)
    v2 = await store.put("LEASE", b"renewed", Update(v1))

    with pytest.raises(PreconditionFailed):
        await store.delete("LEASE", if_match=v1)
    assert (await store.get("LEASE")).data == b"renewed"

    await store.delete("LEASE", if_match=v2)
    with pytest.raises(NotFound):
        await store.head("LEASE")


async def test_conditional_delete_of_a_missing_key_is_refused(store: ObjectStore) -> None:
    with pytest.raises((NotFound, PreconditionFailed)):
        await store.delete("LEASE", if_match=MADE_UP)


# --- listing -------------------------------------------------------------------------------


async def test_list_gives_relative_keys_in_byte_order_with_size_and_version(
    store: ObjectStore,
) -> None:
    keys = ["data/ab/1", "data/ab-2", "data/a/3", "data/b", "LATEST", "manifests/x", "datum"]
    versions = {key: await store.put(key, key.encode() * 2) for key in keys}

    everything = await listed(store)

    assert sorted(i.key for i in everything) == sorted(keys)
    assert in_listing_order([i.key for i in everything])
    for info in everything:
        assert info.size == 2 * len(info.key)
        assert info.version.etag == versions[info.key].etag
        assert info.last_modified is not None


LIST_PREFIXES = [
    ("", {"LATEST", "data/a/3", "data/ab-2", "data/ab/1", "data/b", "datum"}),
    ("data/", {"data/a/3", "data/ab-2", "data/ab/1", "data/b"}),
    ("data/a", {"data/a/3", "data/ab-2", "data/ab/1"}),  # a string prefix, not a directory
    ("data/ab/", {"data/ab/1"}),
    ("data/ab/1", {"data/ab/1"}),
    ("dat", {"data/a/3", "data/ab-2", "data/ab/1", "data/b", "datum"}),
    ("nothing/", set()),
    ("data/ab/1/", set()),
]


async def test_list_filters_by_a_plain_string_prefix(store: ObjectStore) -> None:
    for key in ["data/ab/1", "data/ab-2", "data/a/3", "data/b", "LATEST", "datum"]:
        await store.put(key, b"x")
    for prefix, expected in LIST_PREFIXES:
        keys = [i.key for i in await listed(store, prefix)]
        assert set(keys) == expected, prefix
        assert len(keys) == len(expected), prefix
        assert in_listing_order(keys), prefix


async def test_list_of_an_empty_store_is_empty(store: ObjectStore) -> None:
    assert await listed(store) == []


async def test_deleted_keys_leave_the_listing(store: ObjectStore) -> None:
    await store.put("data/x/1", b"1")
    await store.put("data/x/2", b"2")
    await store.delete("data/x/1")

    assert [i.key for i in await listed(store, "data/")] == ["data/x/2"]


# --- best-effort clients and services that ignore preconditions ---------------------------


async def test_a_best_effort_client_refuses_conditional_writes_without_sending(
    any_store_url: str,
) -> None:
    async with open_store(any_store_url, conditional=False) as best_effort:
        assert best_effort.conditional is False
        with pytest.raises(ConditionalWritesUnsupported) as refused:
            await best_effort.put("LEASE", b"x", CREATE)
        assert "MUSHROOM_BACKUP_LEASE_CONDITIONAL=off" in refused.value.message
        with pytest.raises(ConditionalWritesUnsupported):
            await best_effort.put("LEASE", b"x", Update(MADE_UP))
        with pytest.raises(NotFound):
            await best_effort.get("LEASE")

        version = await best_effort.put("LEASE", b"read, then write", OVERWRITE)
        assert (await best_effort.get("LEASE")).version == version


async def test_a_service_that_ignores_preconditions_lets_every_write_through(
    store: ObjectStore,
) -> None:
    faulty = FaultyStore(store)
    faulty.ignore_preconditions = True
    await faulty.put("LEASE", b"holder A", CREATE)

    await faulty.put("LEASE", b"holder B", CREATE)  # If-None-Match ignored
    assert (await store.get("LEASE")).data == b"holder B"

    await faulty.put("LEASE", b"holder C", Update(MADE_UP))  # If-Match ignored
    assert (await store.get("LEASE")).data == b"holder C"

    await faulty.delete("LEASE", if_match=MADE_UP)
    with pytest.raises(NotFound):
        await store.get("LEASE")
    assert faulty.calls == [
        ("put", "LEASE"),
        ("put", "LEASE"),
        ("put", "LEASE"),
        ("delete", "LEASE"),
    ]


async def test_faults_injected_over_each_backend_surface_as_retryable_store_errors(
    store: ObjectStore,
) -> None:
    faulty = FaultyStore(store)
    faulty.lose_answer("put", key="data/c1")

    with pytest.raises(StoreError) as lost:
        await faulty.put("data/c1", b"chunk", CREATE)
    assert lost.value.retryable
    # The write landed: a retry of the create-only write is answered, not applied twice.
    with pytest.raises(AlreadyExists):
        await faulty.put("data/c1", b"chunk", CREATE)
    assert (await store.get("data/c1")).data == b"chunk"


# --- lifetime ------------------------------------------------------------------------------


async def test_close_is_idempotent_and_the_url_is_safe_to_log(any_store_url: str) -> None:
    store = open_store(any_store_url)
    await store.put("k", b"v")
    await store.close()
    await store.close()

    assert store.url.split("://")[0] in ("memory", "file", "s3")
    assert "secret" not in store.url
