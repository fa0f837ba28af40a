"""`mushroom-backup lease status|release` through the real CLI on a local store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from mushroom_backup.cli.main import cli
from mushroom_backup.lease.bucket import LEASE_KEY, BucketLease
from mushroom_backup.store import OVERWRITE, open_store


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


async def hold(url: str) -> BucketLease:
    store = open_store(url)
    return await BucketLease.acquire(store, ttl_s=30, instance_id="a" * 32)


def test_status_without_a_lease(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    code, out, _ = invoke("lease", "status", "--store", url)
    assert code == 0
    assert "no lease" in out
    code, out, _ = invoke("lease", "status", "--store", url, "--json")
    assert json.loads(out) == {"store": url, "present": False}


def test_status_shows_the_holder(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    asyncio.run(hold(url))
    code, out, _ = invoke("lease", "status", "--store", url)
    assert code == 0
    assert "a" * 32 in out
    assert "fresh" in out
    code, out, _ = invoke("lease", "status", "--store", url, "--json")
    body = json.loads(out)
    assert body["holder"] == "a" * 32
    assert body["condition"] == "fresh"
    assert body["ttl_s"] == 30


def test_status_of_a_hand_edited_lease_says_what_is_wrong(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"

    async def garbage() -> None:
        async with open_store(url) as store:
            await store.put(LEASE_KEY, b"{not json", OVERWRITE)

    asyncio.run(garbage())
    code, out, _ = invoke("lease", "status", "--store", url)
    assert code == 0
    assert "unparseable" in out
    assert "takes it over" in out


def test_release_needs_force(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    asyncio.run(hold(url))
    code, _, err = invoke("lease", "release", "--store", url)
    assert code == 2
    assert "--force" in err
    code, out, _ = invoke("lease", "status", "--store", url, "--json")
    assert json.loads(out)["present"] is True


def test_release_removes_the_lease_and_the_holder_learns_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    lease = asyncio.run(hold(url))
    code, out, err = invoke("lease", "release", "--store", url, "--force")
    assert code == 0, err
    assert "removed the lease of " + "a" * 32 in out
    assert "warning" in err
    code, out, _ = invoke("lease", "status", "--store", url, "--json")
    assert json.loads(out)["present"] is False

    async def renew() -> bool:
        try:
            await lease.renew()
        except Exception:
            return lease.lost
        return False

    assert asyncio.run(renew()) is True


def test_release_with_no_lease_is_harmless(tmp_path: Path) -> None:
    code, out, _ = invoke("lease", "release", "--store", f"file://{tmp_path}/s", "--force")
    assert code == 0
    assert "nothing to release" in out


def test_a_bad_store_url_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = invoke("lease", "status", "--store", "ftp://nope")
    assert code == 2
    assert "s3://BUCKET/PREFIX" in err


def test_no_store_at_all_says_how_to_give_one() -> None:
    code, _, err = invoke("lease", "status")
    assert code == 2
    assert "MUSHROOM_BACKUP_STORE" in err
