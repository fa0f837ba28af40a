"""CLI plumbing: signals cancel a one-shot command cleanly; tables and sizes read well."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from mushroom_backup.cli.common import human_bytes, human_duration, run, table
from mushroom_backup.errors import Interrupted


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_cancels_the_work_runs_its_cleanup_and_exits_128_plus_n(
    sig: signal.Signals, code: int
) -> None:
    cleaned: list[str] = []

    async def work() -> None:
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), sig)
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("lease released")

    with pytest.raises(Interrupted) as caught:
        run(work())
    assert caught.value.exit_code == code
    assert cleaned == ["lease released"]
    assert "LATEST is untouched" in caught.value.message


def test_handlers_are_removed_afterwards() -> None:
    async def quick() -> int:
        return 7

    assert run(quick()) == 7
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler, None)


def test_table_aligns_numbers_right() -> None:
    text = table(("id", "files"), [("a", 5), ("bb", 120)])
    assert text.splitlines() == ["id  files", "--  -----", "a       5", "bb    120"]


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 << 30, "5.0 GiB")]
)
def test_human_bytes(count: int, text: str) -> None:
    assert human_bytes(count) == text


@pytest.mark.parametrize(("seconds", "text"), [(3.25, "3.2s"), (75, "1m15s"), (3725, "1h02m05s")])
def test_human_duration(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_a_log_line_wipes_the_progress_bar_first() -> None:
    import io
    import logging

    from mushroom_backup import log
    from mushroom_backup.cli.common import ProgressBar

    screen = io.StringIO()
    bar = ProgressBar("backup", stream=screen, enabled=True)
    log.setup(format="text", stream=screen)
    try:
        bar.start(2, 100)
        assert screen.getvalue().startswith("\rbackup [")
        log.get("test").info("lease.acquired")
        drawn = screen.getvalue()
        wipe = drawn.rindex("\r" + " " * 100 + "\r")
        assert drawn.index("lease.acquired") > wipe
        bar.finish()
        log.get("test").info("after")
        assert screen.getvalue().endswith("after\n")
        assert screen.getvalue().count(" " * 100) == 1, "no wipe once the bar is finished"
    finally:
        log.live_line(None)
        logging.getLogger("mushroom_backup").handlers.clear()
