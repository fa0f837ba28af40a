"""What every command shares: the ``--store`` and ``--json`` options, settings resolution,
running a coroutine, and human output (tables, JSON, a progress bar on a terminal).

Human output goes to stdout; progress bars and logs to stderr, and a progress bar only when
stderr is a terminal.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import click

from .. import log
from ..config import Settings, load_settings
from ..errors import Interrupted

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

store_option = click.option(
    "--store",
    "store_url",
    metavar="URL",
    default=None,
    help="s3://BUCKET/PREFIX or file:///PATH (default: $MUSHROOM_BACKUP_STORE, then config).",
)
source_option = click.option(
    "--source",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to back up (default: $MUSHROOM_BACKUP_SOURCE, then config).",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout."
)


def settings_for(ctx: click.Context, flags: dict[tuple[str, ...], Any] | None = None) -> Settings:
    """Resolve settings (flags > env > file) and set up logging once per command."""
    root = ctx.find_root()
    settings = load_settings(root.meta.get("mushroom.config_path"), flags=flags)
    log.setup(format=settings.log_format, debug=bool(root.meta.get("mushroom.debug")))
    return settings


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine to completion. SIGINT and SIGTERM cancel it, so its
    ``finally`` blocks run (a snapshot is abandoned, the lease released), and then raise
    :class:`~mushroom_backup.errors.Interrupted` (exit 128 + the signal number)."""
    received: list[signal.Signals] = []

    async def main() -> T:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, _interrupt, task, sig, received)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        try:
            return await task
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0].value, received[0].name) from None
        raise


def _interrupt(
    task: asyncio.Future[Any], sig: signal.Signals, received: list[signal.Signals]
) -> None:
    received.append(sig)
    task.cancel()


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain left-aligned text table (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(_is_number(row[i]) for row in cells[1:]) and len(cells) > 1 for i in range(len(headers))
    ]
    lines = []
    for index, row in enumerate(cells):
        parts = [
            cell.rjust(widths[i]) if numeric[i] and index else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    return bool(text) and text.replace(".", "", 1).replace("x", "", 1).rstrip("%").isdigit()


def human_bytes(count: float) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - loop always returns


def human_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class ProgressBar:
    """Bytes and files done, rate and ETA, redrawn on stderr at most 10 times a second.

    Does nothing unless stderr is a terminal. Implements the snapshot package's progress
    callbacks (``start``, ``advance``), plus ``finish`` to end the line.
    """

    def __init__(self, label: str, *, stream: Any = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.total_bytes = 0
        self.total_files = 0
        self.done_bytes = 0
        self.done_files = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def start(self, total_files: int, total_bytes: int) -> None:
        self.total_files, self.total_bytes = total_files, total_bytes
        self._draw(force=True)

    def advance(self, files: int, nbytes: int) -> None:
        self.done_files += files
        self.done_bytes += nbytes
        self._draw()

    def finish(self) -> None:
        if self.enabled:
            self._draw(force=True)
            log.live_line(None)
            self.stream.write("\n")
            self.stream.flush()

    def _clear(self) -> None:
        """A log line is about to be written: wipe the bar; the next update redraws it."""
        self.stream.write("\r" + " " * 100 + "\r")
        self._drawn = 0.0

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        log.live_line(self._clear)
        now = time.monotonic()
        if not force and now - self._drawn < 0.1:
            return
        self._drawn = now
        elapsed = max(now - self.started, 1e-6)
        rate = self.done_bytes / elapsed
        fraction = self.done_bytes / self.total_bytes if self.total_bytes else 0.0
        width = 24
        filled = int(width * min(fraction, 1.0))
        eta = (
            human_duration((self.total_bytes - self.done_bytes) / rate)
            if rate > 0 and self.total_bytes
            else "?"
        )
        line = (
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {fraction:6.1%} "
            f"{human_bytes(self.done_bytes)}/{human_bytes(self.total_bytes)} "
            f"{self.done_files}/{self.total_files} files {human_bytes(rate)}/s ETA {eta}"
        )
        self.stream.write(line.ljust(100))
        self.stream.flush()
