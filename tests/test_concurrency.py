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

from extender.core.quota.limits import read_quota
from extender.sources.file import FileBinder
from tests.builders import (
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    make_pod,
    make_quota,
    quotas_of,
)
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


async def test_concurrent_hami_binds_never_overcommit_memory_compute_or_slots(client_for: ClientFor) -> None:
    """The same burst on HAMi nodes (3 x 2 GPUs of 8,000 MiB, 100 % compute, 3 slots each): pods of mixed memory,
    compute and GPU counts. No GPU ever goes over its memory, its compute or its split count."""
    rng = random.Random(7)
    names = ("hami-a", "hami-b", "hami-c")
    cluster = make_hami_cluster(*(make_hami_node(name, gpus=2, mem=8000, split=3) for name in names))
    client = await client_for(make_service(cluster, binder=SlowApi(cluster, rng)))
    pods = [
        make_hami_pod(f"hami-{i}", gpus=rng.choice((1, 1, 1, 2)), mem=rng.choice((1000, 2000, 3000)),
                      cores=rng.choice((0, 10, 30, 50)))
        for i in range(90)
    ]  # fmt: skip
    results: dict[str, str] = {}

    async def schedule(pod: dict[str, Any]) -> None:
        body = orjson.dumps({"Pod": pod, "NodeNames": list(names)})
        reply = await (await client.post("/filter", data=body)).json()
        if not reply["NodeNames"]:
            results[pod["metadata"]["uid"]] = "unschedulable"
            return
        meta = pod["metadata"]
        bind = {
            "PodName": meta["name"],
            "PodNamespace": "default",
            "PodUID": meta["uid"],
            "Node": rng.choice(reply["NodeNames"]),
        }
        results[meta["uid"]] = (await (await client.post("/bind", data=orjson.dumps(bind))).json())["Error"]
        assert not cluster.overcommitted()

    await asyncio.gather(*(schedule(pod) for pod in pods))
    bound = [uid for uid, error in results.items() if error == ""]
    assert bound and len(bound) < len(pods), "the burst must fill the nodes"
    assert not cluster.overcommitted()
    for state in cluster.nodes.values():
        for position, device in enumerate(state.devices):
            assert state.used_slots[position] <= device.slots and state.used_cores[position] <= device.cores
    inspect = await (await client.get("/inspect")).json()
    shown = {holder["uid"] for node in inspect["nodes"] for gpu in node["devices"] for holder in gpu["pods"]}
    assert shown == set(bound)
    annotated = [pod for pod in cluster.pods.values() if pod.allocation is not None]
    assert len(annotated) == len(bound), "every bound pod carries its HAMi allocation"


async def test_concurrent_binds_never_take_a_namespace_over_its_quota(client_for: ClientFor) -> None:
    """The burst again, in two namespaces with quotas: ml-a may hold 40 GiB in all and 8 of it on the A100 node;
    ml-b 12 GiB. The GPUs (3 nodes x 2 x 16 GiB) hold more than both quotas: only the quotas stop the pods. At every
    step neither namespace holds more than its limits (summed from the cache's holds, not from the quota book), and
    in the end each holds exactly what its quota lets pods of 4 GiB take: 10 pods (2 on the A100 node), 3 pods."""
    rng = random.Random(11)
    cluster = make_cluster(*(make_node(name, gpus=2, mem=16) for name in NODES))
    a100 = make_node(NODES[0], gpus=2, mem=16)
    a100["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB"
    cluster.apply_node(a100)
    resources = cluster.protocol.quota_resources
    quotas_of(cluster).replace(
        [
            read_quota(
                make_quota(
                    "team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40", "limits.aliyun.com/gpu-mem.A100": "8"}
                ),
                resources,
            ),
            read_quota(make_quota("team", "ml-b", **{"limits.aliyun.com/gpu-mem": "12"}), resources),
        ]
    )
    client = await client_for(make_service(cluster, binder=SlowApi(cluster, rng)))
    pods = [make_pod(f"q-{i}", gpu_mem=4, namespace=rng.choice(("ml-a", "ml-b"))) for i in range(60)]
    results: dict[str, str] = {}

    def held(namespace: str, node: str | None = None) -> int:
        return sum(
            hold.allocation.memory
            for state in cluster.nodes.values()
            for hold in state.holds.values()
            if hold.allocation.pod.startswith(namespace + "/") and node in (None, state.name)
        )

    def within_quotas() -> None:
        assert held("ml-a") <= 40 and held("ml-a", NODES[0]) <= 8 and held("ml-b") <= 12

    async def schedule(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = orjson.dumps({"Pod": pod, "NodeNames": list(NODES)})
        passed = (await (await client.post("/filter", data=body)).json())["NodeNames"]
        within_quotas()
        if not passed:
            results[meta["uid"]] = "unschedulable"
            return
        bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"]}
        bind["Node"] = rng.choice(passed)
        results[meta["uid"]] = (await (await client.post("/bind", data=orjson.dumps(bind))).json())["Error"]
        within_quotas()

    await asyncio.gather(*(schedule(pod) for pod in pods))
    refused = [error for error in results.values() if error not in ("", "unschedulable")]
    assert refused and all("ResourceQuota team" in error for error in refused), "binds raced past the filter"
    assert (held("ml-a"), held("ml-a", NODES[0]), held("ml-b")) == (40, 8, 12)
