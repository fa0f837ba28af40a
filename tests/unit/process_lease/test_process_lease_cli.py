"""``mushroom-backup node status|fence|verify`` against a named memory store (shared by every
``memory://NAME`` client in the process). ``node fence`` really waits one TTL, so these tests
use a 50 ms TTL; "exit 3 when the incarnation renews" needs a live renewer in another process
and is in tests/integration/test_process_lease.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from uuid import UUID

import pytest
from click.testing import CliRunner, Result

from mushroom_backup.cli.main import cli
from mushroom_backup.lease.process.record import (
    ProcessLease,
    ProcessLeaseFence,
    fence_key,
    lease_key,
    successor_fence_key,
)
from mushroom_backup.store.memory import MemoryStore

NODE = 5
A = UUID("aaaaaaaa-0000-4000-8000-000000000001")
B = UUID("bbbbbbbb-0000-4000-8000-000000000002")
EXPIRES = 1_796_000_000_000


@pytest.fixture
def root() -> str:
    return f"memory://node-cli-{uuid.uuid4()}"


def write(root: str, *records: ProcessLease, fences: tuple[ProcessLeaseFence, ...] = ()) -> None:
    async def go() -> None:
        store = MemoryStore(root.removeprefix("memory://"))
        for record in records:
            await store.put(lease_key(record.node, record.seq), record.encode())
        for fence in fences:
            await store.put(fence_key(fence.node, fence.predecessor.owner), fence.encode())
            await store.put(
                successor_fence_key(fence.node, fence.successor.owner, fence.successor.term),
                fence.encode(),
            )

    asyncio.run(go())


def invoke(*args: str, root: str | None = None, stdin: bytes | None = None) -> Result:
    extra = ["--root", root] if root else []
    return CliRunner().invoke(cli, [*args, *extra], input=stdin, catch_exceptions=False)


def test_status_of_a_node_never_acquired(root: str) -> None:
    result = invoke("node", "status", "--node", "9", root=root)
    assert result.exit_code == 0, result.output
    assert "node 9: no process lease" in result.output


def test_status_json_shows_head_term_expiry_history_and_fences(root: str) -> None:
    history = [ProcessLease(NODE, A, 1, s, EXPIRES) for s in (1, 2, 3)]
    head = ProcessLease(NODE, B, 2, 4, EXPIRES)
    write(root, *history, head, fences=(ProcessLeaseFence(history[-1], head),))
    result = invoke("node", "status", "--node", str(NODE), "--json", root=root)
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["head"] == head.as_json()
    assert (info["term"], info["owner"]) == (2, str(B))
    assert (info["history_length"], info["oldest_seq"]) == (4, 1)
    assert isinstance(info["expires_in_s"], float)
    assert info["fences"] == [ProcessLeaseFence(history[-1], head).as_json()]
    human = invoke("node", "status", "--node", str(NODE), root=root)
    assert f"term 2 at seq 4: {A} -> {B}" in human.output


def test_fence_prints_a_certificate_that_verify_confirms(root: str, tmp_path: Path) -> None:
    write(root, ProcessLease(NODE, A, 1, 1, EXPIRES))
    common = ["--node", str(NODE), "--ttl", "0.05"]
    result = invoke("node", "fence", *common, "--incarnation", str(A), root=root)
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().encode()
    certificate = ProcessLeaseFence.decode(line)
    assert certificate.predecessor == ProcessLease(NODE, A, 1, 1, EXPIRES)
    assert (certificate.successor.term, certificate.successor.seq) == (2, 2)

    again = invoke("node", "fence", *common, "--incarnation", str(A), root=root)
    assert again.stdout.strip().encode() == line  # rebuilt, not fenced twice

    old = invoke("node", "verify", *common, "--incarnation", str(A), root=root)
    assert (old.exit_code, old.stdout.strip()) == (1, "not current")
    revoker = str(certificate.successor.owner)
    new = invoke("node", "verify", *common, "--incarnation", revoker, "--term", "2", root=root)
    assert (new.exit_code, new.stdout.strip()) == (0, "current")
    wrong_term = invoke(
        "node", "verify", *common, "--incarnation", revoker, "--term", "1", root=root
    )
    assert wrong_term.exit_code == 1

    path = tmp_path / "fence.json"
    path.write_bytes(line + b"\n")
    held = invoke("node", "verify", *common, "--fence", str(path), root=root)
    assert (held.exit_code, held.stdout.strip()) == (0, "fence holds")
    piped = invoke("node", "verify", *common, "--fence", "-", root=root, stdin=line)
    assert piped.exit_code == 0


def test_fencing_a_node_without_history_fails(root: str) -> None:
    result = invoke("node", "fence", "--node", "8", "--incarnation", str(A), root=root)
    assert result.exit_code == 1
    assert "history of node 8 is missing" in result.stderr


def test_the_root_comes_from_the_flag_or_the_environment(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = invoke("node", "status", "--node", "1")
    assert missing.exit_code == 2
    assert "--root URL" in missing.stderr
    assert "MUSHROOM_BACKUP_CLUSTER_ROOT" in missing.stderr
    monkeypatch.setenv("MUSHROOM_BACKUP_CLUSTER_ROOT", root)
    assert invoke("node", "status", "--node", "1").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["node", "status", "--node", "0"],
        ["node", "status", "--node", "1", "--ttl", "0.0005"],
        ["node", "status", "--node", "1", "--ttl", "7200"],
        ["node", "fence", "--node", "1", "--incarnation", str(A).upper()],
        ["node", "fence", "--node", "1", "--incarnation", str(A), "--io-budget", "0"],
        ["node", "verify", "--node", "1"],
        ["node", "verify", "--node", "1", "--incarnation", str(A), "--fence", "-"],
    ],
)
def test_bad_arguments_are_usage_errors(root: str, args: list[str]) -> None:
    result = invoke(*args, root=root, stdin=b"{}")
    assert result.exit_code == 2, result.output


def test_a_certificate_for_another_node_is_a_usage_error(root: str) -> None:
    fence = ProcessLeaseFence(
        ProcessLease(NODE, A, 1, 1, EXPIRES), ProcessLease(NODE, B, 2, 2, EXPIRES)
    )
    result = invoke(
        "node", "verify", "--node", "6", "--fence", "-", root=root, stdin=fence.encode()
    )
    assert result.exit_code == 2
    assert "for node 5" in result.stderr
