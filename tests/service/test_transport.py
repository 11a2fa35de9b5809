"""The transport, byte for byte: what an HTTP/1.1 client (Go's, kube-scheduler's) may send, and what comes back.

Each test opens a raw socket to a real server on loopback, so nothing between the bytes and the server
hides a mistake.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import orjson
import pytest

from extender.service.limits import Limits
from extender.service.routing import Request, Response, Router
from extender.service.transport import HttpServer

LIMIT = 1024


def echo(request: Request) -> Response:
    return Response(200, orjson.dumps({"path": request.path, "size": len(request.body), "params": request.params}))


def explode(request: Request) -> Response:
    raise RuntimeError("kaboom")


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    gate = asyncio.Event()

    async def slow(request: Request) -> Response:
        await gate.wait()
        return Response(200, b'{"slow":true}')

    router = Router()
    router.add("POST", "/echo", echo)
    router.add("GET", "/items/{name}", echo)
    router.add("POST", "/slow", slow)

    def sometimes(request: Request) -> Response | Awaitable[Response]:
        """Inline, unless the body asks it to wait for the gate (as a filter that must read the API does)."""
        if request.body != b"wait":
            return Response(200, b'{"waited":false}')

        async def later() -> Response:
            await gate.wait()
            return Response(200, b'{"waited":true}')

        return later()

    router.add("POST", "/sometimes", sometimes)
    router.add("GET", "/explode", explode)
    server = HttpServer(router, max_body_bytes=LIMIT, limits=Limits(idle_timeout=1.0))
    server.gate = gate  # type: ignore[attr-defined]
    await server.start("127.0.0.1", 0)
    yield server
    gate.set()
    await server.stop(grace=1.0)


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await asyncio.wait_for(reader.readline(), 5)
    assert status_line, "connection closed before a response"
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_keep_alive_serves_several_requests_on_one_connection(server: HttpServer) -> None:
    accepted = server.accepted
    reader, writer = await connect(server)
    for size in (0, 10, 1000):
        writer.write(post("/echo", b"x" * size))
        status, headers, body = await read_response(reader)
        assert (status, orjson.loads(body)["size"]) == (200, size)
        assert headers["content-type"] == "application/json"
        assert "date" in headers and "connection" not in headers
    writer.close()
    assert server.accepted == accepted + 1, "one connection accepted for the three requests"


async def test_chunked_bodies_are_reassembled(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    _, _, body = await read_response(reader)
    assert orjson.loads(body)["size"] == 11
    writer.close()


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode())
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"]) == (413, "close")
    assert orjson.loads(body) == {"Error": f"request body is over the limit of {LIMIT} bytes"}
    assert await reader.read() == b""
    writer.close()


async def test_a_chunked_body_growing_over_the_limit_is_refused(server: HttpServer) -> None:
    reader, writer = await connect(server)
    chunk = b"x" * 600
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk, len(chunk), chunk))
    status, _, _ = await read_response(reader)
    assert status == 413
    writer.close()


async def test_huge_headers_are_refused(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /items/a HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n")
    status, _, _ = await read_response(reader)
    assert status == 431
    writer.close()


async def test_garbage_gets_a_400_and_the_connection_closes(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"this is not http\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"]) == (400, "close")
    assert orjson.loads(body)["Error"].startswith("malformed HTTP request")
    writer.close()


async def test_expect_100_continue_is_answered_before_the_body(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 100 Continue\r\n"
    assert await reader.readline() == b"\r\n"
    writer.write(b"abcd")
    status, _, body = await read_response(reader)
    assert (status, orjson.loads(body)["size"]) == (200, 4)
    writer.close()


async def test_http_1_0_closes_after_the_answer(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /items/gpu-1 HTTP/1.0\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"], orjson.loads(body)["params"]) == (200, "close", {"name": "gpu-1"})
    assert await reader.read() == b""
    writer.close()


async def test_pipelined_requests_are_answered_in_order_even_behind_a_slow_one(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(post("/slow", b"") + post("/echo", b"12345"))
    await asyncio.sleep(0.05)
    server.gate.set()  # type: ignore[attr-defined]
    first = await read_response(reader)
    second = await read_response(reader)
    assert (first[2], orjson.loads(second[2])["size"]) == (b'{"slow":true}', 5)
    writer.close()


async def test_a_synchronous_handler_may_answer_later_and_requests_behind_it_keep_their_order(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    writer.write(post("/sometimes", b"now"))
    assert (await read_response(reader))[2] == b'{"waited":false}'
    writer.write(post("/sometimes", b"wait") + post("/sometimes", b"now") + post("/echo", b"123"))
    with pytest.raises(TimeoutError):  # nothing answered while the first waits, not even the ones behind it
        await asyncio.wait_for(reader.readline(), 0.1)
    server.gate.set()  # type: ignore[attr-defined]
    answers = [(await read_response(reader))[2] for _ in range(3)]
    assert answers[:2] == [b'{"waited":true}', b'{"waited":false}'] and orjson.loads(answers[2])["size"] == 3
    writer.close()


@pytest.mark.parametrize(
    ("request_line", "status", "message"),
    [
        (b"GET /nowhere HTTP/1.1", 404, "GET /nowhere: Not Found"),
        (b"GET /echo HTTP/1.1", 405, "GET /echo: Method Not Allowed"),
        (b"GET /explode HTTP/1.1", 500, "internal error in GET /explode: RuntimeError: kaboom"),
    ],
)
async def test_errors_are_json_with_a_message(
    server: HttpServer, request_line: bytes, status: int, message: str
) -> None:
    reader, writer = await connect(server)
    writer.write(request_line + b"\r\nHost: x\r\n\r\n")
    answer = await read_response(reader)
    assert (answer[0], orjson.loads(answer[2])) == (status, {"Error": message})
    writer.close()


async def test_idle_connections_are_closed_after_the_timeout(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(post("/echo", b""))
    await read_response(reader)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # idle_timeout is 1 s; the tick runs every second
    writer.close()


async def test_stop_lets_a_request_in_flight_finish_then_closes() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def bind_like(request: Request) -> Response:
        started.set()
        await release.wait()
        return Response(200, b'{"Error":""}')

    router = Router()
    router.add("POST", "/bind", bind_like)
    server = HttpServer(router, max_body_bytes=LIMIT)
    await server.start("127.0.0.1", 0)
    port = server.port
    reader, writer = await connect(server)
    writer.write(post("/bind", b"{}"))
    await started.wait()
    stopping = asyncio.create_task(server.stop(grace=5.0))
    await asyncio.sleep(0.05)
    assert not stopping.done()
    release.set()
    status, headers, body = await read_response(reader)
    assert (status, body, headers["connection"]) == (200, b'{"Error":""}', "close")
    await stopping
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    writer.close()


async def test_a_refusal_pipelined_behind_a_slow_request_waits_for_the_requests_queued_before_it(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    too_big = f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
    writer.write(post("/slow", b"") + post("/echo", b"123") + too_big)
    await asyncio.sleep(0.05)
    server.gate.set()  # type: ignore[attr-defined]
    answers = [await read_response(reader) for _ in range(3)]
    assert [answer[0] for answer in answers] == [200, 200, 413]
    assert orjson.loads(answers[1][2])["size"] == 3
    assert answers[2][1]["connection"] == "close"
    assert await reader.read() == b""
    writer.close()


async def test_an_endless_request_line_is_refused_without_buffering_it(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /" + b"a" * 100_000)  # no end of line, no headers: refused before they come
    status, headers, _ = await read_response(reader)
    assert (status, headers["connection"]) == (431, "close")
    writer.close()


async def test_the_header_limit_counts_the_whole_head_not_only_names_and_values(server: HttpServer) -> None:
    """D6: 16,000 `X: v` lines are 96 KB of head, though their names and values are only 32 KB."""
    reader, writer = await connect(server)
    writer.write(b"GET /items/a HTTP/1.1\r\nHost: x\r\n" + b"X: v\r\n" * 16_000 + b"\r\n")
    status, headers, _ = await read_response(reader)
    assert (status, headers["connection"]) == (431, "close")
    writer.close()


async def test_a_head_just_under_the_limit_is_served(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /items/a HTTP/1.1\r\nHost: x\r\n" + b"X: v\r\n" * 10_000 + b"\r\n")  # 60 KB of 64 KiB
    assert (await read_response(reader))[0] == 200
    writer.close()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /items/a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"GET /items/a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    ],
    ids=["upgrade", "upgrade-header-alone", "connect"],
)
async def test_an_upgrade_or_connect_gets_exactly_one_400_then_the_connection_closes(
    server: HttpServer, head: bytes
) -> None:
    """D7: before, the route answered 200 (or 404), and then came a 400 for the same request."""
    reader, writer = await connect(server)
    writer.write(head)
    status, headers, _ = await read_response(reader)
    assert (status, headers["connection"]) == (400, "close")
    assert await reader.read() == b""
    writer.close()


@pytest.mark.parametrize("host_lines", [b"", b"Host: x\r\nHost: y\r\n"], ids=["without-host", "with-two-hosts"])
async def test_an_http_1_1_request_needs_exactly_one_host(server: HttpServer, host_lines: bytes) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /items/a HTTP/1.1\r\n" + host_lines + b"\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"]) == (400, "close")
    assert "exactly one Host" in orjson.loads(body)["Error"]
    writer.close()


async def test_a_405_lists_the_methods_of_the_path_in_allow() -> None:
    router = Router()
    router.add("POST", "/echo", echo)
    router.add("PUT", "/echo", echo)
    server = HttpServer(router, max_body_bytes=LIMIT)
    await server.start("127.0.0.1", 0)
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = await read_response(reader)
    assert (status, headers["allow"]) == (405, "POST, PUT")
    writer.close()
    await server.stop(grace=1.0)


async def test_a_head_request_is_answered_without_a_body(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"HEAD /items/a HTTP/1.1\r\nHost: x\r\n\r\n" + post("/echo", b"abc"))
    assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 405 Method Not Allowed\r\n"
    while await reader.readline() != b"\r\n":
        pass
    status, _, body = await read_response(reader)  # the next reply starts right after the head
    assert (status, orjson.loads(body)["size"]) == (200, 3)
    writer.close()


async def test_no_100_continue_is_sent_to_an_http_1_0_client(server: HttpServer) -> None:
    """D8: an HTTP/1.0 client does not know interim responses (RFC 9110 §10.1.1: the server must ignore Expect)."""
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.0\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readline(), 0.1)
    writer.write(b"abcd")
    status, _, body = await read_response(reader)
    assert (status, orjson.loads(body)["size"]) == (200, 4)
    writer.close()


async def test_http_1_0_keep_alive_is_echoed_and_kept(server: HttpServer) -> None:
    reader, writer = await connect(server)
    for name in ("a", "b"):
        writer.write(f"GET /items/{name} HTTP/1.0\r\nConnection: keep-alive\r\n\r\n".encode())
        status, headers, body = await read_response(reader)
        assert (status, headers["connection"], orjson.loads(body)["params"]) == (200, "keep-alive", {"name": name})
    writer.close()


@pytest.mark.parametrize(("version", "status"), [(b"HTTP/2.0", 505), (b"HTTP/0.9", 505), (b"HTTP/1.2", 400)])
async def test_a_version_other_than_1_0_and_1_1_is_refused_and_closed(
    server: HttpServer, version: bytes, status: int
) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /items/a " + version + b"\r\nHost: x\r\n\r\n")
    answer = await read_response(reader)
    assert (answer[0], answer[1]["connection"]) == (status, "close")
    assert await reader.read() == b""
    writer.close()


async def test_many_pipelined_requests_are_all_answered_in_order(server: HttpServer) -> None:
    """A few per turn of the loop, but every one, in order (the turn limit must not drop any)."""
    reader, writer = await connect(server)
    writer.write(b"".join(f"GET /items/{number} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for number in range(500)))
    for number in range(500):
        _, _, body = await read_response(reader)
        assert orjson.loads(body)["params"] == {"name": str(number)}
    writer.close()


async def test_a_large_body_split_over_many_writes_is_reassembled(server: HttpServer) -> None:
    reader, writer = await connect(server)
    body = bytes(range(256)) * 4  # LIMIT bytes
    writer.write(f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    for start in range(0, len(body), 100):
        writer.write(body[start : start + 100])
        await writer.drain()
    status, _, answer = await read_response(reader)
    assert (status, orjson.loads(answer)["size"]) == (200, LIMIT)
    writer.close()


async def test_a_background_chore_that_ends_by_itself_says_so_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio would report a task's exception only when the task is collected, if ever."""

    async def broken_sweep() -> None:
        raise RuntimeError("the sweep's defect")

    async def finished() -> None:
        return

    server = HttpServer(Router(), max_body_bytes=LIMIT, background=(broken_sweep, finished))
    await server.start("127.0.0.1", 0)
    try:
        for _ in range(10):
            await asyncio.sleep(0)
        ended = {record.getMessage(): record.exc_info for record in caplog.records if "stopped" in record.getMessage()}
        assert set(ended) == {"background task broken_sweep stopped", "background task finished stopped"}
        failure = ended["background task broken_sweep stopped"]
        assert failure is not None and "the sweep's defect" in str(failure[1])
    finally:
        await server.stop(grace=0.1)
    assert not [record for record in caplog.records if "http-tick" in record.getMessage()], "a chore stopped is quiet"
