"""A MIG node served through the verbs: filter, bind with its reservation in the Binding, and /inspect.

HAMi v2.10.0 (commit 4707fb02): every pod's reservation must be complete and no two instances may overlap,
or its device plugin fails the container's Allocate (pkg/device-plugin/nvidiadevice/nvinternal/plugin/
util.go:322-333; the placement is made exactly as reserved, `EnsureAllocation`).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.core.placement.config import PolicyConfig
from extender.core.protocols.hami_mig import MIG_ALLOCATIONS, decode_instances
from extender.sources.file import FileBinder
from tests.builders import make_hami_cluster, make_hami_node, make_hami_pod, make_mig_node
from tests.conftest import FIT_ONLY, ClientFor, make_service


class RecordingBinder(FileBinder):
    """The file binder (the cache sees each binding as a watch would), keeping the annotations of each."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.written: dict[str, dict[str, str]] = {}

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        self.written[pod["metadata"]["name"]] = dict(annotations)
        await super().bind(pod, node, annotations)


@pytest.mark.parametrize("policy", [PolicyConfig(), FIT_ONLY], ids=["fragmentation", "fill"])
async def test_seven_1g_pods_fill_a_mig_gpu_without_overlap_and_the_eighth_is_told_why(
    client_for: ClientFor, policy: PolicyConfig
) -> None:
    cluster = make_hami_cluster(make_mig_node("mig-1"), make_hami_node("core-1", gpus=1))
    binder = RecordingBinder(cluster, [])
    client = await client_for(make_service(cluster, binder=binder, policy=policy))
    names = ["mig-1", "core-1"]
    for number in range(7):
        pod = make_hami_pod(f"p{number}", mem=4000, **{"nvidia.com/vgpu-mode": "mig"})
        reply = await (await client.post("/filter", orjson.dumps({"Pod": pod, "NodeNames": names}))).json()
        assert reply["NodeNames"] == ["mig-1"], reply
        bound = {"PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"]}
        assert (await (await client.post("/bind", orjson.dumps({**bound, "Node": "mig-1"}))).json())["Error"] == ""
    starts = set()
    for written in binder.written.values():
        ((uuid, instance),) = decode_instances(written[MIG_ALLOCATIONS])
        assert (uuid, instance.profile, instance.size) == ("GPU-mig-1-0", "1g.5gb", 1)
        assert written["hami.io/vgpu-devices-allocated"] == "GPU-mig-1-0,NVIDIA,5120,14:;"
        starts.add(instance.start)
    assert starts == set(range(7)) and cluster.overcommitted() == []
    late = make_hami_pod("late", mem=4000, **{"nvidia.com/vgpu-mode": "mig"})
    reply = await (await client.post("/filter", orjson.dumps({"Pod": late, "NodeNames": names}))).json()
    assert reply["NodeNames"] == []  # 7 instances: the registration's count (HAMi checks it first, device.go:761)
    assert "runs its most pods (7 each)" in reply["FailedAndUnresolvableNodes"]["mig-1"]
    inspection = await (await client.get("/inspect")).json()
    (node,) = [node for node in inspection["nodes"] if node["name"] == "mig-1"]
    (device,) = node["devices"]
    assert device["mode"] == "mig" and device["free"] == 0
    assert sorted(holder["mig"][0]["start"] for holder in device["pods"]) == list(range(7))


async def test_a_bind_to_a_mig_node_writes_the_reservation_in_the_same_binding(client_for: ClientFor) -> None:
    """No filter first (kube-scheduler binds where its own plugins chose): the bind chooses the instance, and
    the Binding carries the reservation with the device entries (one atomic write, as for every allocation)."""
    cluster = make_hami_cluster(make_mig_node("mig-1"))
    binder = RecordingBinder(cluster, [])
    client = await client_for(make_service(cluster, binder=binder))
    pod = make_hami_pod("p", mem=15000)
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "mig-1"}
    binder._pods[pod["metadata"]["uid"]] = pod
    cluster.apply_pod(pod)
    assert (await (await client.post("/bind", orjson.dumps(body))).json())["Error"] == ""
    written = binder.written["p"]
    assert orjson.loads(written[MIG_ALLOCATIONS])[0]["profile"] == "3g.20gb"
    assert written["hami.io/vgpu-devices-to-allocate"] == "GPU-mig-1-0,NVIDIA,20480,42:;"
