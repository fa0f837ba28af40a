"""``backup now``, ``snapshots`` and ``restore`` through the real command line, end to end on a
local directory and on SeaweedFS, with ``--json`` output parsed; and the documented exit codes:
2 for a missing source (nothing is touched), 3 for a lease held by another instance (naming it),
5 for a corrupted pack at restore (naming the object)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from mushroom_backup.cli.main import cli
from mushroom_backup.errors import EXIT_INTEGRITY, EXIT_LEASE_HELD, EXIT_USAGE
from mushroom_backup.lease.bucket import BucketLease
from mushroom_backup.snapshot.pack import DATA_PREFIX
from mushroom_backup.store import OVERWRITE, open_store

HOLDER = "d" * 32


@pytest.fixture(params=["local", pytest.param("seaweed", marks=pytest.mark.s3)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return (tmp_path / "store").as_uri()
    return str(request.getfixturevalue("seaweed_url"))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    (root / "base" / "16384").mkdir(parents=True)
    (root / "PG_VERSION").write_text("16\n")
    (root / "base" / "16384" / "16400").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    (root / "base" / "16384" / "16401").write_bytes(b"row\n" * 10_000)
    (root / "postgresql.conf").write_text("shared_buffers = 128MB\n")
    return root


def mb(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_backup_list_and_restore_round_trip(url: str, source: Path, tmp_path: Path) -> None:
    first = ok_json(mb("backup", "now", "--store", url, "--source", str(source), "--json"))
    assert first["parent_id"] is None
    assert first["files"] == 4
    assert first["new_packs"] >= 1
    original = tree(source)

    (source / "postgresql.conf").write_text("shared_buffers = 1GB\n")
    second = ok_json(mb("backup", "now", "--store", url, "--source", str(source), "--json"))
    assert second["parent_id"] == first["snapshot_id"]
    assert second["files_reused"] == 3  # unchanged files are not read again
    assert second["files_read"] == 1

    listed = ok_json(mb("snapshots", "--store", url, "--json"))
    assert [s["id"] for s in listed] == [first["snapshot_id"], second["snapshot_id"]]
    assert [s["latest"] for s in listed] == [False, True]
    assert {s["exclusion"] for s in listed} == {"conditional"}
    assert all(s["files"] == 4 and s["writer_instance"] for s in listed)

    restored = ok_json(
        mb("restore", "latest", "--store", url, "--target", str(tmp_path / "t1"), "--json")
    )
    assert restored["snapshot_id"] == second["snapshot_id"]
    assert restored["files"] == 4
    assert tree(tmp_path / "t1") == tree(source)
    older = ok_json(
        mb(
            "restore",
            first["snapshot_id"],
            "--store",
            url,
            "--target",
            str(tmp_path / "t2"),
            "--json",
        )
    )
    assert older["snapshot_id"] == first["snapshot_id"]
    assert tree(tmp_path / "t2") == original
    checked = ok_json(mb("restore", "latest", "--store", url, "--verify-only", "--json"))
    assert checked["verify_only"] is True
    assert ok_json(mb("lease", "status", "--store", url, "--json"))["present"] is False


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_missing_source_is_a_usage_error_and_touches_nothing(
    url: str, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "no-such-dir"
    if kind == "a file":
        path.write_text("not a directory")
    result = mb("backup", "now", "--store", url, "--source", str(path))
    assert result.exit_code == EXIT_USAGE, result.output + result.stderr
    assert str(path) in result.stderr
    assert ok_json(mb("lease", "status", "--store", url, "--json"))["present"] is False
    assert ok_json(mb("snapshots", "--store", url, "--json")) == []


def test_a_held_lease_exits_3_naming_the_holder(url: str, source: Path) -> None:
    async def hold() -> None:
        async with open_store(url) as store:
            await BucketLease.acquire(
                store, ttl_s=60, instance_id=HOLDER, host="db7.example", pid=4321
            )

    asyncio.run(hold())
    result = mb("backup", "now", "--store", url, "--source", str(source), "--wait-lease", "1")
    assert result.exit_code == EXIT_LEASE_HELD, result.output + result.stderr
    assert f"held by another instance ({HOLDER} on host db7.example)" in result.stderr
    assert "--wait-lease SECONDS" in result.stderr
    assert socket.gethostname() != "db7.example"
    assert ok_json(mb("snapshots", "--store", url, "--json")) == []
    assert ok_json(mb("lease", "status", "--store", url, "--json"))["holder"] == HOLDER


def test_a_corrupted_pack_fails_restore_with_exit_5(url: str, source: Path, tmp_path: Path) -> None:
    ok_json(mb("backup", "now", "--store", url, "--source", str(source), "--json"))

    async def corrupt() -> str:
        async with open_store(url) as store:
            packs = [info.key async for info in store.list(DATA_PREFIX)]
            assert packs
            key = max(packs, key=len)
            stored = await store.get(key)
            data = bytearray(stored.data)
            middle = len(data) // 2
            data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
            await store.put(key, bytes(data), OVERWRITE)
            return key

    key = asyncio.run(corrupt())
    target = tmp_path / "target"
    result = mb("restore", "latest", "--store", url, "--target", str(target))
    assert result.exit_code == EXIT_INTEGRITY, result.output + result.stderr
    assert f"from pack {key}" in result.stderr  # names the object
    assert "restoring '" in result.stderr  # and the file it belongs to
    verify = mb("restore", "latest", "--store", url, "--verify-only")
    assert verify.exit_code == EXIT_INTEGRITY, verify.output + verify.stderr
    # Nothing half-written under a final name: every restored file is whole.
    originals = tree(source)
    restored = tree(target) if target.exists() else {}
    for name, data in restored.items():
        assert data == originals.get(name), f"{name} was left half-written"


def test_run_with_a_missing_source_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted-yet"
    result = mb("run", "--store", (tmp_path / "store").as_uri(), "--source", str(missing))
    assert result.exit_code == EXIT_USAGE, result.output + result.stderr
    assert f"the source {missing} does not exist" in result.stderr
    assert not (tmp_path / "store").exists()  # it never started
