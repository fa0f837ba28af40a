"""Settings: precedence (flags > env > file > defaults) and errors that name the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from mushroom_backup.config import Settings, load_settings, parse_duration, parse_size
from mushroom_backup.errors import UsageError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_without_any_source() -> None:
    settings = load_settings(None, environ={})
    assert settings == Settings()
    assert settings.lease.ttl_s == 30
    assert settings.lease.conditional is True


def test_flags_beat_env_which_beats_file(tmp_path: Path) -> None:
    text = 'store = "file:///from/file"\nsource = "/src/file"\n[lease]\nttl_s = 10\n'
    path = write(tmp_path, text)
    env = {"MUSHROOM_BACKUP_STORE": "file:///from/env", "MUSHROOM_BACKUP_LEASE_TTL": "20"}
    settings = load_settings(path, environ=env, flags={("store",): "file:///from/flag"})
    assert settings.store == "file:///from/flag"
    assert settings.lease.ttl_s == 20
    assert settings.source == Path("/src/file")
    assert load_settings(path, environ=env).store == "file:///from/env"
    assert load_settings(path, environ={}).store == "file:///from/file"


def test_none_flags_do_not_override(tmp_path: Path) -> None:
    path = write(tmp_path, 'store = "file:///from/file"\n')
    assert load_settings(path, environ={}, flags={("store",): None}).store == "file:///from/file"


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, 'store = "file:///x"\n')
    assert load_settings(None, environ={"MUSHROOM_BACKUP_CONFIG": str(path)}).store == "file:///x"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("off", False), ("OFF", False), ("false", False), ("0", False), ("on", True), ("yes", True)],
)
def test_best_effort_switch(value: str, expected: bool) -> None:
    settings = load_settings(None, environ={"MUSHROOM_BACKUP_LEASE_CONDITIONAL": value})
    assert settings.lease.conditional is expected


def test_rust_agents_switch_is_honoured_and_ours_wins() -> None:
    rust = {"MUSHROOMDB_BACKUP_LEASE_CONDITIONAL": "off"}
    assert load_settings(None, environ=rust).lease.conditional is False
    both = {**rust, "MUSHROOM_BACKUP_LEASE_CONDITIONAL": "on"}
    assert load_settings(None, environ=both).lease.conditional is True


def test_bad_switch_names_the_variable() -> None:
    with pytest.raises(UsageError) as caught:
        load_settings(None, environ={"MUSHROOM_BACKUP_LEASE_CONDITIONAL": "maybe"})
    assert "MUSHROOM_BACKUP_LEASE_CONDITIONAL" in caught.value.message
    assert "on or off" in caught.value.message


def test_bad_value_in_file_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[lease]\nttl_s = -1\n")
    with pytest.raises(UsageError) as caught:
        load_settings(path, environ={})
    assert f"{path}: lease.ttl_s" in caught.value.message
    assert "greater than or equal to 1" in caught.value.message


def test_unknown_key_is_an_error_not_a_default(tmp_path: Path) -> None:
    path = write(tmp_path, "[lease]\nttl = 10\n")
    with pytest.raises(UsageError, match=r"lease\.ttl: unknown setting"):
        load_settings(path, environ={})


def test_broken_toml_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "store = \n")
    with pytest.raises(UsageError, match="is not valid TOML"):
        load_settings(path, environ={})


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_bad_store_url_is_reported_with_its_origin() -> None:
    with pytest.raises(UsageError) as caught:
        load_settings(None, environ={"MUSHROOM_BACKUP_STORE": "ftp://x/y"})
    assert "MUSHROOM_BACKUP_STORE" in caught.value.message
    assert "s3://BUCKET/PREFIX" in caught.value.message


def test_store_url_with_credentials_is_refused_without_echoing_them() -> None:
    with pytest.raises(UsageError) as caught:
        load_settings(None, environ={"MUSHROOM_BACKUP_STORE": "s3://AKID:s3cr3tvalue@bucket/p"})
    assert "s3cr3tvalue" not in caught.value.message
    assert "credentials" in caught.value.message


def test_excludes_from_env_are_comma_separated() -> None:
    settings = load_settings(None, environ={"MUSHROOM_BACKUP_EXCLUDE": "*.tmp, pg_wal/*.partial"})
    assert settings.backup.excludes == ("*.tmp", "pg_wal/*.partial")


def test_require_store_and_source_explain_how_to_set_them() -> None:
    settings = Settings()
    with pytest.raises(UsageError, match="MUSHROOM_BACKUP_STORE"):
        settings.require_store()
    with pytest.raises(UsageError, match="--source DIR"):
        settings.require_source()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(30, 30.0), ("30", 30.0), ("30s", 30.0), ("5m", 300.0), ("1.5h", 5400.0), ("2d", 172800.0)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "5 minutes", True, "-3s"])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"), [(4096, 4096), ("512KiB", 524288), ("8MiB", 8 << 20), ("1k", 1024)]
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


def test_example_config_is_valid() -> None:
    example = Path(__file__).parents[2] / "config" / "config.example.toml"
    settings = load_settings(example, environ={})
    assert settings.store is not None
    assert settings.source is not None
