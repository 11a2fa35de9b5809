"""A lean HTTP/1.1 server on asyncio and httptools: the transport under `server.py`.

Why not aiohttp's server, the design's first choice: measured on this project's machines (2-core VMs, uvloop
in both cases), aiohttp spends about 200 microseconds of CPU per request before a handler runs; a protocol
on httptools (llhttp, the parser aiohttp and Node use) spends about 75. A filter over 1,000 node names does
about 200 microseconds of its own work, so the transport decides whether one core serves ~2,300 or ~3,200
filters a second (`make bench`). aiohttp stays the client (demo, tests).

What it does: HTTP/1.0 and 1.1; keep-alive; `Content-Length` and chunked request bodies; a body limit (413,
refused from the header before the body is read when the length is declared); a header limit (431);
`Expect: 100-continue`; pipelined requests answered in order; an idle timeout; TLS, and so mutual TLS,
through the SSL context given; a graceful stop that finishes requests in flight. A handler runs inline as
the request completes, with no task per request, and answers a Response; one that must wait (bind always,
a filter that re-reads the API rarely) answers an awaitable of its Response instead, which then runs as a
task while requests pipelined behind it wait their turn.

What it never does: HTTP/2 or upgrades (ALPN offers only http/1.1), compression, or answering with a
traceback: a handler that raises is logged and answered 500 with a one-line JSON error.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import httptools
import orjson

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024
MAX_QUEUED = 16
"""Pipelined requests buffered per connection before it stops reading."""


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    """Values of `{name}` segments of the route."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"


def json_error(status: int, message: str) -> Response:
    return Response(status, orjson.dumps({"Error": message}))


Handler = Callable[[Request], "Response | Awaitable[Response]"]
"""Answers at once with a Response, or with an awaitable of one when it must wait (a coroutine function is one)."""
Background = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler


