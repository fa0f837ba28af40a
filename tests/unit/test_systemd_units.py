"""The systemd units pass `systemd-analyze verify` and carry the directives the README promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).parents[2] / "systemd"


def directives(name: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def test_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/test.sh installs the systemd package"
    binary = Path(sys.executable).with_name("mushroom-backup")
    assert binary.exists()
    for unit in UNITS.iterdir():
        text = unit.read_text().replace("/usr/local/bin/mushroom-backup", str(binary))
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        [analyze, "verify", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Type", "notify"),
        ("EnvironmentFile", "-/etc/default/mushroom-backup"),
        ("Restart", "on-failure"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", "CAP_DAC_READ_SEARCH"),
        ("StateDirectory", "mushroom-backup"),
    ],
)
def test_service_unit_directives(key: str, value: str) -> None:
    assert directives("mushroom-backup.service")[key] == value


def test_service_runs_the_agent_with_the_config_and_a_watchdog() -> None:
    unit = directives("mushroom-backup.service")
    assert unit["ExecStart"].endswith("--config /etc/mushroom-backup/config.toml run")
    assert unit["WatchdogSec"]
    assert unit["TimeoutStopSec"]
    assert unit["ProtectHome"] in ("yes", "read-only")


def test_timer_runs_the_one_shot() -> None:
    one_shot = directives("mushroom-backup-now.service")
    assert one_shot["Type"] == "oneshot"
    assert " backup now" in one_shot["ExecStart"]
    assert "OnCalendar" in directives("mushroom-backup-now.timer")
