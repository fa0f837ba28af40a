"""Structured logs: one event per line on stderr, JSON for machines, key=value for people.

Code logs with ``logger.info("lease.acquired", extra={"fields": {...}})`` -- the message is a
stable event name, the fields are data. :func:`setup` installs one handler on the
``mushroom_backup`` logger that renders each record as

* JSON (``{"ts": ..., "level": ..., "event": ..., **fields}``) when stderr is not a terminal
  (journald, files, pipes), or when asked with ``format="json"``;
* ``2026-11-29T10:15:00.123Z INFO  lease.acquired instance_id=… ttl_s=30`` on a terminal.

Every value passes through :func:`~mushroom_backup.errors.redact`, so a credential that slipped
into a field or an exception text is not written. Third-party loggers (botocore, aiohttp) stay
at WARNING unless ``--debug``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from .errors import redact

LogFormat = Literal["auto", "json", "text"]
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "fields"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = dict(getattr(record, "fields", {}) or {})
    for key, value in record.__dict__.items():
        if key not in _RESERVED and not key.startswith("_"):
            fields.setdefault(key, value)
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        fields.setdefault("error", f"{type(error).__name__}: {error}")
    return fields


def _stamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return redact(value) if isinstance(value, str) else value
    return redact(str(value))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": _stamp(record),
            "level": record.levelname.lower(),
            "event": redact(record.getMessage()),
        }
        for key, value in _fields(record).items():
            body[key] = _plain(value)
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_stamp(record), f"{record.levelname:<5}", redact(record.getMessage())]
        for key, value in _fields(record).items():
            if value is None:  # absent, for people; JSON keeps null
                continue
            text = str(_plain(value))
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text, ensure_ascii=False)
            parts.append(f"{key}={text}")
        return " ".join(parts)


_live_line: Callable[[], None] | None = None


def live_line(clear: Callable[[], None] | None) -> None:
    """Register (or, with None, drop) the callback that clears a live terminal line -- the
    progress bar -- before a log line is written, so the two never share a line."""
    global _live_line
    _live_line = clear


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    def emit(self, record: logging.LogRecord) -> None:
        if _live_line is not None:
            _live_line()
        super().emit(record)


def setup(*, format: LogFormat = "auto", debug: bool = False, stream: TextIO | None = None) -> None:
    """Install the one handler. Safe to call again (it replaces the previous one)."""
    out = stream or sys.stderr
    if format == "auto":
        format = "text" if out.isatty() else "json"
    handler = _Handler(out)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    root = logging.getLogger("mushroom_backup")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
    for noisy in ("botocore", "aiobotocore", "aiohttp", "urllib3", "watchfiles"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)


def get(name: str) -> logging.Logger:
    """``get("lease")`` → the ``mushroom_backup.lease`` logger."""
    return logging.getLogger(f"mushroom_backup.{name}")
