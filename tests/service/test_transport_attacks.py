"""The transport under attack (issue 10): what a client that pipelines without reading, dribbles, stalls,
floods connections or handshakes can do to the others. Each test is the reproduction of one row of the issue.

Deadlines are short (tenths of a second) and passed to the server; no test asserts how long anything took:
each waits, within a generous bound, for the outcome it expects.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable

import pytest
import trustme

from extender.service.limits import MAX_PIPELINED, SLICE_BYTES, Limits
from extender.service.routing import Request, Response, Router
from extender.service.transport import HttpServer
from tests.service.test_transport import read_response

DEADLINE = 0.2
"""Seconds: every deadline of the server under test."""
REPLY = b"r" * 8192
"""What a cheap GET answers: 8 KiB, so a client that never reads fills the kernel's buffers quickly."""
FLOOD_REQUEST = b"GET /cheap HTTP/1.1\r\nHost: x\r\n\r\n"
FLOOD = FLOOD_REQUEST * (272_000 // len(FLOOD_REQUEST))
"""~272 KB of pipelined GETs, as in row D1 of the issue: about 8,500 requests."""
SHORTEST_REQUEST = len(b"GET / HTTP/1.0\r\n\r\n")


class Calls:
    def __init__(self) -> None:
        self.cheap = 0
        self.cheap_when_other_answered = -1


@pytest.fixture
async def calls() -> Calls:
    return Calls()


@pytest.fixture
async def server(calls: Calls) -> AsyncIterator[HttpServer]:
    gate = asyncio.Event()

    def cheap(request: Request) -> Response:
        calls.cheap += 1
        return Response(200, REPLY, "text/plain")

    def other(request: Request) -> Response:
        calls.cheap_when_other_answered = calls.cheap
        return Response(200, b"{}")

    async def slow(request: Request) -> Response:
        await gate.wait()
        return Response(200, b"{}")

    router = Router()
    router.add("GET", "/cheap", cheap)
    router.add("GET", "/other", other)
    router.add("GET", "/slow", slow)
    router.add("POST", "/upload", lambda request: Response(200, b"{}"))
    limits = Limits(
        idle_timeout=5.0,
        header_timeout=DEADLINE,
        body_timeout=DEADLINE,
        body_min_rate=1e6,
        write_timeout=DEADLINE,
        max_connections=8,
    )
    server = HttpServer(router, max_body_bytes=1024, limits=limits)
    server.gate = gate  # type: ignore[attr-defined]
    await server.start("127.0.0.1", 0)
    yield server
    gate.set()
    await server.stop(grace=1.0)


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Wait until `condition()` holds; fail if it does not within `within` seconds (a bound, not a measure)."""
    for _ in range(int(within / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def connect_not_reading(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client whose receive buffer is small and which never reads: what it is sent piles up at the server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def test_a_pipelining_client_that_never_reads_does_not_hold_up_another(server: HttpServer, calls: Calls) -> None:
    """D1: before, the whole read (thousands of requests) was answered before anyone else was heard."""
    reader, writer = await connect(server)
    _, flood = await connect_not_reading(server.port)
    flood.write(FLOOD)
    writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, _ = await read_response(reader)
    assert status == 200
    assert 0 <= calls.cheap_when_other_answered < 100  # of ~8,500 pipelined; a few turns' worth
    flood.close()
    writer.close()


async def test_replies_a_client_does_not_read_stop_its_reading_and_stay_bounded(
    server: HttpServer, calls: Calls
) -> None:
    """D1, memory: before, every reply was buffered (~70 MB for this flood) and every request read."""
    _, flood = await connect_not_reading(server.port)
    flood.write(FLOOD)
    await eventually(lambda: any(connection.write_paused for connection in server.connections))
    (connection,) = server.connections
    assert connection.transport is not None
    buffered = connection.transport.get_write_buffer_size()
    assert buffered <= server.limits.write_buffer_limit + server.limits.requests_per_turn * (len(REPLY) + 200)
    assert len(connection.queue) <= MAX_PIPELINED + SLICE_BYTES // SHORTEST_REQUEST
    assert calls.cheap < len(FLOOD) // len(FLOOD_REQUEST)
    answered = calls.cheap
    await asyncio.sleep(0.05)
    assert calls.cheap == answered  # nothing more is answered while the client reads nothing
    flood.close()


async def test_a_client_that_never_reads_its_replies_is_dropped_after_the_write_timeout(
    server: HttpServer,
) -> None:
    _, flood = await connect_not_reading(server.port)
    flood.write(FLOOD)
    await eventually(lambda: any(connection.write_paused for connection in server.connections))
    await eventually(lambda: not server.connections)
    assert server.timed_out == 1
    flood.close()


async def test_requests_queued_by_a_client_that_has_gone_are_not_answered(server: HttpServer, calls: Calls) -> None:
    """D1, recovery: before, everything a gone client had pipelined was still processed. Its requests wait
    behind a slow one, with reading paused (so its going is not seen yet); once the slow one is answered, the
    first reply that cannot be sent stops the rest: at most a turn's worth is done for no one."""
    _, writer = await connect(server)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + FLOOD_REQUEST * 200)
    await eventually(lambda: bool(server.tasks))
    writer.transport.abort()
    await asyncio.sleep(0.01)
    server.gate.set()  # type: ignore[attr-defined]
    await eventually(lambda: not server.connections)
    assert calls.cheap <= server.limits.requests_per_turn


