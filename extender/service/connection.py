"""One client connection of the HTTP/1.1 server: parse requests with httptools, answer them in order, a few
per turn of the event loop, within the limits of `limits.py` (the why of each is in `transport.py`).
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections import deque
from collections.abc import Awaitable
from typing import Protocol, cast

import httptools

from extender.service.limits import SLICE_BYTES, Limits, Tally
from extender.service.routing import Request, Response, Route, Router, internal_error, json_error

log = logging.getLogger(__name__)


_CLOSED = object()
"""What a closed connection's parser calls back: nothing (it is never fed again)."""


class _Stop(Exception):
    """Raised from a parser callback once the request is refused: the parser must read no further."""


_METHODS = {method.encode(): method for method in ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS")}

_KEEP_ALIVE = 1
"""Reply mode bits, per request. The connection stays open after the reply."""
_ECHO_KEEP_ALIVE = 2
"""An HTTP/1.0 client asked for keep-alive: the reply must say `Connection: keep-alive`."""
_NO_BODY = 4
"""A HEAD request: the reply has a Content-Length but no body."""


class Server(Protocol):
    """What a connection reads and updates of the server that accepted it (`transport.HttpServer`): its limits,
    its clock and date of the tick, and the sets it keeps of connections and of tasks in flight. A protocol, so
    that the connection does not import the server that imports it."""

    router: Router
    max_body_bytes: int
    limits: Limits
    connections: set[Connection]
    handshaking: dict[Connection, float]
    tasks: set[asyncio.Task[None]]
    stopping: bool
    timed_out: int
    refusals: Tally
    now: float
    date: bytes

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def port(self) -> int: ...


class Connection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order, a few per turn of the loop.

    Mutable state, all of it dropped when the connection is lost: the bytes of the last read not yet parsed,
    the request being parsed, the requests parsed and waiting, and which of reading and writing are paused.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[tuple[Request | Response, int]] = deque()
        self.queued_bytes = 0
        self.unparsed: bytes | None = None
        self.offset = 0
        self.busy = False
        """A handler's awaitable is running: the requests behind it wait in the queue."""
        self.closing = False
        """The transport is closed or closing: nothing more is read or written."""
        self.refusing = False
        """A refusal is queued: nothing more is read; what was queued before it is still answered, in order,
        then the connection closes."""
        self.read_paused = False
        self.write_paused = False
        self.scheduled = False
        self.paused_at = 0.0
        self.write_paused_at = 0.0
        self.idle_since = server.now
        self.messages = 0
        self.head_started: float | None = None
        self.body_started: float | None = None
        self.head_bytes = 0
        """Bytes of the head being parsed that were fed so far."""
        self.body: list[bytes] = []
        self._reset()

    def _reset(self) -> None:
        """What is known of the request being parsed: reset as each begins."""
        self.url = b""
        self.method = b""
        self.version = "1.1"
        self.hosts = 0
        self.upgrade = False
        self.expect_continue = False
        self.content_length = -1
        self.body_size = 0
        self.refused: Response | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        server = self.server
        server.handshaking.pop(self, None)
        if len(server.connections) >= server.limits.max_connections:
            self.closing = True
            self.transport.close()
            server.refusals.add(server.now, server.limits.max_connections, server.port)
            return
        server.connections.add(self)
        self.idle_since = server.now
        self.transport.set_write_buffer_limits(high=server.limits.write_buffer_limit)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        self._drop()
        # Let go of what refers back to this connection (its transport, the parser calling it back): so it is
        # freed by its reference count, even when the collector has frozen it as long-lived (app.py).
        self.transport = None
        self.parser = httptools.HttpRequestParser(_CLOSED)

    def _drop(self) -> None:
        """Forget everything this connection holds; what its client sent is no longer wanted."""
        self.queue.clear()
        self.queued_bytes = 0
        self.unparsed = None
        self.body = []

    def pause_writing(self) -> None:
        self.write_paused = True
        self.write_paused_at = self.server.now
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._schedule()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.refusing:
            return
        if self.unparsed is not None:  # a transport that delivers after pause_reading: keep it in order
            data = self.unparsed[self.offset :] + data
        self.unparsed, self.offset = data, 0
        self._advance()

    # -- the turn: answer what is queued, parse more when there is room, a bounded amount of both

    def _advance(self) -> None:
        self.scheduled = False
        server = self.server
        limits = server.limits
        queue = self.queue
        handled = 0
        while not self.closing:
            while queue and not self.busy and not self.write_paused:
                if handled == limits.requests_per_turn:
                    self._schedule()
                    self._update_reading()
                    return
                handled += 1
                item, mode = queue.popleft()
                if type(item) is Request:
                    self.queued_bytes -= len(item.body)
                    self._handle(item, mode)
                else:
                    self._write(cast(Response, item), 0)
                if self.closing:
                    return
            if self.unparsed is None or self.refusing or self.write_paused:
                break
            if len(queue) >= limits.max_pipelined or self.queued_bytes >= server.max_body_bytes:
                break
            self._feed()
        if self.read_paused or self.unparsed is not None or self.write_paused or self.refusing:
            self._update_reading()

    def _schedule(self) -> None:
        if not self.scheduled and not self.closing:
            self.scheduled = True
            self.server.loop.call_soon(self._advance)

    def _feed(self) -> None:
        """Feed the parser one slice of the unparsed bytes, cut where the parser will be at a boundary: a head up
        to its blank line (if that comes within SLICE_BYTES, else SLICE_BYTES of it), then a body of known length
        whole, a chunked one SLICE_BYTES at a time. So one feed completes at most one request (or the few that
        fit in SLICE_BYTES after a chunked body), however much the client sent at once, and the slices of a
        head add up to its size: request line, header lines, their CRLFs and the blank line."""
        data = cast(bytes, self.unparsed)
        start = self.offset
        available = len(data) - start
        in_head = self.body_started is None
        if not in_head:
            size = self.content_length - self.body_size if self.content_length >= 0 else SLICE_BYTES
        else:
            since = max(0, start - 3) if self.head_started is not None else start  # its blank line may have begun
            end = data.find(b"\r\n\r\n", since, start + SLICE_BYTES)
            size = end + 4 - start if end >= 0 else SLICE_BYTES
            so_far = self.head_bytes if self.head_started is not None else 0
            if so_far + min(size, available) > self.server.limits.max_header_bytes:
                self._refuse(self._head_too_large())
                return
        if available <= size:
            chunk: bytes | memoryview = data if start == 0 else memoryview(data)[start:]
            self.unparsed = None
        else:
            chunk = memoryview(data)[start : start + size]
            self.offset = start + size
        message = self.messages if self.head_started is not None else -1
        try:
            self.parser.feed_data(chunk)
        except httptools.HttpParserCallbackError:
            if not (self.refusing or self.closing):
                raise
        except httptools.HttpParserUpgrade:  # refused in on_headers_complete; here in case the parser differs
            self._refuse(json_error(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as error:
            self._refuse(json_error(400, f"malformed HTTP request: {error}"))
        if self.head_started is not None:  # the slice ended inside a head: all of it was head
            self.head_bytes = (self.head_bytes if message == self.messages else 0) + len(chunk)

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        pause = self.unparsed is not None or self.write_paused or self.refusing
        if pause and not self.read_paused:
            self.read_paused = True
            self.paused_at = self.server.now
            transport.pause_reading()
        elif not pause and self.read_paused:
            self.read_paused = False
            transport.resume_reading()
            behind = self.server.now - self.paused_at  # the client's clocks stood still while we were behind
            if self.head_started is not None:
                self.head_started += behind
            if self.body_started is not None:
                self.body_started += behind

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._reset()
        self.messages += 1
        self.head_started = self.server.now

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length":
            self.content_length = int(value) if value.isdigit() else -1
            if self.content_length > self.server.max_body_bytes:
                self.refused = self._too_large()
        elif lowered == b"host":
            self.hosts += 1
        elif lowered == b"expect":
            self.expect_continue = value.lower() == b"100-continue"
        elif lowered == b"upgrade":
            self.upgrade = True

    def on_headers_complete(self) -> None:
        self.head_started = None
        parser = self.parser
        self.method = method = parser.get_method()
        if self.refused is not None:
            self._stop(self.refused)
        self.version = version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            self._stop(json_error(505, f"HTTP/{version} is not supported: HTTP/1.1 and HTTP/1.0 only"))
        if self.upgrade or method == b"CONNECT":  # the parser's upgrade needs Connection: upgrade too; ours not
            self._stop(json_error(400, "protocol upgrades and CONNECT are not supported"))
        if self.hosts != 1 and version == "1.1":
            self._stop(json_error(400, f"an HTTP/1.1 request needs exactly one Host header, not {self.hosts}"))
        self.body_started = self.server.now
        if (
            self.expect_continue
            and version == "1.1"
            and not self.busy
            and not self.queue
            and not self.write_paused
            and self.transport is not None
        ):
            # Behind a request in flight the interim answer would come before that one's: leave it out; the
            # client sends the body after its own short wait (Go: ExpectContinueTimeout, 1 s).
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.body_size += len(chunk)
        if self.body_size > self.server.max_body_bytes:  # a chunked body grew past the limit
            self._stop(self._too_large())
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.body_started = None
        mode = 0
        if self.parser.should_keep_alive():
            mode = _KEEP_ALIVE if self.version == "1.1" else _KEEP_ALIVE | _ECHO_KEEP_ALIVE
        method = _METHODS.get(self.method) or self.method.decode("ascii", "replace")
        if method == "HEAD":
            mode |= _NO_BODY
        path = self.url.partition(b"?")[0].decode("utf-8", "replace")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []  # the request holds it now; the connection must not, once it is answered
        self.queue.append((Request(method, path, body), mode))
        self.queued_bytes += len(body)

    # -- refusing

    def _too_large(self) -> Response:
        return json_error(413, f"request body is over the limit of {self.server.max_body_bytes} bytes")

    def _head_too_large(self) -> Response:
        return json_error(431, f"request headers are over the limit of {self.server.limits.max_header_bytes} bytes")

    def _stop(self, response: Response) -> None:
        """From a parser callback: refuse, and stop the parser where it is."""
        self._refuse(response)
        raise _Stop

    def _refuse(self, response: Response) -> None:
        """Answer and close: the rest of what this connection sent cannot be trusted or is unwanted. The answer
        goes after those to the requests queued before it, in order."""
        if self.closing or self.refusing:
            return
        self.refusing = True
        self.unparsed = None
        self.head_started = self.body_started = None
        self.body = []
        self.queue.append((response, 0))

    def expire(self, now: float) -> None:
        """Enforce the deadlines (called by the server's tick): the client's, unless the server is behind."""
        if self.closing or self.transport is None:
            return
        limits = self.server.limits
        if self.write_paused:
            if now - self.write_paused_at > limits.write_timeout:
                self._give_up(f"its client read no reply for {limits.write_timeout:g} s")
                self.transport.abort()  # what it never read goes too
            return
        if self.read_paused:
            return
        if self.body_started is not None:
            if now - self.body_started > limits.body_timeout + self.body_size / limits.body_min_rate:
                self._give_up(f"its request body came slower than {limits.body_min_rate} bytes/s")
                self._refuse(json_error(408, "the request body came too slowly"))
                self._advance()
        elif self.head_started is not None:
            if now - self.head_started > limits.header_timeout:
                self._give_up(f"its request head took longer than {limits.header_timeout:g} s")
                self._refuse(json_error(408, f"the request head took longer than {limits.header_timeout:g} s"))
                self._advance()
        elif not self.busy and not self.queue and now - self.idle_since > limits.idle_timeout:
            self.close()

    def _give_up(self, why: str) -> None:
        self.server.timed_out += 1
        log.debug("closing a connection to port %d: %s", self.server.port, why)

    # -- answering

    def _handle(self, request: Request, mode: int) -> None:
        route, params, exists = self.server.router.resolve(request.method, request.path)
        if route is None:
            self._write(self._not_routed(request, exists), mode)
            return
        if params:
            request = Request(request.method, request.path, request.body, params)
        try:
            response = route.handler(request)
        except Exception as error:
            response = internal_error(f"{route.method} {route.path}", error, log)
        if not isinstance(response, Response):
            self._later(route, response, mode)
            return
        self._write(response, mode)

    def _not_routed(self, request: Request, exists: bool) -> Response:
        message = f"{request.method} {request.path}"
        if not exists:
            return json_error(404, f"{message}: Not Found")
        allow = ", ".join(self.server.router.allowed(request.path))
        return json_error(405, f"{message}: Method Not Allowed", (("Allow", allow),))

    def _later(self, route: Route, pending: Awaitable[Response], mode: int) -> None:
        """Answer when `pending` is done; requests pipelined behind it wait in the queue meanwhile."""
        self.busy = True
        task = self.server.loop.create_task(self._run(route, pending, mode))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _run(self, route: Route, pending: Awaitable[Response], mode: int) -> None:
        try:
            response = await pending
        except Exception as error:
            response = internal_error(f"{route.method} {route.path}", error, log)
        self.busy = False
        self._write(response, mode)  # discarded if the client has gone meanwhile
        self._advance()

    def _write(self, response: Response, mode: int) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        if transport.is_closing():  # a reply could not be sent: the client has gone, and so has what it queued
            self.close()
            return
        keep_alive = mode & _KEEP_ALIVE and not self.server.stopping
        if not keep_alive:
            connection = b"Connection: close\r\n"
        elif mode & _ECHO_KEEP_ALIVE:
            connection = b"Connection: keep-alive\r\n"
        else:
            connection = b""
        if response.headers:
            connection += b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in response.headers)
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s\r\n" % (
            response.status,
            _PHRASES.get(response.status, b"Unknown"),
            response.content_type.encode(),
            len(response.body),
            self.server.date,
            connection,
        )
        transport.write(head if mode & _NO_BODY else head + response.body)
        self.idle_since = self.server.now
        if not keep_alive:
            self.close()

    def close(self) -> None:
        self.closing = True
        self._drop()
        if self.transport is not None:
            self.transport.close()


_PHRASES = {status.value: status.phrase.encode() for status in http.HTTPStatus}
