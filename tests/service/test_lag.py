"""The event loop's lateness is measured (`service/lag.py`), and a filter that must judge many nodes afresh gives
the loop turns meanwhile instead of holding it (`Placer.begin_filter`)."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import orjson
import pytest

from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL, GroupKey, Scheme
from extender.core.placement import fragmentation
from extender.core.placement.config import PolicyConfig
from extender.service import lag
from extender.service.metrics import Metrics
from extender.service.routing import Request, Response
from extender.service.verbs import build_server
from tests.builders import learned_of, make_cluster, make_node, make_pod, quotas_of
from tests.conftest import make_service


async def test_a_handler_that_holds_the_loop_is_seen_by_the_probe() -> None:
    """A deliberate 150 ms stall: the probe due meanwhile runs at least that late. (Not a speed target: the
    stall is made here, and only its being seen is checked.)"""
    metrics = Metrics()
    probe = asyncio.create_task(lag.probe(metrics, interval=0.005))
    await asyncio.sleep(0.02)
    time.sleep(0.15)  # holds the loop
    await asyncio.sleep(0.02)
    probe.cancel()
    assert metrics.loop_lag_worst >= 0.1
    worst = metrics.loop_lag_worst
    text = metrics.render(make_cluster(), quotas_of(make_cluster()), learned_of(make_cluster())).decode()
    assert f"extender_event_loop_lag_max_seconds {worst}" in text
    assert metrics.loop_lag_worst == 0.0, "the next scrape reports the longest since this one"
    assert (metrics.registry.get_sample_value("extender_event_loop_lag_seconds_count") or 0) >= 2


def call(service: Any, body: dict[str, Any]) -> Any:
    route, _, _ = build_server(service).router.resolve("POST", "/filter")
    assert route is not None
    return route.handler(Request("POST", "/filter", orjson.dumps(body)))


async def with_turns(pending: Any) -> tuple[Any, int]:
    """The reply a pending handler gives, and how many turns other tasks of the loop had meanwhile."""
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    reply = await pending
    counter.cancel()
    return reply, turns


async def test_a_filter_judging_many_nodes_afresh_yields_to_the_loop_and_answers_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = [make_node(f"n{number:02}", gpus=4, mem=16) for number in range(40)]
    pod = make_pod("p", gpu_mem=6)
    body = {"Pod": pod, "NodeNames": [f"n{number:02}" for number in range(40)]}
    at_once = call(make_service(make_cluster(*nodes), policy=PolicyConfig()), body)
    assert isinstance(at_once, Response), "40 nodes: judged in one go"
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", 8)
    monkeypatch.setattr(fragmentation, "SCALAR_SLICE", 4)
    pending = call(make_service(make_cluster(*nodes), policy=PolicyConfig()), body)
    assert inspect.isawaitable(pending), "in slices, with turns of the loop between them"
    sliced, turns = await with_turns(pending)
    assert turns >= 4, "the loop ran other things between the slices"
    assert orjson.loads(sliced.body) == orjson.loads(at_once.body)


async def test_a_jobs_plan_judging_many_nodes_afresh_yields_to_the_loop_and_plans_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first member of a job of a new shape: its plan ranks every node for each member's ask (`Placer.values`),
    which on a cold table is the same work as a cold filter. With small slices, the member's filter hands that
    work to the loop a slice at a time, then plans; the job is planned as when judged in one go."""
    names = [f"n{number:02}" for number in range(40)]
    pods = [make_pod(f"a-{n}", gpu_mem=6, uid=f"uid-a-{n}") for n in range(3)]
    for pod in pods:
        pod["metadata"]["labels"] = {KUEUE_GROUP: "a"}
        pod["metadata"]["annotations"][KUEUE_TOTAL] = "3"

    def service() -> Any:
        cluster = make_cluster(*(make_node(name, gpus=4, mem=16) for name in names))
        for pod in pods:
            cluster.apply_pod(pod)
        return make_service(cluster, policy=PolicyConfig())

    body = {"Pod": pods[0], "NodeNames": names}
    at_once_service = service()
    at_once = call(at_once_service, body)
    assert isinstance(at_once, Response), "40 nodes: planned in one go"
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", 8)
    monkeypatch.setattr(fragmentation, "SCALAR_SLICE", 4)
    sliced_service = service()
    pending = call(sliced_service, body)
    assert inspect.isawaitable(pending), "in slices, with turns of the loop between them"
    job = GroupKey(Scheme.KUEUE, "default", "a")
    assert sliced_service.ledger.group_hold(job) is None, "nothing planned before the slices"
    sliced, turns = await with_turns(pending)
    assert turns >= 4, "the loop ran other things between the slices"
    assert orjson.loads(sliced.body) == orjson.loads(at_once.body)
    assert len(orjson.loads(sliced.body)["NodeNames"]) == 1
    held = {uid: at_once_service.ledger.held_for(uid) for uid in ("uid-a-0", "uid-a-1", "uid-a-2")}
    assert None not in held.values()
    assert {uid: sliced_service.ledger.held_for(uid) for uid in held} == held, "the same plan, member by member"
