"""Leader election over a Lease in the API double: exactly one leader, failover when the leader stops
renewing, a clean handover on stop, and losing at once to a conflicting holder. Timings are short (a lease of
1 s) so failover takes about a second."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from extender.settings import LeaseTimings
from extender.sources.kube.client import ConnectionFailed, KubeClient
from extender.sources.kube.leader import LeaderElector
from tests.apidouble import ApiDouble
from tests.builders import FakeClock
from tests.conftest import eventually

FAST = LeaseTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.1)


class Severable:
    """A client whose link to the API can be cut, as a network partition cuts one replica off (the API server
    itself stays up for the others)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.cut = False

    async def _call(self, method: str, *args: Any) -> Any:
        if self.cut:
            raise ConnectionFailed("the link to the API server is cut")
        return await getattr(self.client, method)(*args)

    async def get(self, *args: Any) -> Any:
        return await self._call("get", *args)

    async def create(self, *args: Any) -> Any:
        return await self._call("create", *args)

    async def replace(self, *args: Any) -> Any:
        return await self._call("replace", *args)


class Replicas:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.links: dict[str, Severable] = {}
        self.electors: dict[str, LeaderElector] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.changes: list[tuple[str, bool]] = []

    def start(self, name: str, timings: LeaseTimings = FAST) -> LeaderElector:
        link = self.links[name] = Severable(self.kube)
        elector = LeaderElector(
            link,  # type: ignore[arg-type]
            "gpu-extender",
            "gpu-extender",
            name,
            timings,
            on_change=lambda leading: self.changes.append((name, leading)),
        )
        self.electors[name] = elector
        self.tasks[name] = asyncio.create_task(elector.run())
        return elector

    async def stop(self, name: str) -> None:
        task = self.tasks.pop(name)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def leaders(self) -> list[str]:
        return [name for name, elector in self.electors.items() if elector.leading and name in self.tasks]


@pytest.fixture
async def replicas(kube: KubeClient) -> AsyncIterator[Replicas]:
    group = Replicas(kube)
    yield group
    for name in list(group.tasks):
        await group.stop(name)


async def test_of_two_replicas_exactly_one_leads(api: ApiDouble, replicas: Replicas) -> None:
    replicas.start("a")
    replicas.start("b")
    await eventually(lambda: len(replicas.leaders()) == 1)
    for _ in range(20):  # and it stays that way over many renewals
        assert len(replicas.leaders()) == 1
        await asyncio.sleep(0.05)
    [leader] = replicas.leaders()
    lease = api.lease("gpu-extender", "gpu-extender")
    assert lease is not None and lease["spec"]["holderIdentity"] == leader
    assert lease["spec"]["leaseDurationSeconds"] == 1


async def test_a_leader_cut_off_stops_leading_before_a_standby_takes_over(
    replicas: Replicas,
) -> None:
    replicas.start("a")
    await eventually(lambda: replicas.leaders() == ["a"])
    replicas.start("b")
    await asyncio.sleep(0.3)
    assert replicas.leaders() == ["a"]
    replicas.links["a"].cut = True
    loop = asyncio.get_running_loop()
    cut_at = loop.time()
    await eventually(lambda: not replicas.electors["a"].leading, timeout=30.0)
    await eventually(lambda: replicas.leaders() == ["b"], timeout=30.0)
    taken_after = loop.time() - cut_at
    # The old leader stops before the lease can expire for anyone else (the order of the changes below, however
    # busy the cores): never two leaders. The waits above are guards; only the lower bound is timed, which no
    # slowness can break.
    assert taken_after >= FAST.lease_duration - FAST.retry_period
    assert ("a", False) in replicas.changes and replicas.changes.index(("a", False)) < replicas.changes.index(
        ("b", True)
    )


async def test_a_leader_that_stops_gives_the_lease_up_at_once(api: ApiDouble, replicas: Replicas) -> None:
    replicas.start("a", LeaseTimings(lease_duration=30.0, renew_deadline=20.0, retry_period=0.1))
    await eventually(lambda: replicas.leaders() == ["a"])
    replicas.start("b")
    await replicas.stop("a")
    lease = api.lease("gpu-extender", "gpu-extender")
    assert lease is not None and not lease["spec"].get("holderIdentity")
    await eventually(lambda: replicas.leaders() == ["b"], timeout=1.0)  # not 30 s later


