"""``forget``, ``prune`` and ``check`` through the real command line on a local store: options,
the policy from the config, exit codes, human and JSON output."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from mushroom_backup.cli.main import cli
from mushroom_backup.clock import SYSTEM_CLOCK
from mushroom_backup.errors import StoreError
from mushroom_backup.lease.bucket import BucketLease
from mushroom_backup.snapshot import take_snapshot
from mushroom_backup.store import open_store
from mushroom_backup.store.faults import FaultyStore

if TYPE_CHECKING:
    from tests.unit.retention.retention_support import (
        OPTIONS,
        WRITER,
        base_files,
        content,
        write_tree,
    )
else:
    from retention_support import OPTIONS, WRITER, base_files, content, write_tree


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


class Repo:
    """A local store with snapshots taken through the API (fast), inspected through the CLI."""

    def __init__(self, root: Path) -> None:
        self.root = root / "store"
        self.url = self.root.as_uri()
        self.source = root / "source"
        write_tree(self.source, base_files())
        self.version = 0

    def snapshot(self) -> str:
        self.version += 1
        write_tree(self.source, {"base/1/1259": content(30_000, f"v{self.version}")})

        async def go() -> str:
            async with open_store(self.url) as store:
                result = await take_snapshot(
                    store, self.source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
                )
                return result.snapshot_id

        return asyncio.run(go())

    def orphans(self, age_s: float) -> list[Path]:
        """Packs of an abandoned snapshot, backdated by ``age_s`` seconds."""
        self.version += 1
        write_tree(self.source, {"base/1/1259": content(30_000, f"v{self.version}")})
        before = set(self.packs())

        async def go() -> None:
            async with open_store(self.url) as store:
                faulty = FaultyStore(store)
                faulty.fail(
                    "put",
                    key=lambda k: k.startswith("manifests/"),
                    error=lambda k: StoreError("403 AccessDenied", key=k),
                )
                with pytest.raises(StoreError):
                    await take_snapshot(
                        faulty, self.source, options=OPTIONS, writer=WRITER, clock=SYSTEM_CLOCK
                    )

        asyncio.run(go())
        new = [p for p in self.packs() if p not in before]
        stamp = time.time() - age_s
        for path in new:
            os.utime(path, (stamp, stamp))
        return new

    def packs(self) -> list[Path]:
        return sorted(p for p in (self.root / "data").rglob("*") if p.is_file())

    def manifests(self) -> list[str]:
        return sorted(p.name for p in (self.root / "manifests").iterdir())


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


# --- forget ------------------------------------------------------------------------------------


def test_forget_without_a_policy_refuses(repo: Repo) -> None:
    repo.snapshot()
    code, _, err = invoke("forget", "--store", repo.url)
    assert code == 2
    assert "--keep-last" in err
    assert len(repo.manifests()) == 1


def test_forget_dry_run_json_shows_decisions_and_reasons(repo: Repo) -> None:
    ids = [repo.snapshot() for _ in range(3)]
    code, out, err = invoke(
        "forget", "--store", repo.url, "--keep-last", "1", "--dry-run", "--json"
    )
    assert code == 0, err
    body = json.loads(out)
    assert body["dry_run"] is True
    assert body["latest"] == ids[-1]
    assert [(s["id"], s["keep"], s["reasons"]) for s in body["snapshots"]] == [
        (ids[0], False, []),
        (ids[1], False, []),
        (ids[2], True, ["last", "latest"]),
    ]
    assert body["forgotten"] == ids[:2]
    assert body["deleted"] == []
    assert repo.manifests() == ids


def test_forget_deletes_and_prints_a_table(repo: Repo) -> None:
    ids = [repo.snapshot() for _ in range(3)]
    code, out, err = invoke("forget", "--store", repo.url, "--keep-last", "2")
    assert code == 0, err
    assert "policy: keep last 2" in out
    assert f"{ids[0]}  " in out
    assert "forget" in out
    assert "forgot 1 snapshot(s), kept 2" in out
    assert repo.manifests() == ids[1:]
    assert not (repo.root / "LEASE").exists()  # the lease was released


def test_forget_takes_its_policy_from_the_config(repo: Repo, tmp_path: Path) -> None:
    ids = [repo.snapshot() for _ in range(3)]
    config = tmp_path / "config.toml"
    config.write_text("[retention]\nkeep_last = 1\n")
    code, out, err = invoke("--config", str(config), "forget", "--store", repo.url, "--json")
    assert code == 0, err
    assert json.loads(out)["deleted"] == ids[:2]
    assert repo.manifests() == ids[2:]


def test_forget_and_prune_exit_3_while_the_lease_is_held(repo: Repo) -> None:
    repo.snapshot()

    async def hold() -> None:
        async with open_store(repo.url) as store:
            await BucketLease.acquire(store, ttl_s=30, instance_id="c" * 32)

    asyncio.run(hold())
    code, _, err = invoke("forget", "--store", repo.url, "--keep-last", "1")
    assert code == 3
    assert "c" * 32 in err
    code, _, err = invoke("prune", "--store", repo.url)
    assert code == 3
    # a dry run takes no lease, so it still answers
    code, _, err = invoke("prune", "--store", repo.url, "--dry-run")
    assert code == 0, err


def test_forget_keep_within_parses_durations(repo: Repo) -> None:
    ids = [repo.snapshot() for _ in range(2)]
    code, out, err = invoke(
        "forget", "--store", repo.url, "--keep-within", "1h", "--dry-run", "--json"
    )
    assert code == 0, err
    body = json.loads(out)
    assert body["policy"]["keep_within_s"] == 3600
    assert all(s["keep"] for s in body["snapshots"])
    assert body["forgotten"] == []
    assert repo.manifests() == ids
    code, _, err = invoke("forget", "--store", repo.url, "--keep-within", "soon")
    assert code == 2
    assert "not a duration" in err


# --- prune -------------------------------------------------------------------------------------


def test_prune_deletes_old_orphans_and_reports_space(repo: Repo) -> None:
    repo.snapshot()
    old = repo.orphans(age_s=48 * 3600)
    young = repo.orphans(age_s=0)
    code, out, err = invoke("prune", "--store", repo.url, "--dry-run", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["deleted_packs"] == len(old)
    assert all(p.exists() for p in old)

    code, out, err = invoke("prune", "--store", repo.url)
    assert code == 0, err
    assert f"deleted             {len(old)} unused pack" in out
    assert "reclaimed" in out
    assert not any(p.exists() for p in old)
    assert all(p.exists() for p in young)
    code, _, _ = invoke("check", "--store", repo.url, "--read-data")
    assert code == 0


def test_prune_refuses_a_grace_period_within_the_lease_ttl(repo: Repo) -> None:
    repo.snapshot()
    code, _, err = invoke("prune", "--store", repo.url, "--grace", "20s")
    assert code == 2
    assert "must exceed the lease TTL (30s)" in err
    code, _, err = invoke("prune", "--store", repo.url, "--grace", "31s", "--dry-run")
    assert code == 0, err


def test_forget_with_prune_does_both_under_one_lease(repo: Repo) -> None:
    ids = [repo.snapshot() for _ in range(3)]
    # backdate everything so that the forgotten snapshots' packs are past the grace period
    stamp = time.time() - 48 * 3600
    for path in repo.packs():
        os.utime(path, (stamp, stamp))
    before = len(repo.packs())
    code, out, err = invoke("forget", "--store", repo.url, "--keep-last", "1", "--prune", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["deleted"] == ids[:2]
    assert body["prune"]["deleted_packs"] > 0
    assert len(repo.packs()) == before - body["prune"]["deleted_packs"]
    code, _, err = invoke("check", "--store", repo.url, "--read-data")
    assert code == 0, err


# --- check -------------------------------------------------------------------------------------


def test_check_clean_exits_0(repo: Repo) -> None:
    repo.snapshot()
    repo.orphans(age_s=0)
    code, out, err = invoke("check", "--store", repo.url)
    assert code == 0, err
    assert "no problems found" in out
    assert "reclaimable: " in out
    code, out, err = invoke("check", "--store", repo.url, "--read-data-subset", "50", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["clean"] is True
    assert body["subset"]["windows"] == 2
    assert body["reclaimable"]["packs"] > 0


def test_check_names_the_files_of_a_deleted_pack_and_exits_5(repo: Repo) -> None:
    snapshot_id = repo.snapshot()
    victim = repo.packs()[0]
    victim.unlink()
    code, out, err = invoke("check", "--store", repo.url)
    assert code == 5
    problem_lines = [line for line in out.splitlines() if line.startswith("snapshot ")]
    assert problem_lines
    assert all(f"snapshot {snapshot_id} file '" in line for line in problem_lines)
    assert all(victim.name in line for line in problem_lines)
    assert "check found 1 problem(s) affecting 1 snapshot(s)" in err
    code, out, _ = invoke("check", "--store", repo.url, "--json")
    assert code == 5
    body = json.loads(out)
    assert body["clean"] is False
    assert body["problems"][0]["kind"] == "pack-missing"
    assert {a["snapshot"] for a in body["problems"][0]["affected"]} == {snapshot_id}


def test_check_refuses_two_read_modes(repo: Repo) -> None:
    code, _, err = invoke("check", "--store", repo.url, "--read-data", "--read-data-subset", "10")
    assert code == 2
    assert "either --read-data or --read-data-subset" in err


def test_forget_by_id_removes_a_damaged_snapshot_so_prune_can_run(repo: Repo) -> None:
    ids = [repo.snapshot() for _ in range(2)]
    (repo.root / "manifests" / ids[0]).write_bytes(
        b"mushroom-backup object v1 " + b"0" * 32 + b"\n!"
    )
    code, _, err = invoke("prune", "--store", repo.url)
    assert code == 5
    assert f"forget {ids[0]}" in err
    code, _, err = invoke("forget", "--store", repo.url, "--keep-last", "5")
    assert code == 5
    assert "forget SNAPSHOT_ID" in err
    code, out, err = invoke("forget", ids[0], "--store", repo.url)
    assert code == 0, err
    assert out.strip() == f"forgot {ids[0]}"
    assert repo.manifests() == ids[1:]
    code, _, err = invoke("prune", "--store", repo.url)
    assert code == 0, err


def test_forget_by_id_refuses_latest_unknown_ids_and_mixing_with_a_policy(repo: Repo) -> None:
    ids = [repo.snapshot() for _ in range(2)]
    for args, message in [
        ((ids[1],), "is the one LATEST names"),
        ((ids[0], ids[1]), "is the one LATEST names"),
        (("20200101T000000.000Z-00000000",), "there is no snapshot"),
        (("latest",), "not a snapshot id"),
        ((ids[0], "--keep-last", "1"), "either snapshot ids or --keep-* options"),
    ]:
        code, _, err = invoke("forget", *args, "--store", repo.url)
        assert code == 2, err
        assert message in err
    assert repo.manifests() == ids  # nothing was deleted by any of them
    code, out, err = invoke("forget", ids[0], "--store", repo.url, "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out) == {"dry_run": True, "forgotten": [ids[0]], "deleted": []}
    assert repo.manifests() == ids