class Router:
    """Exact paths, and paths ending in one `{name}` segment (`/inspect/{node}`)."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        self._prefixed: dict[str, tuple[str, dict[str, Route]]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        route = Route(method, path, handler)
        if path.endswith("}"):
            prefix, _, name = path.rpartition("/{")
            self._prefixed.setdefault(prefix + "/", (name[:-1], {}))[1][method] = route
        else:
            self._exact.setdefault(path, {})[method] = route

    @property
    def paths(self) -> list[str]:
        return [*self._exact, *(prefix + "{" + name + "}" for prefix, (name, _) in self._prefixed.items())]

    def resolve(self, method: str, path: str) -> tuple[Route | None, dict[str, str], bool]:
        """The route, its parameters, and whether the path exists at all (for 405 against 404)."""
        methods = self._exact.get(path)
        params: dict[str, str] = {}
        if methods is None:
            prefix, _, last = path.rpartition("/")
            found = self._prefixed.get(prefix + "/") if last else None
            if found is None:
                return None, params, False
            name, methods = found
            params = {name: last}
        return methods.get(method), params, True


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs their handlers, writes the answers in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[tuple[Request | Response, bool]] = deque()
        self.busy = False
        self.closing = False
        """The transport is closed or closing: nothing more is read or written."""
        self.refusing = False
        """A refusal is queued behind the request in flight: nothing more is read; what was queued before
        it is still answered, in order, then the connection closes."""
        self.paused = False
        self.last_active = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_size = 0
        self.expect_continue = False
        self.refused: Response | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.closing or self.refusing:
            return
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(json_error(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as error:
            self._refuse(json_error(400, f"malformed HTTP request: {error}"))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        self._check_header_size()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        self._check_header_size()
        lowered = name.lower()
        if lowered == b"content-length" and value.isdigit() and int(value) > self.server.max_body_bytes:
            self.refused = self._too_large()
        elif lowered == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True

    def _check_header_size(self) -> None:
        """Refuse as soon as the request line and headers pass the limit, not after buffering them all."""
        if self.header_bytes > MAX_HEADER_BYTES and self.refused is None:
            self.refused = json_error(431, f"request headers are over the limit of {MAX_HEADER_BYTES} bytes")
            self._refuse(self.refused)

    def on_headers_complete(self) -> None:
        if self.refused is not None:
            self._refuse(self.refused)
        elif self.expect_continue and not self.busy and not self.queue and self.transport is not None:
            # Behind a request in flight the interim answer would come before that one's: leave it out; the
            # client sends the body after its own short wait (Go: ExpectContinueTimeout, 1 s).
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.body_size += len(chunk)
        if self.body_size > self.server.max_body_bytes:
            if self.refused is None:  # a chunked body grew past the limit: refuse now, read no more of it
                self.refused = self._too_large()
                self._refuse(self.refused)
            return
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        if self.closing or self.refusing:
            return
        if self.refused is not None:
            self._refuse(self.refused)
            return
        keep_alive = self.parser.should_keep_alive()
        path = self.url.partition(b"?")[0].decode("utf-8", "replace")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = Request(self.parser.get_method().decode("ascii", "replace"), path, body)
        if self.busy:
            self.queue.append((request, keep_alive))
            if len(self.queue) >= MAX_QUEUED and self.transport is not None and not self.paused:
                self.transport.pause_reading()
                self.paused = True
        else:
            self._handle(request, keep_alive)

    # -- answering

    def _too_large(self) -> Response:
        return json_error(413, f"request body is over the limit of {self.server.max_body_bytes} bytes")

    def _refuse(self, response: Response) -> None:
        """Answer and close: the rest of what this connection sent cannot be trusted or is unwanted."""
        if self.closing or self.refusing:
            return
        if self.busy:  # after the answers to the request in flight and to those queued behind it, in order
            self.queue.append((response, False))
            self.refusing = True
            if self.transport is not None and not self.paused:
                self.transport.pause_reading()
                self.paused = True
            return
        self._write(response, keep_alive=False)

    def _handle(self, request: Request, keep_alive: bool) -> None:
        route, params, exists = self.server.router.resolve(request.method, request.path)
        if route is None:
            status = 405 if exists else 404
            self._write(
                json_error(status, f"{request.method} {request.path}: {http.HTTPStatus(status).phrase}"), keep_alive
            )
            return
        if params:
            request = Request(request.method, request.path, request.body, params)
        try:
            response = route.handler(request)
        except Exception as error:
            response = _unexpected(route, error)
        if not isinstance(response, Response):
            self._later(route, response, keep_alive)
            return
        self._write(response, keep_alive)

    def _later(self, route: Route, pending: Awaitable[Response], keep_alive: bool) -> None:
        """Answer when `pending` is done; requests pipelined behind it wait in the queue meanwhile."""
        self.busy = True
        task = asyncio.get_running_loop().create_task(self._run(route, pending, keep_alive))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _run(self, route: Route, pending: Awaitable[Response], keep_alive: bool) -> None:
        try:
            response = await pending
        except Exception as error:
            response = _unexpected(route, error)
        self.busy = False
        self._write(response, keep_alive)
        while self.queue and not self.busy and not self.closing:
            queued, queued_keep_alive = self.queue.popleft()
            if isinstance(queued, Response):
                self._write(queued, keep_alive=False)
            else:
                self._handle(queued, queued_keep_alive)
        if self.paused and not self.closing and not self.refusing and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _write(self, response: Response, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or self.closing or transport.is_closing():
            return
        keep_alive = keep_alive and not self.server.stopping
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s\r\n" % (
            response.status,
            _PHRASES.get(response.status, b"Unknown"),
            response.content_type.encode(),
            len(response.body),
            self.server.date,
            b"" if keep_alive else b"Connection: close\r\n",
        )
        transport.write(head + response.body)
        self.last_active = time.monotonic()
        if not keep_alive:
            self.closing = True
            transport.close()

    def close_if_idle(self, idle_since: float) -> None:
        if not self.busy and self.last_active < idle_since and self.transport is not None:
            self.closing = True
            self.transport.close()


_PHRASES = {status.value: status.phrase.encode() for status in http.HTTPStatus}


def _unexpected(route: Route, error: Exception) -> Response:
    log.error("%s %s: unexpected failure", route.method, route.path, exc_info=error)
    return json_error(500, f"internal error in {route.method} {route.path}: {type(error).__name__}: {error}")


class HttpServer:
    """Serves a Router. Mutable: its connections, tasks in flight and background tasks."""

    def __init__(
        self,
        router: Router,
        max_body_bytes: int,
        idle_timeout: float = 75.0,
        background: tuple[Background, ...] = (),
    ) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.idle_timeout = idle_timeout
        """Seconds an idle keep-alive connection is kept (Go's client keeps its own for 90 s and retries)."""
        self.background = background
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.date = email.utils.formatdate(usegmt=True).encode()
        self._server: asyncio.Server | None = None
        self._chores: list[asyncio.Task[None]] = []

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int, context: ssl.SSLContext | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, ssl=context, backlog=1024)
        self._chores = [loop.create_task(self._tick(), name="http-tick")]
        self._chores += [
            loop.create_task(job(), name=getattr(job, "__name__", "background")) for job in self.background
        ]

    async def _tick(self) -> None:
        """Once a second: the Date header, and closing connections idle longer than the timeout."""
        while True:
            await asyncio.sleep(1.0)
            self.date = email.utils.formatdate(usegmt=True).encode()
            idle_since = time.monotonic() - self.idle_timeout
            for connection in list(self.connections):
                connection.close_if_idle(idle_since)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let requests in flight finish (up to `grace` seconds), close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for chore in self._chores:
            chore.cancel()
        for chore in self._chores:
            with contextlib.suppress(asyncio.CancelledError):
                await chore
        for connection in list(self.connections):
            connection.close_if_idle(float("inf"))
        if self.tasks:
            _, late = await asyncio.wait(set(self.tasks), timeout=grace)
            for task in late:
                task.cancel()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
