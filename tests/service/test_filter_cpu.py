"""`/filter-cpu`: the filter of the second, ignorable extender entry every pod reaches on the default scheduler
(`tools/schedconfig.cpu_entry`, issue 25)."""

from __future__ import annotations

import orjson

from extender.core.placement.config import PolicyConfig
from tests.builders import bound_pod, make_cluster, make_node, make_pod
from tests.conftest import ClientFor, make_service


def cluster_with_a_full_gpu_node() -> tuple[dict[str, object], ...]:
    """full: 2 GPUs of 16 GiB, both taken, 16 cores; empty: 2 free GPUs, 2 cores; cpu: no GPU."""
    return (
        make_node("empty", gpus=2, cpu="2"),
        make_node("full", gpus=2, cpu="16"),
        make_node("cpu", gpus=0, cpu="16"),
    )


async def test_a_pod_asking_no_gpu_goes_where_its_cpu_strands_no_gpu(client_for: ClientFor) -> None:
    """On `empty` its 2 cores would leave both GPUs without cpu; on `full` and `cpu` it strands nothing: both
    pass (they tie), and kube-scheduler's own scores choose between them."""
    pods = (bound_pod("a", "full", (0,), 16), bound_pod("b", "full", (1,), 16))
    cluster = make_cluster(*cluster_with_a_full_gpu_node(), pods=pods)
    client = await client_for(make_service(cluster, policy=PolicyConfig()))
    pod = make_pod("web", gpu_mem=None, cpu="2")
    body = orjson.dumps({"Pod": pod, "NodeNames": ["empty", "full", "cpu"], "Nodes": None})
    reply = await (await client.post("/filter-cpu", body)).json()
    assert sorted(reply["NodeNames"]) == ["cpu", "full"] and reply["Error"] == ""


async def test_a_gpu_pod_passes_untouched_the_first_entry_filtered_it(client_for: ClientFor) -> None:
    """No judgement, no assumption held: the nodes sent come back, even one that could not take it."""
    cluster = make_cluster(*cluster_with_a_full_gpu_node(), pods=(bound_pod("a", "full", (0, 1), 16),))
    service = make_service(cluster, policy=PolicyConfig())
    client = await client_for(service)
    pod = make_pod("train", gpu_mem=8)
    body = orjson.dumps({"Pod": pod, "NodeNames": ["full", "empty"], "Nodes": None})
    reply = await (await client.post("/filter-cpu", body)).json()
    assert reply["NodeNames"] == ["full", "empty"] and not reply["FailedNodes"]
    assert cluster.hold_of(pod["metadata"]["uid"]) is None
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_requests_total{outcome="ok",verb="filter-cpu"} 1.0' in metrics


async def test_bad_input_to_filter_cpu_is_a_400_naming_it(client_for: ClientFor) -> None:
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    response = await client.post("/filter-cpu", b'{"NodeNames": ["n1"]}')
    assert response.status == 400 and "Pod: Field required" in await response.text()
