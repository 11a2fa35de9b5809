"""The HTTP edge's limits: every deadline, size and cap of the transport, each with the precedent that sizes
it written right above it (h11's habit). Each is the default of the `Limits` field of the same name, which
`HttpServer` is built with; why each exists is in `transport.py`'s docstring.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

# Refusals are the transport's events: logged under its name, where operators look for them.
log = logging.getLogger("extender.service.transport")

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
class Limits:
    """The limits one listener is built with (settings turn into these; tests shorten the deadlines)."""

    max_connections: int = MAX_CONNECTIONS
    max_header_bytes: int = MAX_HEADER_BYTES
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    body_min_rate: float = BODY_MIN_RATE
    idle_timeout: float = IDLE_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    max_pipelined: int = MAX_PIPELINED
    requests_per_turn: int = REQUESTS_PER_TURN
    write_buffer_limit: int = WRITE_BUFFER_LIMIT


class Tally:
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
