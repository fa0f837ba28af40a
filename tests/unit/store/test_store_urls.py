"""Store URLs: what each good URL opens, and a clear UsageError for every bad one."""

from __future__ import annotations

import pytest

from mushroom_backup.errors import EXIT_USAGE, UsageError
from mushroom_backup.store import open_store, parse_store_url
from mushroom_backup.store.local import LocalStore
from mushroom_backup.store.memory import MemoryStore
from mushroom_backup.store.s3 import S3Store

GOOD = [
    # (url, (scheme, location, prefix))
    ("s3://backups/prod/db1", ("s3", "backups", "prod/db1")),
    ("s3://backups/prod/db1/", ("s3", "backups", "prod/db1")),
    ("S3://backups/prod", ("s3", "backups", "prod")),
    ("s3://backups", ("s3", "backups", "")),
    ("s3://backups/", ("s3", "backups", "")),
    ("s3://my.bucket-2_x/p%20q", ("s3", "my.bucket-2_x", "p q")),
    ("  s3://backups/p  ", ("s3", "backups", "p")),
    ("file:///srv/backups", ("file", "/srv/backups", "")),
    ("file:///srv/backups/", ("file", "/srv/backups", "")),
    ("file://localhost/srv/backups", ("file", "/srv/backups", "")),
    ("file:///srv/with%20space", ("file", "/srv/with space", "")),
    ("memory://shared", ("memory", "shared", "")),
    ("memory://", ("memory", "", "")),
]


@pytest.mark.parametrize(("url", "expected"), GOOD)
def test_good_urls_parse(url: str, expected: tuple[str, str, str]) -> None:
    assert parse_store_url(url) == expected


BAD = [
    # (url, words the message must contain)
    ("", "no store URL given"),
    ("   ", "no store URL given"),
    ("s3://", "names no valid bucket"),
    ("s3:///prefix", "names no valid bucket"),
    ("s3://bucket:9000/p", "names no valid bucket"),
    ("s3://my bucket/p", "names no valid bucket"),
    ("s3://key:secret@bucket/p", "must not carry credentials"),
    ("s3://bucket/a//b", "empty, '.' or '..' path segment"),
    ("s3://bucket/a/../b", "empty, '.' or '..' path segment"),
    ("s3://bucket/./b", "empty, '.' or '..' path segment"),
    ("s3://bucket/p?versionId=1", "must not have a query or fragment"),
    ("s3://bucket/p#frag", "must not have a query or fragment"),
    ("s3://[bucket/p", "cannot be parsed"),
    ("file://relative/path", "names a host"),
    ("file:relative/path", "needs an absolute path"),
    ("/srv/backups", "write it as file:///srv/backups"),
    ("srv/backups", "unsupported store URL"),
    ("gs://bucket/p", "unsupported store URL"),
    ("https://s3.amazonaws.com/bucket", "unsupported store URL"),
]


@pytest.mark.parametrize(("url", "words"), BAD)
def test_bad_urls_are_usage_errors_that_say_what_is_wrong(url: str, words: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_store_url(url)

    assert words in refused.value.message
    assert refused.value.exit_code == EXIT_USAGE
    assert "secret" not in refused.value.message


def test_open_store_builds_the_backend_the_url_names() -> None:
    s3 = open_store("s3://backups/prod/db1")
    local = open_store("file:///srv/backups")
    memory = open_store("memory://shared")

    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.url) == ("backups", "prod/db1", "s3://backups/prod/db1")
    assert isinstance(local, LocalStore)
    assert (str(local.root), local.url) == ("/srv/backups", "file:///srv/backups")
    assert isinstance(memory, MemoryStore)
    assert memory.url == "memory://shared"


@pytest.mark.parametrize("url", ["s3://b/p", "file:///srv/b", "memory://x"])
@pytest.mark.parametrize("conditional", [True, False])
def test_open_store_passes_the_conditional_switch(url: str, conditional: bool) -> None:
    assert open_store(url, conditional=conditional).conditional is conditional


def test_opening_an_s3_store_touches_no_network_until_first_use() -> None:
    store = open_store("s3://backups/p")
    assert isinstance(store, S3Store)
    assert store._client is None
