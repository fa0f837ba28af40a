"""Settings: one frozen pydantic model, read from a TOML file, ``MUSHROOM_BACKUP_*`` environment
variables and command-line flags -- flags win over the environment, the environment over the
file, the file over the defaults.

Promises:
- The config is parsed once, into :class:`Settings`; nothing else reads the environment for
  settings (the AWS SDK still reads its own ``AWS_*`` variables and profiles).
- A bad value is a :class:`~mushroom_backup.errors.UsageError` that names the key, where it came
  from (the file and its TOML key, the environment variable, or the flag) and what is expected.
- Unknown keys in the file are errors (a typo must not silently fall back to a default).
- Credentials are never part of Settings: S3 credentials come from the standard AWS variables
  and profiles. Store URLs may not carry userinfo (``s3://key:secret@bucket`` is refused).

Not promised: hot reload (the service reads its config at start; see the README).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from .errors import UsageError
from .store import parse_store_url

DEFAULT_CONFIG_PATH = Path("/etc/mushroom-backup/config.toml")

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def parse_duration(value: Any) -> Any:
    """``30``, ``"30"``, ``"30s"``, ``"5m"``, ``"1.5h"``, ``"2d"``, ``"1w"`` → seconds (float)."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '30s', '5m', '1h'")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value.lower())
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    raise ValueError(f"{value!r} is not a duration: use seconds or '30s', '5m', '1h', '2d', '1w'")


def parse_size(value: Any) -> Any:
    """``524288``, ``"512KiB"``, ``"8MiB"`` → bytes (int)."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '512KiB', '8MiB'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE.match(value.lower())
        if match and match.group(2) in _SIZE_UNITS:
            return int(match.group(1)) * _SIZE_UNITS[match.group(2)]
    raise ValueError(f"{value!r} is not a size: use bytes or '512KiB', '8MiB', '1GiB'")


def parse_switch(value: Any) -> Any:
    """on/off, true/false, yes/no, 1/0 (any case) → bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("on", "true", "yes", "1"):
            return True
        if lowered in ("off", "false", "no", "0"):
            return False
    raise ValueError(f"{value!r} is not a switch: use on or off")


