"""A pod asking several GPUs, through the verbs: refused in gpushare's protocol by default, since the gpushare
device plugin gives a pod one GPU at most (`SeveralGpus`); placed and bound with `--gpushare-several-gpus bind`;
placed and bound in HAMi's protocol, whose plugin runs it."""

from __future__ import annotations

from typing import Any

import orjson

from extender.core.protocols.gpushare import Profile, SeveralGpus
from extender.sources.file import FileBinder
from tests.builders import make_cluster, make_hami_cluster, make_hami_node, make_hami_pod, make_node, make_pod
from tests.conftest import ClientFor, make_service

TWO_GPUS = (
    "asks 2 GPUs (aliyun.com/gpu-count: 2); gpushare's device plugin gives a pod one GPU at most: "
    "its container would start without a GPU"
)


def filter_body(pod: dict[str, Any], names: list[str]) -> bytes:
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def bind_body(pod: dict[str, Any], node: str) -> bytes:
    meta = pod["metadata"]
    return orjson.dumps(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    )


async def test_gpushare_answers_every_node_unresolvable_with_the_plugins_reason(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=4, mem=16))
    client = await client_for(make_service(cluster))
    reply = await (await client.post("/filter", data=filter_body(make_pod("wide", 8, gpus=2), ["n1", "n2"]))).json()
    assert (reply["NodeNames"], reply["FailedNodes"]) == ([], {})
    assert reply["FailedAndUnresolvableNodes"] == {"n1": TWO_GPUS, "n2": TWO_GPUS}
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_filter_rejections_total{cause="too_few"} 2.0' in metrics
    assert 'extender_filter_nodes_total{result="unresolvable"} 2.0' in metrics


async def test_gpushare_refuses_a_bind_that_comes_all_the_same_and_writes_nothing(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    pod = make_pod("wide", 8, gpus=2)
    cluster.apply_pod(pod)
    client = await client_for(make_service(cluster))
    reply = await (await client.post("/bind", data=bind_body(pod, "n1"))).json()
    assert reply["Error"] == f"pod default/wide: {TWO_GPUS}"
    assert cluster.pods[pod["metadata"]["uid"]].node_name == ""
    assert cluster.nodes["n1"].used == [0, 0] and not cluster.reserved


async def test_with_bind_gpushare_places_and_binds_it_as_before(client_for: ClientFor) -> None:
    """8 GiB over 2 GPUs: 4 on each, recorded in gpu-extender.io/device-indexes alone."""
    profile = Profile(several_gpus=SeveralGpus.BIND)
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), profile=profile)
    pod = make_pod("wide", 8, gpus=2)
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, [pod])))
    assert (await (await client.post("/filter", data=filter_body(pod, ["n1"]))).json())["NodeNames"] == ["n1"]
    assert (await (await client.post("/bind", data=bind_body(pod, "n1"))).json())["Error"] == ""
    record = cluster.pods[pod["metadata"]["uid"]]
    assert record.node_name == "n1" and record.allocation is not None and record.allocation.indexes == (0, 1)
    assert cluster.nodes["n1"].used == [4, 4]


async def test_hami_places_and_binds_it_as_ever(client_for: ClientFor) -> None:
    cluster = make_hami_cluster(make_hami_node("gpu-1", gpus=2))
    pod = make_hami_pod("wide", gpus=2, mem=20000)
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, [pod])))
    assert (await (await client.post("/filter", data=filter_body(pod, ["gpu-1"]))).json())["NodeNames"] == ["gpu-1"]
    assert (await (await client.post("/bind", data=bind_body(pod, "gpu-1"))).json())["Error"] == ""
    assert cluster.nodes["gpu-1"].used == [20000, 20000]