async def test_a_leader_that_finds_another_holder_stops_leading_at_once(api: ApiDouble, replicas: Replicas) -> None:
    replicas.start("a", LeaseTimings(lease_duration=30.0, renew_deadline=20.0, retry_period=0.1))
    await eventually(lambda: replicas.leaders() == ["a"])
    api.steal_lease("gpu-extender", "gpu-extender", "intruder")
    await eventually(lambda: not replicas.electors["a"].leading, timeout=1.0)
    assert replicas.electors["a"].holder == "intruder"


async def test_racing_candidates_conflict_and_only_one_wins(api: ApiDouble, replicas: Replicas) -> None:
    for name in "abcde":
        replicas.start(name)
    await eventually(lambda: len(replicas.leaders()) == 1)
    await asyncio.sleep(0.3)
    assert len(replicas.leaders()) == 1
    lease = api.lease("gpu-extender", "gpu-extender")
    assert lease is not None and lease["spec"]["holderIdentity"] == replicas.leaders()[0]


@pytest.mark.parametrize(
    ("timings", "problem"),
    [
        (LeaseTimings(10.0, 10.0, 2.0), "must be greater than renew_deadline"),
        (LeaseTimings(15.0, 2.0, 2.0), "must be greater than 1.2 x retry_period"),
        (LeaseTimings(15.0, 10.0, 2.0), None),
    ],
)
def test_lease_timings_are_checked_as_client_go_checks_them(timings: LeaseTimings, problem: str | None) -> None:
    refusal = timings.check()
    assert (refusal is not None and problem in refusal) if problem else refusal is None


async def test_a_renewal_slower_than_the_renew_deadline_stops_leading_in_time(
    api: ApiDouble, replicas: Replicas
) -> None:
    """client-go cancels a renewal at the renew deadline; a slow API must not keep two replicas leading."""
    replicas.start("a")
    await eventually(lambda: replicas.leaders() == ["a"])
    replicas.start("b")
    await asyncio.sleep(0.2)
    api.fail("PUT", "/apis/coordination.k8s.io/v1/namespaces/gpu-extender/leases/gpu-extender", mode="slow", delay=2.0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3.0
    while loop.time() < deadline:
        assert len(replicas.leaders()) <= 1, replicas.leaders()
        await asyncio.sleep(0.01)
    assert ("a", False) in replicas.changes  # it did stop, at its deadline, while its renewal hung
    await eventually(lambda: len(replicas.leaders()) == 1)  # a again (the slow write landed) or b


async def test_time_left_counts_down_to_the_renew_deadline(replicas: Replicas) -> None:
    elector = replicas.start("a")
    assert elector.time_left() == 0.0
    await eventually(lambda: elector.leading)
    assert 0 < elector.time_left() <= FAST.renew_deadline


LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/gpu-extender/leases/gpu-extender"


async def test_the_leader_renews_by_writing_over_its_lease_without_reading_it(
    api: ApiDouble, replicas: Replicas
) -> None:
    """client-go's fast path: one request per renewal, so a slow API costs a renewal one round trip, not two."""
    replicas.start("a")
    await eventually(lambda: replicas.leaders() == ["a"])
    since = len(api.requests)
    await eventually(lambda: [method for method, path in api.requests[since:] if path == LEASE_PATH].count("PUT") >= 3)
    assert [method for method, path in api.requests[since:] if path == LEASE_PATH and method != "PUT"] == []


class LateAnswers(Severable):
    """A link whose answers to lease writes arrive `delay` seconds of the elector's monotonic clock after they
    were sent (the write landed at once): an API server or a process slowed down."""

    def __init__(self, client: KubeClient, clock: FakeClock) -> None:
        super().__init__(client)
        self.clock = clock
        self.delay = 0.0
        self.late = 0

    async def replace(self, *args: Any) -> Any:
        answer = await self._call("replace", *args)
        if self.delay:
            self.clock.advance(self.delay)
            self.late += 1
        return answer


async def test_the_renew_deadline_counts_from_before_the_renewal_was_sent(kube: KubeClient) -> None:
    """A standby counts the lease duration from when it sees the write, which is after it was sent: counted from
    the answer instead, a leader whose answers come late would lead past the moment a standby may take over."""
    clock = FakeClock(100.0)
    link = LateAnswers(kube, clock)
    elector = LeaderElector(link, "gpu-extender", "gpu-extender", "a", FAST, monotonic=clock)  # type: ignore[arg-type]
    task = asyncio.create_task(elector.run())
    try:
        await eventually(lambda: elector.leading)
        link.delay = 0.4
        await eventually(lambda: link.late >= 2, what="renewals answered late")
        assert elector.leading
        assert elector.time_left() == pytest.approx(FAST.renew_deadline - 0.4)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
