"""Structured logs: one event per line, JSON or key=value, never a secret."""

from __future__ import annotations

import io
import json
import logging

from mushroom_backup import log


def emit(fmt: log.LogFormat, **fields: object) -> str:
    stream = io.StringIO()
    log.setup(format=fmt, stream=stream)
    log.get("test").warning("lease.lost", extra={"fields": fields})
    return stream.getvalue()


def test_json_lines_carry_event_and_fields() -> None:
    line = emit("json", holder="abc", ttl_s=30)
    body = json.loads(line)
    assert body["event"] == "lease.lost"
    assert body["level"] == "warning"
    assert body["holder"] == "abc"
    assert body["ttl_s"] == 30
    assert line.count("\n") == 1


def test_text_lines_are_key_value() -> None:
    line = emit("text", holder="abc", note="two words")
    assert ' lease.lost holder=abc note="two words"' in line


def test_secrets_never_reach_the_log() -> None:
    for fmt in ("json", "text"):
        line = emit(fmt, error="aws_secret_access_key=wJalrXUtnFEMI/K7MDENG", url="s3://u:pw@b/p")
        assert "wJalrXUtnFEMI" not in line
        assert "pw@" not in line


def teardown_module() -> None:
    logging.getLogger("mushroom_backup").handlers.clear()
