"""Leader election on its own thread: the lease is renewed while the serving loop is held, and what the serving
loop reads of it follows the leadership it was told of."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from extender.settings import LeaseTimings
from extender.sources.kube.client import KubeClient
from extender.sources.kube.leader_thread import LeaderThread
from tests.apidouble import ApiDouble
from tests.conftest import double_config, eventually

TIMINGS = LeaseTimings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1)
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/gpu-extender/leases/gpu-extender"


@pytest.fixture
def api_elsewhere() -> Iterator[ApiDouble]:
    """The API double on an event loop of its own thread: it answers while the test's loop is held."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="api double", daemon=True)
    thread.start()

    async def started() -> ApiDouble:
        double = ApiDouble()
        await double.start()
        return double

    double = asyncio.run_coroutine_threadsafe(started(), loop).result(10)
    yield double
    asyncio.run_coroutine_threadsafe(double.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def hold_the_loop(seconds: float) -> None:
    """A handler that computes without ever awaiting (and holds the GIL while it does)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


async def test_the_lease_is_renewed_while_the_serving_loop_is_held(api_elsewhere: ApiDouble) -> None:
    """Twice the renew deadline without the serving loop running: on that loop the elector could not renew, and
    would have stopped leading when the loop came back. On its own thread it renews throughout."""
    changes: list[bool] = []
    election = LeaderThread(
        lambda: KubeClient(double_config(api_elsewhere), timeout=2.0),
        "gpu-extender",
        "gpu-extender",
        "a",
        TIMINGS,
        changes.append,
    )
    running = asyncio.create_task(election.run())
    try:
        await eventually(lambda: election.leading, what="leading")
        writes = api_elsewhere.requests.count(("PUT", LEASE_PATH))
        hold_the_loop(2 * TIMINGS.renew_deadline)
        assert election.time_left() > 0
        assert api_elsewhere.requests.count(("PUT", LEASE_PATH)) > writes
        await asyncio.sleep(0)  # news of a leadership lost meanwhile would be delivered now
        assert changes == [True] and election.leading
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    lease = api_elsewhere.lease("gpu-extender", "gpu-extender")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # given up as the thread stopped


@dataclass
class ElectorSeen:
    """The two figures the serving loop reads of the elector on the thread."""

    term: int = 1
    left: float = 5.0
    holder: str = "a"

    def time_left(self) -> float:
        return self.left


def test_a_lease_lost_and_taken_again_counts_nothing_until_the_serving_loop_hears_of_it() -> None:
    """The new term needs its own relist (source.py asks for it when told), so until the serving loop is told,
    its binds get no time at all, though the elector leads again."""
    election = LeaderThread(lambda: KubeClient(double_config(ApiDouble())), "ns", "lease", "a", TIMINGS)
    elector = ElectorSeen()
    election._elector = elector  # type: ignore[assignment]
    election._changed(True, 1)
    assert election.time_left() == 5.0
    elector.term = 2  # lost and taken again on the thread; both pieces of news are still on their way
    assert election.time_left() == 0.0
    election._changed(False, 1)
    election._changed(True, 2)
    assert election.time_left() == 5.0
