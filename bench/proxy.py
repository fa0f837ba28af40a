"""A counting HTTP/1.1 proxy for the benchmarks: what a client sent to S3, on the wire.

Promises:

* Bytes pass through unchanged in both directions (a TCP relay): signatures, keep-alive,
  ``Expect: 100-continue``, chunked and ``aws-chunked`` bodies all work as without it.
* Beside the relay it parses both streams just enough to count, per request: method, path,
  body bytes as sent on the wire (so an ``aws-chunked`` body counts with its chunk signatures,
  a ``Transfer-Encoding: chunked`` one with its chunk framing), and the response status.
  A request whose client waited for ``100 Continue`` and got a final answer instead counts no
  body (the client does not send it).
* :meth:`CountingProxy.mark` / :meth:`CountingProxy.since` give the requests between two
  moments; read them after the client process has exited (its requests are complete then).

Does not: speak TLS, support pipelining beyond what the FIFO of requests per connection
gives, or upgrade connections. Runs its own event loop in a daemon thread of the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

READ_SIZE = 256 * 1024
MAX_HEAD = 64 * 1024


@dataclass
class Request:
    """One request seen by the proxy."""

    method: str
    path: str
    body_bytes: int = 0
    head_bytes: int = 0
    status: int = 0
    expect_continue: bool = False
    streaming: bool = False  #: signed in aws-chunked pieces (STREAMING-... payload hash)
    got_continue: bool = False
    answered: bool = False


@dataclass
class Totals:
    """Requests between two marks, summed."""

    requests: int
    by_method: dict[str, int]
    body_bytes_up: int
    wire_bytes_up: int
    wire_bytes_down: int
    statuses: dict[int, int]
    parse_errors: int
    streaming_requests: int
    uploads: list[tuple[str, int]] = field(default_factory=list)  #: (path, body bytes) of PUT/POST


class _Body:
    """Incremental HTTP/1.1 message-body framing: fixed length, chunked, or until close."""

    def __init__(self, length: int | None, chunked: bool) -> None:
        self.remaining = length or 0
        self.chunked = chunked
        self.until_close = length is None and not chunked
        self.state = "size" if chunked else "data"
        self.line = b""
        self.done = not chunked and not self.until_close and self.remaining == 0

    def feed(self, data: memoryview) -> int:
        """Consume body bytes from ``data``; return how many were consumed (all of them
        unless the body ended inside ``data``)."""
        if self.until_close:
            return len(data)
        used = 0
        while used < len(data) and not self.done:
            if self.state == "data":
                take = min(self.remaining, len(data) - used)
                used += take
                self.remaining -= take
                if self.remaining == 0:
                    if self.chunked:
                        self.state = "crlf"
                        self.line = b""
                    else:
                        self.done = True
                continue
            # "size", "crlf" (after a chunk's data) and "trailer" states read whole lines.
            end = bytes(data[used : used + 4096]).find(b"\n")
            if end < 0:
                self.line += bytes(data[used:])
                used = len(data)
                break
            line = (self.line + bytes(data[used : used + end])).strip()
            self.line = b""
            used += end + 1
            if self.state == "size":
                size = int(line.split(b";", 1)[0] or b"0", 16)
                if size == 0:
                    self.state = "trailer"
                else:
                    self.state, self.remaining = "data", size
            elif self.state == "crlf":
                self.state = "size"
            elif not line:  # the empty line that ends the trailer
                self.done = True
        return used


def _head(raw: bytes) -> tuple[str, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def _framing(headers: dict[str, str], no_body: bool, request: bool) -> _Body:
    """How the message's body ends (RFC 9112 section 6.3); a request without a length has
    none, a response without one runs until the connection closes."""
    if no_body:
        return _Body(0, False)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _Body(None, True)
    if "content-length" in headers:
        return _Body(int(headers["content-length"]), False)
    return _Body(0 if request else None, False)


class _Connection:
    """Parsing state of one client connection: requests in flight, in order."""

    def __init__(self, proxy: CountingProxy) -> None:
        self.proxy = proxy
        self.pending: deque[Request] = deque()
        self.up_head = b""
        self.up_body: _Body | None = None
        self.up_request: Request | None = None
        self.awaiting_continue: Request | None = None
        self.down_head = b""
        self.down_body: _Body | None = None

    # client -> server
    def upstream(self, data: bytes) -> None:
        self.proxy.wire_up += len(data)
        view = memoryview(data)
        while view:
            if self.awaiting_continue is not None:
                request = self.awaiting_continue
                self.awaiting_continue = None
                if request.answered and not request.got_continue:
                    self.up_body = None  # refused before the body: these bytes are a new request
                # else: 100 Continue came (or the client did not wait): the body follows
            if self.up_body is not None and self.up_request is not None:
                used = self.up_body.feed(view)
                self.up_request.body_bytes += used
                view = view[used:]
                if self.up_body.done:
                    self.up_body = None
                continue
            joined = self.up_head + bytes(view[:MAX_HEAD])
            end = joined.find(b"\r\n\r\n")
            if end < 0:
                self.up_head = joined[-MAX_HEAD:]
                return
            consumed = end + 4 - len(self.up_head)
            view = view[consumed:]
            head, self.up_head = joined[:end], b""
            start, headers = _head(head)
            method, _, rest = start.partition(" ")
            target = rest.rpartition(" ")[0]
            path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
            request = Request(method, path, head_bytes=end + 4)
            request.expect_continue = headers.get("expect", "").lower() == "100-continue"
            request.streaming = headers.get("x-amz-content-sha256", "").startswith("STREAMING")
            self.pending.append(request)
            self.proxy._record(request)
            self.up_request = request
            body = _framing(headers, no_body=False, request=True)
            self.up_body = None if body.done else body
            if self.up_body is not None and request.expect_continue:
                self.awaiting_continue = request

    # server -> client
    def downstream(self, data: bytes) -> None:
        self.proxy.wire_down += len(data)
        view = memoryview(data)
        while view:
            if self.down_body is not None:
                used = self.down_body.feed(view)
                view = view[used:]
                if self.down_body.done:
                    self.down_body = None
                continue
            joined = self.down_head + bytes(view[:MAX_HEAD])
            end = joined.find(b"\r\n\r\n")
            if end < 0:
                self.down_head = joined[-MAX_HEAD:]
                return
            consumed = end + 4 - len(self.down_head)
            view = view[consumed:]
            head, self.down_head = joined[:end], b""
            start, headers = _head(head)
            parts = start.split(" ", 2)
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            request = self.pending[0] if self.pending else None
            if 100 <= status < 200:
                if status == 100 and request is not None:
                    request.got_continue = True
                continue
            if request is not None:
                self.pending.popleft()
                request.status = status
                request.answered = True
            no_body = status in (204, 304) or (request is not None and request.method == "HEAD")
            body = _framing(headers, no_body, request=False)
            self.down_body = None if body.done else body


class CountingProxy:
    """``with CountingProxy("127.0.0.1", upstream_port) as proxy:`` — listen on
    ``proxy.port`` and relay to the upstream, counting requests."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self.requests: list[Request] = []
        self.wire_up = 0
        self.wire_down = 0
        self.parse_errors = 0  #: connections whose stream could not be parsed (counts are low)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        future.result(timeout=10)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def mark(self) -> tuple[int, int, int]:
        with self._lock:
            return len(self.requests), self.wire_up, self.wire_down

    def since(self, mark: tuple[int, int, int]) -> Totals:
        index, up, down = mark
        with self._lock:
            chosen = self.requests[index:]
            wire_up, wire_down = self.wire_up - up, self.wire_down - down
        return Totals(
            requests=len(chosen),
            by_method=dict(Counter(r.method for r in chosen)),
            body_bytes_up=sum(r.body_bytes for r in chosen),
            wire_bytes_up=wire_up,
            wire_bytes_down=wire_down,
            statuses=dict(Counter(r.status for r in chosen)),
            parse_errors=self.parse_errors,
            streaming_requests=sum(r.streaming for r in chosen),
            uploads=[(r.path, r.body_bytes) for r in chosen if r.method in ("PUT", "POST")],
        )

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Closing the sockets ends every pump; the serving tasks then finish on their own.
        for writer in list(self._writers):
            writer.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        connection = _Connection(self)
        self._writers.update((client_w, server_w))
        try:
            await asyncio.gather(
                self._pump(client_r, server_w, connection.upstream),
                self._pump(server_r, client_w, connection.downstream),
            )
        finally:
            for writer in (client_w, server_w):
                self._writers.discard(writer)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parse: Callable[[bytes], None],
    ) -> None:
        parsing = True
        try:
            while data := await reader.read(READ_SIZE):
                if parsing:  # before forwarding, so a request is known before its answer
                    try:
                        parse(data)
                    except Exception:  # a message we cannot frame: relay on, count no more
                        parsing = False
                        with self._lock:
                            self.parse_errors += 1
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()
