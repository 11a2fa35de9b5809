"""The request framing, fuzzed (hypothesis) against an independent HTTP/1.1 implementation: h11.

Each example is a sequence of requests (methods, paths, headers, Content-Length and chunked bodies, some
malformed), pipelined on one connection and cut into arbitrary pieces, ending with a sentinel request that
closes. h11's server-side Connection reads the same bytes and says where each request ends and where the
stream stops being HTTP; the transport must agree: every request h11 reads is answered, in order, with the
status the routes give it (and /echo reports the body h11 saw); at the first request h11 refuses, one 4xx
and the connection closes; after a request that does not keep the connection alive, it closes.

Where RFC 9112 lets a server choose and the transport chooses otherwise than h11, the model below says so:
the transport refuses any `Upgrade` or `CONNECT` (one 400, then close: it never switches protocols), a
request with both `Content-Length` and `Transfer-Encoding` (§6.1: a server MAY reject it; h11 follows
Transfer-Encoding), and bodies over its limit (413). Inputs where the two may legitimately differ (a bare LF
line end, empty lines before a request line, HTTP/1.0 keep-alive, which h11 does not implement) are not
generated; those behaviours have their own tests in test_transport.py.

Deterministic (`derandomize=True`) and quick: one server for all examples, in a thread of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import h11
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from extender.service.routing import Request, Response, Router
from extender.service.transport import HttpServer

LIMIT = 1024
SENTINEL = b"GET /items/sentinel HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
RESERVED = {"content-length", "transfer-encoding", "host", "connection", "upgrade", "expect", "te", "trailer"}
"""Header names the generator writes on purpose only: an extra header must not change the framing by chance."""


def echo(request: Request) -> Response:
    return Response(200, orjson.dumps({"size": len(request.body), "body": request.body.decode("latin-1")}))


def item(request: Request) -> Response:
    return Response(200, orjson.dumps({"name": request.params["name"]}))


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """One server for every example, on an event loop in a thread of its own."""
    router = Router()
    router.add("POST", "/echo", echo)
    router.add("GET", "/items/{name}", item)
    loop = asyncio.new_event_loop()
    server = HttpServer(router, max_body_bytes=LIMIT)
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start("127.0.0.1", 0))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(5)
    yield server.port
    asyncio.run_coroutine_threadsafe(server.stop(grace=1.0), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


# --- generating requests ----------------------------------------------------------------------------------


TOKEN = st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=10).filter(
    lambda name: name.lower() not in RESERVED
)
VALUE = st.text(string.ascii_letters + string.digits + " -_.;=/,", max_size=20).map(str.strip)
BODY = st.binary(max_size=LIMIT + 64).map(lambda data: bytes(byte % 94 + 33 for byte in data))
CHUNK = st.binary(min_size=1, max_size=400).map(lambda data: bytes(byte % 94 + 33 for byte in data))
FLAWS = ["no-host", "two-hosts", "upgrade", "connect", "bad-name", "both", "bad-length", "bad-chunk", "gzip"]
"""What makes a request unreadable (or refused by choice): one request in ten carries one."""


def framing(draw: st.DrawFn, flaw: str | None) -> tuple[list[bytes], bytes]:
    """The body headers of a request and its body as sent."""
    if flaw == "bad-length":
        return [b"Content-Length: " + draw(st.sampled_from([b"abc", b"-1", b"1 2", b"0x10", b""]))], b""
    if flaw == "gzip":
        return [b"Transfer-Encoding: gzip"], b""
    kind = "chunked" if flaw == "bad-chunk" else draw(st.sampled_from(["none", "length", "length", "chunked"]))
    if kind == "none":
        return [], b""
    if kind == "length" or flaw == "both":
        body = draw(BODY)
        if flaw == "both":
            return [b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked"], b"%x\r\n%s\r\n0\r\n\r\n" % (
                len(body),
                body,
            )
        return [b"Content-Length: %d" % len(body)], body
    chunks = draw(st.lists(CHUNK, max_size=4))
    wire = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    if flaw == "bad-chunk":
        wire += b"zz\r\nxx\r\n"
    return [b"Transfer-Encoding: chunked"], wire + b"0\r\n\r\n"


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    flaw = draw(st.sampled_from(FLAWS)) if draw(st.integers(0, 9)) == 0 else None
    method = b"CONNECT" if flaw == "connect" else draw(st.sampled_from([b"GET", b"POST", b"POST", b"PUT", b"DELETE"]))
    target = draw(st.sampled_from([b"/echo", b"/items/gpu-1", b"/items/", b"/nowhere", b"/echo?x=1", b"/items/a?b"]))
    version = b"HTTP/1.0" if draw(st.integers(0, 11)) == 0 and flaw not in ("no-host", "two-hosts") else b"HTTP/1.1"
    lines = [method + b" " + target + b" " + version]
    hosts = {"no-host": 0, "two-hosts": 2}.get(flaw or "", 1)
    lines += [b"Host: example"] * hosts
    lines += [f"{name}: {value}".encode() for name, value in draw(st.lists(st.tuples(TOKEN, VALUE), max_size=4))]
    if version == b"HTTP/1.1" and draw(st.integers(0, 11)) == 0:
        lines.append(b"Connection: close")
    if draw(st.integers(0, 9)) == 0:
        lines.append(b"Expect: 100-continue")
    if flaw == "upgrade":
        lines += [b"Connection: Upgrade", b"Upgrade: websocket"]
    elif flaw == "bad-name":
        lines.append(b"Bad Name: v")
    headers, wire = framing(draw, flaw)
    lines += headers
    order = draw(st.permutations(range(1, len(lines))))
    head = [lines[0], *(lines[index] for index in order)]
    return b"\r\n".join(head) + b"\r\n\r\n" + wire


# --- what h11 makes of the bytes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    statuses: tuple[int, ...]
    """Exact statuses; 0 stands for "any 4xx" (h11's error, which the transport need not word alike)."""
    echoed: tuple[bytes | None, ...]
    """For each answer to POST /echo, the body h11 read."""


def status_of(method: bytes, target: bytes) -> int:
    path = target.partition(b"?")[0]
    if path == b"/echo":
        return 200 if method == b"POST" else 405
    if path.startswith(b"/items/") and path != b"/items/":
        return 200 if method == b"GET" else 405
    return 404


def oracle(stream: bytes) -> Expected:
    """What h11's server makes of `stream`, with the transport's deliberate choices (module docstring)."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    connection.receive_data(stream)
    statuses: list[int] = []
    echoed: list[bytes | None] = []
    request: h11.Request | None = None
    body = b""
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError:
            statuses.append(0)
            echoed.append(None)
            break
        if event is h11.NEED_DATA or event is h11.PAUSED:
            break  # the sentinel closes, so h11 reads no further than the transport
        if isinstance(event, h11.Request):
            request, body = event, b""
            headers = {name.lower() for name, _ in event.headers}
            if event.method == b"CONNECT" or b"upgrade" in headers:
                statuses.append(400)
                echoed.append(None)
                break
            if b"content-length" in headers and b"transfer-encoding" in headers:
                statuses.append(400)
                echoed.append(None)
                break
            length = next((int(value) for name, value in event.headers if name == b"content-length"), 0)
            if length > LIMIT:
                statuses.append(413)
                echoed.append(None)
                break
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > LIMIT:  # a chunked body that grew past the limit
                statuses.append(413)
                echoed.append(None)
                break
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            status = status_of(request.method, request.target)
            statuses.append(status)
            echoed.append(body if status == 200 and request.target.startswith(b"/echo") else None)
            connection.send(h11.Response(status_code=status, headers=[("Content-Length", "0")]))
            connection.send(h11.EndOfMessage())
            if connection.our_state is h11.MUST_CLOSE:
                break
            connection.start_next_cycle()
    return Expected(tuple(statuses), tuple(echoed))


# --- what the transport answers ---------------------------------------------------------------------------


def exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send the pieces (each its own write), then read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(0.0005)  # lets a piece arrive as a read of its own, most of the time
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused and closed before the end: what it answered is still to be read
        received = bytearray()
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return bytes(received)


def parse_responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Every response in `data`, interim 100 Continue left out; each must be whole and Content-Length framed."""
    responses = []
    while data:
        head, separator, data = data.partition(b"\r\n\r\n")
        assert separator, f"a truncated response head: {head[:200]!r}"
        status_line, *header_lines = head.split(b"\r\n")
        status = int(status_line.split()[1])
        if status == 100:
            continue
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(b":") for line in header_lines)}
        length = int(headers[b"content-length"])
        assert len(data) >= length, "a truncated response body"
        responses.append((status, headers, data[:length]))
        data = data[length:]
    return responses


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({point % (len(stream) + 1) for point in points} | {0, len(stream)})
    return [stream[start:end] for start, end in itertools.pairwise(edges) if end > start]


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sequence=st.lists(requests(), min_size=1, max_size=8),
    points=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=6),
)
def test_the_transport_frames_requests_as_h11_does(port: int, sequence: list[bytes], points: list[int]) -> None:
    stream = b"".join(sequence) + SENTINEL
    expected = oracle(stream)
    event(f"{len(expected.statuses)} answers, the last {expected.statuses[-1] or '4xx'}")
    responses = parse_responses(exchange(port, cut(stream, points)))
    statuses = [status for status, _, _ in responses]
    assert len(statuses) == len(expected.statuses), (statuses, expected.statuses)
    for got, want in zip(statuses, expected.statuses, strict=True):
        assert got == want if want else 400 <= got < 500, (statuses, expected.statuses)
    for (_, _, body), echoed in zip(responses, expected.echoed, strict=True):
        if echoed is not None:
            assert orjson.loads(body)["body"].encode("latin-1") == echoed
    assert responses[-1][1].get(b"connection") == b"close"  # and exchange() read to the end: it closed