def parse_list(value: Any) -> Any:
    """A TOML list, or a comma-separated string (from the environment)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
Bytes = Annotated[int, BeforeValidator(parse_size)]
Switch = Annotated[bool, BeforeValidator(parse_switch)]
Patterns = Annotated[tuple[str, ...], BeforeValidator(parse_list)]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LeaseSettings(_Section):
    """The bucket lease."""

    ttl_s: int = Field(30, ge=1, le=3600, description="lease TTL in seconds")
    conditional: Switch = Field(True, description="conditional writes; off = best-effort exclusion")


class BackupSettings(_Section):
    """How a snapshot is taken."""

    excludes: Patterns = ()
    skip_unreadable: Switch = False
    upload_concurrency: int = Field(4, ge=1, le=128)
    compression_level: int = Field(3, ge=1, le=22)
    chunk_size: Bytes = Field(512 * 1024, ge=64 * 1024, le=16 << 20)
    pack_size: Bytes = Field(4 << 20, ge=1 << 20, le=64 << 20)


class RestoreSettings(_Section):
    download_concurrency: int = Field(8, ge=1, le=128)


class ScheduleSettings(_Section):
    """When the service takes snapshots."""

    interval_s: Seconds = 3600.0
    watch: Switch = False
    debounce_s: Seconds = 10.0
    min_gap_s: Seconds = 60.0


class RetentionSettings(_Section):
    """Which snapshots ``forget`` keeps (all unset: keep everything)."""

    keep_last: int | None = Field(None, ge=1)
    keep_hourly: int | None = Field(None, ge=1)
    keep_daily: int | None = Field(None, ge=1)
    keep_weekly: int | None = Field(None, ge=1)
    keep_monthly: int | None = Field(None, ge=1)
    keep_yearly: int | None = Field(None, ge=1)
    keep_within_s: Annotated[float | None, BeforeValidator(parse_duration)] = None


class ClusterSettings(_Section):
    """Stable node identity (process lease)."""

    root: str | None = None
    node_id: int | None = Field(None, ge=1, le=2**63 - 1)
    ttl_s: int = Field(30, ge=1, le=3600)

    @field_validator("root")
    @classmethod
    def _root_is_a_store(cls, value: str | None) -> str | None:
        return None if value is None else _check_store_url(value)


class MetricsSettings(_Section):
    listen: str | None = None

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:9464")
        return value


class Settings(_Section):
    """Everything mushroom-backup can be told. See config/config.example.toml."""

    store: str | None = None
    source: Path | None = None
    log_format: Literal["auto", "json", "text"] = "auto"
    lease: LeaseSettings = LeaseSettings()
    backup: BackupSettings = BackupSettings()
    restore: RestoreSettings = RestoreSettings()
    schedule: ScheduleSettings = ScheduleSettings()
    retention: RetentionSettings = RetentionSettings()
    cluster: ClusterSettings = ClusterSettings()
    metrics: MetricsSettings = MetricsSettings()

    @field_validator("store")
    @classmethod
    def _store_is_a_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_store_url(value)

    def require_store(self) -> str:
        if not self.store:
            raise UsageError(
                "no store given: pass --store URL, set MUSHROOM_BACKUP_STORE, or set "
                'store = "..." in the config file'
            )
        return self.store

    def require_source(self) -> Path:
        if self.source is None:
            raise UsageError(
                "no source directory given: pass --source DIR, set MUSHROOM_BACKUP_SOURCE, or "
                'set source = "..." in the config file'
            )
        return self.source


def _check_store_url(value: str) -> str:
    try:
        parse_store_url(value)
    except UsageError as error:
        raise ValueError(error.message) from None
    return value


# --- environment ---------------------------------------------------------------------------

#: Every environment variable mushroom-backup reads for settings, and the key it sets.
ENV_VARS: dict[str, tuple[str, ...]] = {
    "MUSHROOM_BACKUP_STORE": ("store",),
    "MUSHROOM_BACKUP_SOURCE": ("source",),
    "MUSHROOM_BACKUP_LOG_FORMAT": ("log_format",),
    "MUSHROOM_BACKUP_LEASE_TTL": ("lease", "ttl_s"),
    # The Rust agent's switch, honoured so an existing unit file keeps working; ours comes
    # after it and wins when both are set.
    "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL": ("lease", "conditional"),
    "MUSHROOM_BACKUP_LEASE_CONDITIONAL": ("lease", "conditional"),
    "MUSHROOM_BACKUP_EXCLUDE": ("backup", "excludes"),
    "MUSHROOM_BACKUP_UPLOAD_CONCURRENCY": ("backup", "upload_concurrency"),
    "MUSHROOM_BACKUP_COMPRESSION_LEVEL": ("backup", "compression_level"),
    "MUSHROOM_BACKUP_DOWNLOAD_CONCURRENCY": ("restore", "download_concurrency"),
    "MUSHROOM_BACKUP_INTERVAL": ("schedule", "interval_s"),
    "MUSHROOM_BACKUP_WATCH": ("schedule", "watch"),
    "MUSHROOM_BACKUP_DEBOUNCE": ("schedule", "debounce_s"),
    "MUSHROOM_BACKUP_MIN_GAP": ("schedule", "min_gap_s"),
    "MUSHROOM_BACKUP_KEEP_LAST": ("retention", "keep_last"),
    "MUSHROOM_BACKUP_CLUSTER_ROOT": ("cluster", "root"),
    "MUSHROOM_BACKUP_NODE_ID": ("cluster", "node_id"),
    "MUSHROOM_BACKUP_CLUSTER_TTL": ("cluster", "ttl_s"),
    "MUSHROOM_BACKUP_METRICS_LISTEN": ("metrics", "listen"),
}
CONFIG_ENV_VAR = "MUSHROOM_BACKUP_CONFIG"


@dataclass(frozen=True)
class _Origin:
    """Where one value came from, for error messages."""

    text: str


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        child = tree.setdefault(part, {})
        if not isinstance(child, dict):
            raise UsageError(f"config key {part!r} must be a table ([{part}])")
        tree = child
    tree[path[-1]] = value


def _walk(tree: Mapping[str, Any], base: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    leaves: list[tuple[tuple[str, ...], Any]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            leaves.extend(_walk(value, (*base, key)))
        else:
            leaves.append(((*base, key), value))
    return leaves


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path)


def load_settings(
    config_path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[tuple[str, ...], Any] | None = None,
) -> Settings:
    """Read the file (``config_path``, else ``$MUSHROOM_BACKUP_CONFIG``, else
    /etc/mushroom-backup/config.toml when it exists), overlay the environment, then ``flags``
    (``None`` values are ignored), and validate. See the module docstring."""
    env = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], _Origin] = {}

    path: Path | None
    explicit = config_path or env.get(CONFIG_ENV_VAR)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise UsageError(f"config file {path} does not exist (or is not a file)")
    else:
        path = DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:
            raise UsageError(f"config file {path} is not valid TOML: {error}") from None
        except OSError as error:
            raise UsageError(f"config file {path} cannot be read: {error.strerror}") from None
        for leaf, value in _walk(data):
            _set(merged, leaf, value)
            origins[leaf] = _Origin(f"{path}: {_dotted(leaf)}")

    for name, leaf in ENV_VARS.items():
        # An empty value ("NAME=" in an EnvironmentFile) counts as unset.
        if env.get(name, "").strip():
            _set(merged, leaf, env[name])
            origins[leaf] = _Origin(f"environment variable {name}")

    for leaf, value in (flags or {}).items():
        if value is not None:
            _set(merged, leaf, value)
            origins[leaf] = _Origin(f"option --{leaf[-1].replace('_', '-')}")

    try:
        return Settings.model_validate(merged)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            loc = tuple(str(p) for p in item["loc"])
            origin = origins.get(loc)
            where = origin.text if origin else f"config key {_dotted(loc)}"
            if item["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown setting (check the spelling)")
            else:
                message = item["msg"].removeprefix("Value error, ")
                problems.append(f"{where}: {message}")
        raise UsageError("invalid settings: " + "; ".join(problems)) from None