async def test_a_flood_from_a_client_that_closed_is_mostly_not_processed(server: HttpServer, calls: Calls) -> None:
    _, writer = await connect(server)
    writer.write(FLOOD_REQUEST * 2000)
    writer.transport.abort()
    await eventually(lambda: not server.connections)
    await asyncio.sleep(0.01)
    assert calls.cheap < 1000  # before: all 2,000, in the turn that read them


async def test_a_head_sent_a_byte_at_a_time_is_cut_at_the_header_deadline(server: HttpServer) -> None:
    """D4: before, every byte reset the idle clock, so a head could take forever."""
    reader, writer = await connect(server)
    writer.write(b"GET /cheap HTTP/1.1\r\nHost: x\r\n")
    status_line = b""
    for _ in range(200):
        writer.write(b"X")
        try:
            status_line = await asyncio.wait_for(reader.readline(), 0.05)
            break
        except TimeoutError:
            continue
    assert status_line.startswith(b"HTTP/1.1 408 ")
    assert server.timed_out == 1


async def test_a_body_that_stalls_halfway_is_cut_at_the_body_deadline(server: HttpServer) -> None:
    """D4: a declared body, half sent, then nothing: 408 once the grace and the minimum rate are spent."""
    reader, writer = await connect(server)
    writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 500)
    status, headers, _ = await read_response(reader)
    assert (status, headers["connection"]) == (408, "close")
    assert await reader.read() == b""


async def test_a_connection_that_never_sends_a_byte_is_closed_as_idle_not_before(server: HttpServer) -> None:
    """Before its first byte a connection is idle: the idle timeout applies, not the header deadline."""
    reader, writer = await connect(server)
    await asyncio.sleep(DEADLINE * 3)
    writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, _ = await read_response(reader)
    assert status == 200
    writer.close()


async def test_connections_over_the_cap_are_closed_at_once_counted_and_logged_once(
    server: HttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    """D4: before, connections were unlimited, and refusing them was silent."""
    caplog.set_level(logging.WARNING, "extender.service.transport")
    held = [await connect(server) for _ in range(server.limits.max_connections)]
    await eventually(lambda: len(server.connections) == server.limits.max_connections)
    for _ in range(3):
        reader, writer = await connect(server)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    assert server.refused_connections == 3
    refusals = [record for record in caplog.records if "refused" in record.getMessage()]
    assert len(refusals) == 1 and "the cap of 8 open connections" in refusals[0].getMessage()
    reader, writer = held[0]
    writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(reader))[0] == 200  # those admitted are served as ever
    for _, writer in held:
        writer.close()


@pytest.fixture
async def tls_server() -> AsyncIterator[tuple[HttpServer, trustme.CA]]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS, as the verbs port
    router = Router()
    router.add("GET", "/other", lambda request: Response(200, b"{}"))
    server = HttpServer(router, max_body_bytes=1024, limits=Limits(handshake_timeout=DEADLINE))
    await server.start("127.0.0.1", 0, context)
    yield server, ca
    await server.stop(grace=1.0)


async def test_a_tls_handshake_never_begun_is_counted_as_failed(tls_server: tuple[HttpServer, trustme.CA]) -> None:
    server, _ = tls_server
    reader, writer = await connect(server)  # TCP only: not a byte of TLS
    await eventually(lambda: server.handshake_failures == 1)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # asyncio gave up on it at the handshake timeout
    assert not server.handshaking and not server.connections
    writer.close()


async def test_a_client_without_a_certificate_is_counted_as_a_failed_handshake(
    tls_server: tuple[HttpServer, trustme.CA],
) -> None:
    server, ca = tls_server
    client = ssl.create_default_context()
    ca.configure_trust(client)
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client)
        writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")  # TLS 1.3: the refusal comes after the handshake
        await reader.readexactly(1)
    await eventually(lambda: server.handshake_failures == 1)
    assert not server.connections
