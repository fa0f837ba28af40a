"""Real ``mushroom-backup run`` processes for the service integration tests.

:func:`start_agent` starts ``python -m mushroom_backup run`` with the test's AWS environment
(the store fixtures apply it), short timings through ``MUSHROOM_BACKUP_*`` variables, and JSON
logs on stderr written to a file. :class:`Agent` parses that file into events and waits for
them: every wait polls the file until a condition holds or a bounded deadline passes (then the
test fails, showing the log). Nothing here sleeps in place of an event.

Timestamps: each event's ``ts`` is the process's wall clock (milliseconds, UTC); all agents run
on this host, so their stamps compare directly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.02

Event = dict[str, Any]


def stamp(event: Event) -> float:
    """An event's ``ts`` as Unix seconds."""
    moment = datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return moment.timestamp()


def agent_env(store_url: str, source: Path, **settings: str) -> dict[str, str]:
    """The environment of an agent: the test's (AWS_* from the store fixture), the store and
    source, JSON logs, and ``settings`` as ``MUSHROOM_BACKUP_<NAME>`` variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MUSHROOM_BACKUP_", "NOTIFY_SOCKET", "WATCHDOG_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["MUSHROOM_BACKUP_STORE"] = store_url
    env["MUSHROOM_BACKUP_SOURCE"] = str(source)
    env["MUSHROOM_BACKUP_LOG_FORMAT"] = "json"
    for name, value in settings.items():
        if name.isupper():
            env[name] = value  # NOTIFY_SOCKET, WATCHDOG_USEC, ...
        else:
            env[f"MUSHROOM_BACKUP_{name.upper()}"] = value
    return env


@dataclass
class Agent:
    """One ``run`` process and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    killed_at: float | None = None
    _events: list[Event] = field(default_factory=list)
    _read: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self, name: str | None = None, **match: Any) -> list[Event]:
        """The events logged so far (named ``name``, with these field values)."""
        data = self.log_path.read_bytes()
        end = data.rfind(b"\n") + 1  # only whole lines
        for line in data[self._read : end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "(not json)", "text": line.decode(errors="replace")}
            if isinstance(event, dict):
                self._events.append(event)
        self._read = end
        return [
            e
            for e in self._events
            if (name is None or e.get("event") == name)
            and all(e.get(k) == v for k, v in match.items())
        ]

    def last(self, name: str) -> Event:
        found = self.events(name)
        assert found, f"{self.name} logged no {name}:\n{self.tail()}"
        return found[-1]

    @property
    def instance_id(self) -> str:
        return str(self.wait_for("service.started")["instance_id"])

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_for(self, name: str, count: int = 1, timeout: float = 30.0, **match: Any) -> Event:
        """The ``count``-th event ``name`` (with ``match``), once logged."""
        found: list[Event] = []

        def logged() -> bool:
            found[:] = self.events(name, **match)
            return len(found) >= count

        wait_until(logged, f"{self.name}: {count} x {name} {match or ''}", timeout, [self])
        return found[count - 1]

    def send(self, sig: signal.Signals) -> float:
        """Send ``sig``; returns the wall time it was sent."""
        sent = time.time()
        self.process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.killed_at = sent
        return sent

    def exit_code(self, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit within {timeout} s:\n{self.tail()}")


def wait_until(
    condition: Callable[[], bool], what: str, timeout: float, agents: Sequence[Agent] = ()
) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds showing the logs."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {a.name} (pid {a.pid}):\n{a.tail()}" for a in agents)
            pytest.fail(f"not within {timeout} s: {what}\n{logs}")
        time.sleep(POLL_S)


@dataclass
class Agents:
    """Starts agents for one test and makes sure none outlives it."""

    workdir: Path
    started: list[Agent] = field(default_factory=list)

    def start(self, name: str, env: dict[str, str], *args: str) -> Agent:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "mushroom_backup", "run", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
                cwd=REPO,
            )
        agent = Agent(name, process, log_path)
        self.started.append(agent)
        return agent

    def holders(self) -> list[Agent]:
        """Agents that have logged lease.acquired (so far)."""
        return [a for a in self.started if a.events("lease.acquired")]

    def close(self) -> None:
        for agent in self.started:
            if agent.process.poll() is None:
                agent.process.send_signal(signal.SIGCONT)
                agent.process.kill()
            agent.process.wait(timeout=10)


def agents_fixture(tmp_path: Path) -> Iterator[Agents]:
    agents = Agents(tmp_path)
    try:
        yield agents
    finally:
        agents.close()
