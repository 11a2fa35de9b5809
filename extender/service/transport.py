"""A lean HTTP/1.1 server on asyncio and httptools: the transport under `verbs.py`.

Why hand-written, not aiohttp's server or uvicorn: it is measured (`python -m bench.transport`: a null handler,
filter-sized requests of 1,000 node names, ~25 KB POSTs, 8 keep-alive clients over loopback, uvloop under
every server; on a 2-core VM):

    server                                          req/s   server CPU µs/request
    this transport before issue 10 (c9c8227)       72,100   12.6
    this transport, hardened (below)               66,600   14.7
    uvicorn 0.54.0 (httptools, bare ASGI)          36,200   26.8

(2 cores, Xeon; the clients share them, so req/s is what this machine reached, while server CPU per request
is what one core pays; medians of 7 interleaved runs.) The hardening costs ~2 µs a request; uvicorn costs
~12 µs more, 1.8 times as much. A filter over 1,000 names does about 200 µs of its own work, so against
uvicorn the transport is worth ~6 % of filter throughput: less than the ~10 % issue 10 measured with wrk
(18 against 37 µs), but it stays, also because uvicorn 0.54 has no deadline for a request's head or body
(its only timeout is keep-alive, cancelled by the first byte), which this edge needs (DESIGN §8). aiohttp's
server measured ~60 µs a request (issue 10); aiohttp stays the client (demo, tests).

What it does: HTTP/1.0 and 1.1; keep-alive (echoed to an HTTP/1.0 client that asks for it); `Content-Length`
and chunked request bodies; `Expect: 100-continue` (HTTP/1.1 only); pipelined requests answered in order;
TLS, and so mutual TLS, through the SSL context given; a graceful stop that finishes requests in flight. A
handler runs inline and answers a Response; one that must wait (bind always, a filter that re-reads the API
rarely) answers an awaitable of its Response instead, which then runs as a task while the requests pipelined
behind it wait their turn.

What it never does: HTTP/2 or upgrades (an `Upgrade` or `CONNECT` request gets one 400 and the connection
closes; ALPN offers only http/1.1), compression, more than one response to a request, or answering with a
traceback: a handler that raises is logged and answered 500 with a one-line JSON error. Above all it never
lets one client hold the event loop or grow memory without bound (DESIGN §8): the extender sits on
kube-scheduler's critical path, so a stalled loop stalls every GPU pod in the cluster. Hence these limits,
each a keyword argument of HttpServer whose default is the constant of the same name below, where its
precedent is written:

- Work per turn of the loop: what a client sent is fed to the parser a slice at a time, each ending where a
  head or a body ends, so one feed completes one request; at most `requests_per_turn` requests are answered
  before the connection yields to the others (the rest follow from `loop.call_soon`). A client pipelining
  thousands of requests delays the others by a few handlers, not by thousands.
- Reading stops while a connection holds what it cannot yet use: bytes of the last read not yet parsed (at
  most `max_pipelined` requests, or `max_body_bytes` of their bodies, wait behind a handler), or replies
  above the write buffer's high-water mark (`write_buffer_limit`, through `pause_writing`/`resume_writing`).
  A client that pipelines and never reads stops being read; past `write_timeout` it is dropped with its
  unsent replies. A reply that cannot be sent (the client has gone) drops everything the connection queued.
- Deadlines that no byte resets: a request's head must arrive within `header_timeout` of its first byte; its
  body at `body_min_rate` bytes/s on average after a grace of `body_timeout`; a connection idle between
  requests is closed after `idle_timeout`; a TLS handshake must finish within `handshake_timeout`. A late
  head or body is answered 408 and closed. A client's clocks stop while the server, not the client, is
  behind. They are checked once per tick (a second), so they hold to within a tick.
- Sizes: the head (request line, header lines, their CRLFs and the blank line) to `max_header_bytes`, else
  431; a body to `max_body_bytes`, else 413 (refused from `Content-Length` before it is read).
- Connections: at most `max_connections` per listener; one over the cap is closed at once, counted
  (`refused_connections`) and logged at most once a minute with how many. Connections still in their TLS
  handshake are not held against the cap (asyncio tells the protocol nothing before the handshake is done,
  and counting them would let a handshake flood lock kube-scheduler out); `handshake_timeout` bounds them,
  and those that never finish are counted (`handshake_failures`) and logged the same way, once their timeout
  has passed: asyncio reports a failed handshake to no one (a debug log only), so a handshake refused for a
  missing client certificate is told from a slow one only by the clock.

Memory, at worst, per connection: the last read not yet parsed (asyncio and uvloop read at most 256 KiB at
once); the head being parsed (`max_header_bytes`, and the URL as long again); one body being received, the
bodies of the requests queued behind a handler (reading stops once they reach `max_body_bytes`, so under
twice that with the one being received) and the body the handler holds: 3 x `max_body_bytes` in all; and
the replies above `write_buffer_limit` of one turn. About 3 x `max_body_bytes` + 450 KiB + 4 replies. Per
process: `max_connections` times that, per listener, plus asyncio's 256 KiB buffer per TLS handshake in
progress (bounded by the accept rate x `handshake_timeout`). The health port (64 KiB bodies, 512 connections)
is thus bounded near 400 MiB; the verbs port by `max_connections` x ~97 MiB at 32 MiB bodies, and only
clients holding the scheduler's certificate get to send it a byte of HTTP. When a connection closes, all it
held is dropped; a handler still running for it finishes, and its reply is discarded.
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

# --- limits: each a constructor parameter of HttpServer; the precedent that sizes it right above it -------

# The whole head: request line, header lines, their CRLFs and the blank line (so 16,000 `X: v` lines are 96 KB,
# not the 32 KB of their names and values). Precedents:
# Go's net/http 1 MiB (DefaultMaxHeaderBytes); node.js 16 KiB (80 KiB before 2018); IIS 16 KiB; h11 16 KiB;
# nginx 4 lines of 8 KiB; Tomcat and Apache 8 KiB. kube-scheduler's requests carry under 1 KiB of head; 64 KiB
# leaves room for what a proxy adds.
MAX_HEADER_BYTES = 64 * 1024

# Requests parsed and waiting behind a handler that awaits (bind). uvicorn reads no further than one request
# ahead; h11 parses one at a time. Go's client, kube-scheduler's, never pipelines, so this only bounds what a
# pipelining client gets buffered.
MAX_PIPELINED = 16

# Requests answered in one turn of the event loop before the connection yields to the others. uvicorn runs each
# request as its own task, so one a turn. A filter over 1,000 names costs ~200 µs, so four keep a turn near
# 1 ms while sparing the loop a `call_soon` for every pipelined request.
REQUESTS_PER_TURN = 4

# Bytes fed to the parser at once where the next boundary is unknown: a head whose blank line is not within
# them, or a chunked body. Heads are cut at their blank line and bodies of known length at their last byte,
# so a feed completes one request; a slice after a chunked body, at most SLICE_BYTES / 18 (`GET / HTTP/1.0`
# and two CRLFs), however much the client sent. kube-scheduler's heads are under 1 KiB: one slice each.
SLICE_BYTES = 2048

# Replies buffered for a client before the connection stops reading its requests: asyncio's and uvloop's
# default high-water mark, and uvicorn's HIGH_WATER_LIMIT (64 KiB).
WRITE_BUFFER_LIMIT = 64 * 1024

# Seconds a connection may keep replies above the high-water mark (its client not reading) before it is
# dropped. nginx: send_timeout 60 s between two writes; kube-scheduler gives up on a reply after its
# httpTimeout (5 s in manifests/), so a reader this slow is gone or hostile.
WRITE_TIMEOUT = 30.0

# Seconds from a request's first byte to the end of its head. Apache (mod_reqtimeout): 20 s, up to 40;
# kube-apiserver: 32 s (ReadHeaderTimeout); nginx: 60 s (client_header_timeout). kube-scheduler sends its head
# in one write and waits 5 s for the reply, so 10 s is generous.
HEADER_TIMEOUT = 10.0

# A body must arrive at BODY_MIN_RATE bytes/s on average after a grace of BODY_TIMEOUT seconds, Apache's
# mod_reqtimeout rule (its default: body=20,MinRate=500). The rate is far below any cluster network (a 25 MB
# `Nodes` list at 1 MiB/s takes 25 s, five times kube-scheduler's patience), so only a stalling client meets it.
BODY_TIMEOUT = 10.0
BODY_MIN_RATE = 1024 * 1024

# Seconds an idle keep-alive connection is kept: nginx's keepalive_timeout (75 s). Go's client keeps its idle
# connections 90 s and retries a request that meets a closed one.
IDLE_TIMEOUT = 75.0

# Seconds for a TLS handshake. asyncio and nginx allow 60 s; kube-scheduler on the cluster network needs
# milliseconds, and an unfinished handshake holds a file descriptor that the connection cap does not count.
HANDSHAKE_TIMEOUT = 10.0

# Open connections per listener. nginx's default worker_connections is 512. kube-scheduler opens a handful
# (one per bind in flight at most); kubelet's probes and Prometheus one each. The cap keeps one listener's
# clients from taking every file descriptor (`ulimit -n` is often 1,024) from the other's.
MAX_CONNECTIONS = 512

LOG_EVERY = 60.0
"""Seconds between two log lines about refused connections or failed handshakes (each says how many)."""


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
    headers: tuple[tuple[str, str], ...] = ()
    """Further header lines (`Allow` of a 405); Content-Type, Content-Length, Date and Connection are written
    by the transport."""


def json_error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, orjson.dumps({"Error": message}), headers=headers)


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
        methods, params = self._methods(path)
        if methods is None:
            return None, params, False
        return methods.get(method), params, True

    def allowed(self, path: str) -> tuple[str, ...]:
        """The methods `path` answers (the `Allow` header of a 405), sorted; none for an unknown path."""
        methods, _ = self._methods(path)
        return tuple(sorted(methods or ()))

    def _methods(self, path: str) -> tuple[dict[str, Route] | None, dict[str, str]]:
        methods = self._exact.get(path)
        if methods is not None:
            return methods, {}
        prefix, _, last = path.rpartition("/")
        found = self._prefixed.get(prefix + "/") if last else None
        if found is None:
            return None, {}
        name, methods = found
        return methods, {name: last}


class _Stop(Exception):
    """Raised from a parser callback once the request is refused: the parser must read no further."""


_METHODS = {method.encode(): method for method in ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS")}

_KEEP_ALIVE = 1
"""Reply mode bits, per request. The connection stays open after the reply."""
_ECHO_KEEP_ALIVE = 2
"""An HTTP/1.0 client asked for keep-alive: the reply must say `Connection: keep-alive`."""
_NO_BODY = 4
"""A HEAD request: the reply has a Content-Length but no body."""


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order, a few per turn of the loop.

    Mutable state, all of it dropped when the connection is lost: the bytes of the last read not yet parsed,
    the request being parsed, the requests parsed and waiting, and which of reading and writing are paused.
    """

    def __init__(self, server: HttpServer) -> None:
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
        if len(server.connections) >= server.max_connections:
            self.closing = True
            self.transport.close()
            server.refusals.add(server.now, server.max_connections, server.port)
            return
        server.connections.add(self)
        self.idle_since = server.now
        self.transport.set_write_buffer_limits(high=server.write_buffer_limit)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        self._drop()

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
        queue = self.queue
        handled = 0
        while not self.closing:
            while queue and not self.busy and not self.write_paused:
                if handled == server.requests_per_turn:
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
            if len(queue) >= server.max_pipelined or self.queued_bytes >= server.max_body_bytes:
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
            if so_far + min(size, available) > self.server.max_header_bytes:
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
        return json_error(431, f"request headers are over the limit of {self.server.max_header_bytes} bytes")

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
        server = self.server
        if self.write_paused:
            if now - self.write_paused_at > server.write_timeout:
                self._give_up(f"its client read no reply for {server.write_timeout:g} s")
                self.transport.abort()  # what it never read goes too
            return
        if self.read_paused:
            return
        if self.body_started is not None:
            if now - self.body_started > server.body_timeout + self.body_size / server.body_min_rate:
                self._give_up(f"its request body came slower than {server.body_min_rate} bytes/s")
                self._refuse(json_error(408, "the request body came too slowly"))
                self._advance()
        elif self.head_started is not None:
            if now - self.head_started > server.header_timeout:
                self._give_up(f"its request head took longer than {server.header_timeout:g} s")
                self._refuse(json_error(408, f"the request head took longer than {server.header_timeout:g} s"))
                self._advance()
        elif not self.busy and not self.queue and now - self.idle_since > server.idle_timeout:
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
            response = _unexpected(route, error)
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
            response = _unexpected(route, error)
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


