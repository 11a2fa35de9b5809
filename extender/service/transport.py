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
each a field of the `Limits` HttpServer is built with, whose default is the constant of the same name in
`limits.py`, where its precedent is written:

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
progress (bounded by the accept rate x `handshake_timeout`). The health port (64 KiB bodies, 64 connections:
`health_max_connections`) is thus bounded near 45 MiB; the verbs port by `max_connections` x ~97 MiB at 32 MiB
bodies, and only clients holding the scheduler's certificate get to send it a byte of HTTP. When a connection
closes, all it held is dropped; a handler still running for it finishes, and its reply is discarded.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import ssl
import time

from extender.service.connection import Connection
from extender.service.limits import Limits, Tally
from extender.service.routing import Background, Router

log = logging.getLogger(__name__)

DEFAULT_LIMITS = Limits()


def _chore_ended(chore: asyncio.Task[None]) -> None:
    """A background chore runs until the server stops; one that ends by itself says why, at once (asyncio would
    tell only when the task is collected, if ever), since what it did (expiring reservations, for one) is no
    longer done."""
    if chore.cancelled():
        return
    failure = chore.exception()
    if failure is not None:
        log.error("background task %s stopped", chore.get_name(), exc_info=failure)
    else:
        log.error("background task %s stopped", chore.get_name())


class HttpServer:
    """Serves a Router. Mutable: its connections, tasks in flight, background tasks and counters.

    Every limit but `max_body_bytes` is a field of `limits`, whose default is the constant of the same name
    (and reason) in `limits.py`. The counters (`accepted`, `refused_connections`, `handshake_failures`,
    `timed_out`) are plain ints for the service's metrics to read.
    """

    def __init__(
        self,
        router: Router,
        max_body_bytes: int,
        limits: Limits = DEFAULT_LIMITS,
        background: tuple[Background, ...] = (),
    ) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.background = background
        self.connections: set[Connection] = set()
        self.handshaking: dict[Connection, float] = {}
        """TLS connections accepted whose handshake has not finished, and when they were accepted."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.timed_out = 0
        """Connections closed because a head, a body or a reader missed its deadline (idle ones not counted)."""
        self.accepted = 0
        """Connections accepted (with TLS, each a handshake): a client that does not keep its connections
        open shows here, growing with the requests."""
        self.refusals = Tally("%d connection(s) refused: the cap of %d open connections on port %d was reached")
        self.failed_handshakes = Tally("%d TLS handshake(s) failed or did not finish within %g s on port %d")
        self.now = time.monotonic()
        """The clock of the deadlines, read once a tick: deadlines hold to within a tick."""
        self.date = email.utils.formatdate(usegmt=True).encode()
        deadlines = (
            limits.idle_timeout,
            limits.header_timeout,
            limits.body_timeout,
            limits.write_timeout,
            limits.handshake_timeout,
        )
        self.tick = min(1.0, min(deadlines) / 2)
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
            ssl_handshake_timeout=self.limits.handshake_timeout if tls else None,
        )
        self._chores = [loop.create_task(self._tick(), name="http-tick")]
        self._chores += [
            loop.create_task(job(), name=getattr(job, "__name__", "background")) for job in self.background
        ]
        for chore in self._chores:
            chore.add_done_callback(_chore_ended)

    def _accept(self, tls: bool) -> Connection:
        """A protocol for a connection just accepted; with TLS, before its handshake."""
        connection = Connection(self)
        self.accepted += 1
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
            self.refusals.flush(now, self.limits.max_connections, self.port)
            self.failed_handshakes.flush(now, self.limits.handshake_timeout, self.port)

    def _expire_handshakes(self, now: float) -> None:
        """Handshakes unfinished past their timeout (plus a tick) have failed: asyncio has closed them unseen."""
        late = now - self.limits.handshake_timeout - self.tick
        if not self.handshaking or min(self.handshaking.values()) > late:
            return
        for connection, accepted in list(self.handshaking.items()):
            if accepted <= late:
                del self.handshaking[connection]
                self.failed_handshakes.add(now, self.limits.handshake_timeout, self.port)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let requests in flight finish (up to `grace` seconds), close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for chore in self._chores:
            chore.cancel()
        if self._chores:  # waited, not awaited: a chore that failed was logged when it ended (`_chore_ended`)
            await asyncio.wait(self._chores)
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
