"""`bench/transport.py` (run by `make bench`): its servers start and answer from this tree.

It loads the transport under test from a file, outside the package's own imports, so a change to what the
transport module exports can break the bench while every other test passes (the layout split moved Router and
Response to routing.py, and the hardened row stopped starting). One short run of the current transport's row,
through the same `running` and `measure` the bench uses.
"""

from __future__ import annotations

from bench import transport


def test_the_hardened_transport_row_serves_the_bench_s_requests() -> None:
    body = transport.request_body(10)
    request = f"POST /filter HTTP/1.1\r\nHost: {transport.HOST}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    path = transport.ROOT / "extender" / "service" / "transport.py"
    with transport.running("transport (hardened)", str(path)) as server:
        rate, cpu_us = transport.measure(server, request, 1, 1, 0.2)
    assert rate > 0
    assert cpu_us > 0


def test_the_floor_that_decodes_and_looks_up_serves_the_bench_s_requests() -> None:
    body = transport.request_body(10)
    request = transport.post(body)
    with transport.running(transport.PARSING, "aiohttp-parse") as server:
        rate, cpu_us = transport.measure(server, request, 1, 1, 0.2)
    assert rate > 0
    assert cpu_us > 0