def _unexpected(route: Route, error: Exception) -> Response:
    log.error("%s %s: unexpected failure", route.method, route.path, exc_info=error)
    return json_error(500, f"internal error in {route.method} {route.path}: {type(error).__name__}: {error}")


class _Tally:
    """Counts one kind of refusal, and logs it at most once per LOG_EVERY seconds with how many came since."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.count = 0
        self.unlogged = 0
        self.logged_at = float("-inf")

    def add(self, now: float, *args: object) -> None:
        self.count += 1
        self.unlogged += 1
        self.flush(now, *args)

    def flush(self, now: float, *args: object) -> None:
        if self.unlogged and now - self.logged_at >= LOG_EVERY:
            log.warning(self.message, self.unlogged, *args)
            self.unlogged = 0
            self.logged_at = now


class HttpServer:
    """Serves a Router. Mutable: its connections, tasks in flight, background tasks and counters.

    Every limit is a keyword argument whose default is the module constant of the same name (and reason).
    The counters (`refused_connections`, `handshake_failures`, `timed_out`) are plain ints for the service's
    metrics to read.
    """

    def __init__(
        self,
        router: Router,
        max_body_bytes: int,
        idle_timeout: float = IDLE_TIMEOUT,
        background: tuple[Background, ...] = (),
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_header_bytes: int = MAX_HEADER_BYTES,
        header_timeout: float = HEADER_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
        body_min_rate: float = BODY_MIN_RATE,
        write_timeout: float = WRITE_TIMEOUT,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_pipelined: int = MAX_PIPELINED,
        requests_per_turn: int = REQUESTS_PER_TURN,
        write_buffer_limit: int = WRITE_BUFFER_LIMIT,
    ) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.idle_timeout = idle_timeout
        self.background = background
        self.max_connections = max_connections
        self.max_header_bytes = max_header_bytes
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.body_min_rate = body_min_rate
        self.write_timeout = write_timeout
        self.handshake_timeout = handshake_timeout
        self.max_pipelined = max_pipelined
        self.requests_per_turn = requests_per_turn
        self.write_buffer_limit = write_buffer_limit
        self.connections: set[_Connection] = set()
        self.handshaking: dict[_Connection, float] = {}
        """TLS connections accepted whose handshake has not finished, and when they were accepted."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.timed_out = 0
        """Connections closed because a head, a body or a reader missed its deadline (idle ones not counted)."""
        self.refusals = _Tally("%d connection(s) refused: the cap of %d open connections on port %d was reached")
        self.failed_handshakes = _Tally("%d TLS handshake(s) failed or did not finish within %g s on port %d")
        self.now = time.monotonic()
        """The clock of the deadlines, read once a tick: deadlines hold to within a tick."""
        self.date = email.utils.formatdate(usegmt=True).encode()
        self.tick = min(1.0, min(idle_timeout, header_timeout, body_timeout, write_timeout, handshake_timeout) / 2)
        """Seconds between two checks of the deadlines: a second, or less when a deadline is shorter (tests)."""
        self._server: asyncio.Server | None = None
        self._chores: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def refused_connections(self) -> int:
        """Connections closed at once because the listener had `max_connections` open."""
        return self.refusals.count

    @property
    def handshake_failures(self) -> int:
        """TLS connections whose handshake failed or did not finish within `handshake_timeout`."""
        return self.failed_handshakes.count

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "not started"
        return self._loop

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int, context: ssl.SSLContext | None = None) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self.now = time.monotonic()
        tls = context is not None
        self._server = await loop.create_server(
            lambda: self._accept(tls),
            host,
            port,
            ssl=context,
            backlog=1024,
            ssl_handshake_timeout=self.handshake_timeout if tls else None,
        )
        self._chores = [loop.create_task(self._tick(), name="http-tick")]
        self._chores += [
            loop.create_task(job(), name=getattr(job, "__name__", "background")) for job in self.background
        ]

    def _accept(self, tls: bool) -> _Connection:
        """A protocol for a connection just accepted; with TLS, before its handshake."""
        connection = _Connection(self)
        if tls:
            self.handshaking[connection] = self.now
        return connection

    async def _tick(self) -> None:
        """Every tick: the clock, the Date header, the deadlines, and the logs of refusals."""
        date_at = 0.0
        while True:
            await asyncio.sleep(self.tick)
            self.now = now = time.monotonic()
            if now - date_at >= 1.0:
                self.date = email.utils.formatdate(usegmt=True).encode()
                date_at = now
            for connection in list(self.connections):
                connection.expire(now)
            self._expire_handshakes(now)
            self.refusals.flush(now, self.max_connections, self.port)
            self.failed_handshakes.flush(now, self.handshake_timeout, self.port)

    def _expire_handshakes(self, now: float) -> None:
        """Handshakes unfinished past their timeout (plus a tick) have failed: asyncio has closed them unseen."""
        late = now - self.handshake_timeout - self.tick
        if not self.handshaking or min(self.handshaking.values()) > late:
            return
        for connection, accepted in list(self.handshaking.items()):
            if accepted <= late:
                del self.handshaking[connection]
                self.failed_handshakes.add(now, self.handshake_timeout, self.port)

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
            if not connection.busy:
                connection.close()
        if self.tasks:
            _, late = await asyncio.wait(set(self.tasks), timeout=grace)
            for task in late:
                task.cancel()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        self.handshaking.clear()
        if self._server is not None:
            await self._server.wait_closed()
