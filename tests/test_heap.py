"""The serving process's heap (`app.keep_collections_short`): survivors of a full collection are frozen out of
the next ones' scans, so those stay short as the cache grows; for that to leak nothing, what the server makes
per connection must be freed by its reference count alone, without the collector."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from extender.app import _freeze_after_full, keep_collections_short
from extender.service.routing import Response, Router
from extender.service.transport import HttpServer
from tests.service.test_transport import read_response
from tests.service.test_transport_attacks import eventually


@pytest.fixture
def collector_untouched() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it: the callback gone, nothing frozen, collecting."""
    yield
    if _freeze_after_full in gc.callbacks:
        gc.callbacks.remove(_freeze_after_full)
    gc.unfreeze()
    gc.enable()


@pytest.mark.usefixtures("collector_untouched")
def test_what_survives_a_full_collection_is_frozen_out_of_the_next_ones() -> None:
    keep_collections_short()
    keep_collections_short()
    assert gc.callbacks.count(_freeze_after_full) == 1, "installed once however often it is asked"
    gc.unfreeze()
    kept = [[index] for index in range(1000)]
    gc.collect(1)
    assert gc.get_freeze_count() == 0, "a younger collection freezes nothing"
    gc.collect()
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)
    gc.collect()
    assert gc.get_freeze_count() >= frozen


@pytest.mark.usefixtures("collector_untouched")
async def test_a_closed_connection_is_freed_without_the_collector() -> None:
    """Were a connection part of a cycle (its transport and its parser both call it back), a frozen one would
    never be freed: every connection ever closed would stay in memory."""
    router = Router()
    router.add("GET", "/", lambda request: Response(200, b"{}"))
    server = HttpServer(router, max_body_bytes=1024)
    await server.start("127.0.0.1", 0)
    try:
        gc.disable()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = await read_response(reader)
        assert status == 200
        (connection,) = server.connections
        gone = weakref.ref(connection)
        del connection
        writer.close()
        await eventually(lambda: not server.connections)
        await eventually(lambda: gone() is None)
    finally:
        gc.enable()
        await server.stop(grace=1.0)
