"""Shared fixtures. The AWS environment is isolated for every test so that a developer's
~/.aws or AWS_* variables cannot change what the tests assert."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

_AWS_VARS = [v for v in os.environ if v.startswith(("AWS_", "MUSHROOM_BACKUP_", "MUSHROOMDB_"))]


@pytest.fixture(autouse=True)
def _isolated_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    for name in _AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
