"""What only an S3 store can show, on moto's server and on SeaweedFS: where keys land in the
bucket, listing across ListObjectsV2 pages, prefixes kept apart, errors from a real service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from mushroom_backup.errors import StoreError
from mushroom_backup.store import CREATE, ObjectStore, open_store
from mushroom_backup.store.s3 import S3Store

if TYPE_CHECKING:  # see tests/conftest.py
    from tests.servers import S3Server
else:
    from servers import S3Server


def bucket_of(url: str) -> str:
    return urlsplit(url).netloc


@pytest.fixture
async def s3_store(s3_url: str) -> AsyncIterator[ObjectStore]:
    async with open_store(s3_url) as opened:
        assert isinstance(opened, S3Store)
        yield opened


async def test_keys_land_under_the_prefix_and_list_back_relative(
    s3_url: str, s3_store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    server: S3Server = request.getfixturevalue(f"{request.node.callspec.params['s3_url']}_server")
    await s3_store.put("LEASE", b"lease", CREATE)
    await s3_store.put("data/ab/cdef", b"chunk", CREATE)

    answer = server.client().list_objects_v2(Bucket=bucket_of(s3_url))
    in_bucket = sorted(entry["Key"] for entry in answer["Contents"])

    assert in_bucket == ["backups/db1/LEASE", "backups/db1/data/ab/cdef"]
    assert sorted([i.key async for i in s3_store.list()]) == ["LEASE", "data/ab/cdef"]


async def test_stores_on_different_prefixes_of_one_bucket_do_not_see_each_other(
    s3_url: str,
) -> None:
    bucket = bucket_of(s3_url)
    async with (
        open_store(f"s3://{bucket}/prod/db1") as db1,
        open_store(f"s3://{bucket}/prod/db10") as db10,
        open_store(f"s3://{bucket}") as whole,
    ):
        await db1.put("LATEST", b"1")
        await db10.put("LATEST", b"10")

        assert [i.key async for i in db1.list()] == ["LATEST"]
        assert [i.key async for i in db10.list()] == ["LATEST"]
        assert (await db1.get("LATEST")).data == b"1"
        assert sorted([i.key async for i in whole.list()]) == [
            "prod/db1/LATEST",
            "prod/db10/LATEST",
        ]


async def put_many(store: ObjectStore, keys: list[str]) -> None:
    gate = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with gate:
            await store.put(key, key.encode())

    await asyncio.gather(*(put(key) for key in keys))


async def test_listing_follows_continuation_pages(s3_url: str) -> None:
    url = urlsplit(s3_url)
    keys = [f"data/{n:03d}" for n in range(25)]
    async with S3Store(url.netloc, url.path, list_page_size=7) as store:
        await put_many(store, keys)
        await store.put("manifests/m", b"m")

        listed = [info async for info in store.list("data/")]

    assert [i.key for i in listed] == keys
    assert all(i.size == len(i.key) for i in listed)


async def test_listing_crosses_the_service_s_1000_key_page_boundary(seaweed_url: str) -> None:
    # The real page size of a real service, once (each request costs the client ~4 ms).
    keys = [f"data/{n:05d}" for n in range(1001)]
    async with open_store(seaweed_url) as store:
        await put_many(store, keys)
        listed = [info.key async for info in store.list("data/")]

    assert listed == keys


async def test_a_missing_bucket_is_a_clear_permanent_error(s3_url: str) -> None:
    async with open_store("s3://test-no-such-bucket-here/p") as store:
        with pytest.raises(StoreError) as failed:
            await store.put("LEASE", b"x")

    assert not failed.value.retryable
    assert "S3 put of 'LEASE' failed: HTTP 404 NoSuchBucket" in failed.value.message
    assert "check the store URL" in failed.value.message


async def test_an_unreachable_endpoint_is_retryable_and_names_no_secret(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Port 9 on 127.0.0.1 (discard) is closed here: the connection is refused at once.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-K7MDENG-EXAMPLEKEY")
    async with open_store(s3_url) as store:
        with pytest.raises(StoreError) as failed:
            await store.get("LEASE")

    assert failed.value.retryable
    assert "S3 get of 'LEASE' failed: EndpointConnectionError" in failed.value.message
    assert "EXAMPLEKEY" not in failed.value.message
