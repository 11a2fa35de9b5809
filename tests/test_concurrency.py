"""A burst of concurrent filters and binds against a few small nodes, over HTTP: no device ever goes over
capacity, and every bind that succeeded is visible in /inspect.

The binder stands for the API server: it applies the bind to the cache as a watch event would, after a
delay that varies per call (seeded), so binds finish out of order and overlap the next filters.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson

from extender.sources.file import FileBinder
from tests.builders import make_cluster, make_node, make_pod
from tests.conftest import ClientFor, make_service

NODES = ("small-a", "small-b", "small-c")
SIZES = (2, 3, 4, 6, 8)


class SlowApi(FileBinder):
    """A FileBinder whose writes take a seeded random while, checking the invariant at every step."""

    def __init__(self, cluster: Any, rng: random.Random) -> None:
        super().__init__(cluster, [])
        self.rng = rng

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        assert not self.cluster.overcommitted()
        for _ in range(self.rng.randint(0, 5)):
            await asyncio.sleep(0)
        await asyncio.sleep(self.rng.random() / 1000)
        await super().bind(pod, node, annotations)
        assert not self.cluster.overcommitted()


async def test_concurrent_binds_never_overcommit_and_all_successes_show_in_inspect(client_for: ClientFor) -> None:
    rng = random.Random(42)
    cluster = make_cluster(*(make_node(name, gpus=2, mem=8) for name in NODES))  # 48 GiB in all
    client = await client_for(make_service(cluster, binder=SlowApi(cluster, rng)))
    pods = [make_pod(f"burst-{i}", gpu_mem=rng.choice(SIZES)) for i in range(120)]  # ~5x what fits
    results: dict[str, str] = {}
    watching = True

    async def watch_invariant() -> None:
        while watching:
            assert not cluster.overcommitted()
            await asyncio.sleep(0)

    async def schedule(pod: dict[str, Any]) -> None:
        """One scheduling cycle: filter, then bind to a node that passed (the scheduler's pick)."""
        body = orjson.dumps({"Pod": pod, "NodeNames": list(NODES)})
        passed = (await (await client.post("/filter", data=body)).json())["NodeNames"]
        if not passed:
            results[pod["metadata"]["uid"]] = "unschedulable"
            return
        meta = pod["metadata"]
        bind = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": rng.choice(passed)}
        results[meta["uid"]] = (await (await client.post("/bind", data=orjson.dumps(bind))).json())["Error"]

    watcher = asyncio.create_task(watch_invariant())
    await asyncio.gather(*(schedule(pod) for pod in pods))
    watching = False
    await watcher

    bound = {uid for uid, error in results.items() if error == ""}
    refused = [error for error in results.values() if error not in ("", "unschedulable")]
    assert bound, "some pods must fit"
    assert refused, "a burst this size must race: some binds find their node filled meanwhile"
    assert all("no longer fits" in error for error in refused)

    inspect = await (await client.get("/inspect")).json()
    shown = {holder["uid"] for node in inspect["nodes"] for gpu in node["devices"] for holder in gpu["pods"]}
    assert shown == bound
    for node in inspect["nodes"]:
        for gpu in node["devices"]:
            assert gpu["used"] <= gpu["capacity"]
            assert gpu["used"] == sum(holder["memory"] for holder in gpu["pods"])
    assert not cluster.reserved
