"""The filter over many node names: a pod the nodes' device plugin could run nowhere is refused on every node,
for that reason alone, before any node is judged (`DeviceProtocol.refusal`)."""

from __future__ import annotations

from extender.core.placement.fit import Cause
from extender.core.protocols.gpushare import Profile, SeveralGpus
from tests.builders import (
    PROFILE,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    make_pod,
    placer_for,
)

TWO_GPUS = (
    "asks 2 GPUs (aliyun.com/gpu-count: 2); gpushare's device plugin gives a pod one GPU at most: "
    "its container would start without a GPU"
)
BIND = Profile(several_gpus=SeveralGpus.BIND)


def test_a_gpushare_pod_asking_several_gpus_is_unresolvable_on_every_node_for_the_plugins_reason() -> None:
    """Even where two GPUs are free, and on a node the cache does not know: no node's plugin could run it."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=4, mem=16))
    demand = PROFILE.pod_demand(make_pod(gpu_mem=20, gpus=2))
    outcome = placer_for(cluster).filter(demand, ["n1", "n2", "ghost"], cluster.nodes, "default/wide")
    assert outcome.passed == [] and outcome.failed == {}
    assert outcome.unresolvable == {"n1": TWO_GPUS, "n2": TWO_GPUS, "ghost": TWO_GPUS}
    assert outcome.causes == {Cause.TOO_FEW: 3}


def test_with_bind_a_gpushare_pod_asking_several_gpus_is_judged_on_each_node_as_before() -> None:
    """20 GiB over 2 GPUs is ceil(20 / 2) = 10 on each: n1 has two GPUs of 16, n2 one."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=1, mem=16), profile=BIND)
    demand = BIND.pod_demand(make_pod(gpu_mem=20, gpus=2))
    outcome = placer_for(cluster).filter(demand, ["n1", "n2"], cluster.nodes, "default/wide")
    assert outcome.passed == ["n1"]
    assert outcome.unresolvable == {"n2": "needs 2 GPUs with 10 GiB each; 1 of 1 GPUs here are that large"}


def test_a_gpushare_pod_on_one_gpu_is_not_refused() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    demand = PROFILE.pod_demand(make_pod(gpu_mem=16, gpus=1))  # gpu-count 1 is one GPU, as no count is
    assert placer_for(cluster).filter(demand, ["n1"], cluster.nodes, "default/one").passed == ["n1"]


def test_a_hami_pod_asking_several_gpus_is_placed_as_ever() -> None:
    """HAMi's device plugin runs such pods: its protocol refuses nothing."""
    cluster = make_hami_cluster(make_hami_node("gpu-1", gpus=2))
    pod = make_hami_pod("wide", gpus=2, mem=20000)
    demand = cluster.protocol.pod_demand(pod)
    assert placer_for(cluster).filter(demand, ["gpu-1"], cluster.nodes, "default/wide").passed == ["gpu-1"]
