"""Quotas where pods are placed: the filter refuses the nodes where the pod would take its namespace over a quota
(every node of a model it has no room left for), classified for preemption; /preempt keeps only victims that
free the quota too; the requeue wakes kube-scheduler when a quota has room again.

The arithmetic is in each case's id or comment: `16+8>16` means the namespace holds 16, the pod needs 8, the
limit is 16.
"""

from __future__ import annotations

from typing import Any

from extender.core.cache import Cache
from extender.core.devices import Demand
from extender.core.holds import Allocation
from extender.core.placement.config import Ask, Narrowing, Policy, PolicyConfig
from extender.core.placement.filtering import FilterOutcome
from extender.core.placement.fit import Cause
from extender.core.preemption import preempt_candidates
from extender.core.quota.admission import most_asked, quota_filter
from extender.core.quota.limits import read_quota
from extender.core.requeue import Requeue
from tests.builders import (
    PROFILE,
    bound_pod,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_ledger,
    make_node,
    make_pod,
    make_quota,
    placer_for,
    quotas_of,
)

A100, T4 = "NVIDIA-A100-SXM4-40GB", "Tesla-T4"
NODES = ("a100-1", "a100-2", "t4-1", "t4-2")


def labelled(name: str, model: str, gpus: int = 2, mem: int = 16) -> dict[str, Any]:
    node = make_node(name, gpus=gpus, mem=mem)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = model
    return node


def mixed_cluster(*pods: dict[str, Any], **hard: str) -> Cache:
    """Two A100 nodes and two T4 nodes (2 GPUs x 16 GiB each), and the quota `team` of namespace ml-a."""
    nodes = [labelled(name, A100 if name.startswith("a100") else T4) for name in NODES]
    cluster = make_cluster(*nodes, pods=pods)
    quotas_of(cluster).replace([read_quota(make_quota("team", "ml-a", **hard), PROFILE.quota_resources)])
    return cluster


def running(
    name: str, node: str, index: int, gpu_mem: int, namespace: str = "ml-a", priority: int = 0
) -> dict[str, Any]:
    pod = bound_pod(name, node, (index,), gpu_mem, namespace=namespace)
    pod["spec"]["priority"] = priority
    return pod


FILL = PolicyConfig(policy=Policy.FILL)
"""Every node that fits passes (the fragmentation policy would pass the best one only)."""


def judge(cluster: Cache, pod: dict[str, Any], config: PolicyConfig = FILL) -> FilterOutcome:
    """The filter's answer for the pod over every node, as `verbs._judge` asks it."""
    demand = cluster.protocol.pod_demand(pod)
    ask = Ask(demand)
    placer = placer_for(cluster, config)
    admit = quota_filter(pod, demand, placer, quotas_of(cluster), cluster.nodes, ask)
    return placer.filter(demand, list(NODES), cluster.nodes, "", ask, admit)


def test_every_node_of_a_model_the_namespace_has_no_room_left_for_is_refused_and_the_others_pass() -> None:
    cluster = mixed_cluster(running("held", "a100-1", 0, 16), **{"limits.aliyun.com/gpu-mem.A100": "16"})
    outcome = judge(cluster, make_pod("new", gpu_mem=8, namespace="ml-a"))  # 16+8>16 on A100s, T4s uncounted
    assert outcome.passed == ["t4-1", "t4-2"]
    reason = "namespace ml-a uses 16 of its 16 GiB of A100 memory (ResourceQuota team); this pod needs 8 GiB"
    assert outcome.unresolvable == {"a100-1": reason, "a100-2": reason}
    assert outcome.causes[Cause.QUOTA] == 2


def test_a_limit_for_every_gpu_refuses_every_node() -> None:
    cluster = mixed_cluster(running("held", "t4-1", 0, 12), **{"limits.aliyun.com/gpu-mem": "16"})
    outcome = judge(cluster, make_pod("new", gpu_mem=8, namespace="ml-a"))  # 12+8>16
    assert outcome.passed == [] and len(outcome.unresolvable) == 4


def test_another_namespace_is_not_limited_by_it() -> None:
    cluster = mixed_cluster(running("held", "t4-1", 0, 16), **{"limits.aliyun.com/gpu-mem": "16"})
    pod = make_pod("new", gpu_mem=8, namespace="ml-b")
    assert (
        quota_filter(
            pod, cluster.protocol.pod_demand(pod), placer_for(cluster, FILL), quotas_of(cluster), cluster.nodes, None
        )
        is None
    )
    assert judge(cluster, pod).passed == list(NODES)


def test_a_node_where_the_namespaces_own_lower_priority_pods_could_be_evicted_is_failed_not_unresolvable() -> None:
    cluster = mixed_cluster(
        running("low", "t4-1", 0, 8, priority=0),
        running("high", "t4-2", 0, 8, priority=100),
        running("other", "a100-1", 0, 8, namespace="ml-b", priority=0),
        **{"limits.aliyun.com/gpu-mem": "16"},
    )
    pod = make_pod("new", gpu_mem=8, namespace="ml-a")
    pod["spec"]["priority"] = 50
    outcome = judge(cluster, pod)  # 16+8>16 everywhere; evicting "low" (8) on t4-1 makes 8+8=16
    assert list(outcome.failed) == ["t4-1"]
    assert sorted(outcome.unresolvable) == ["a100-1", "a100-2", "t4-2"], "ml-b's pod frees none of ml-a's quota"


def test_the_nodes_narrowed_to_are_those_the_quota_allows() -> None:
    """Under the fragmentation policy the filter passes its one best node: chosen among the nodes the quota
    allows, never one it then refuses."""
    cluster = mixed_cluster(running("held", "a100-1", 0, 8), **{"limits.aliyun.com/gpu-mem.A100": "8"})
    config = PolicyConfig(policy=Policy.FRAGMENTATION, narrowing=Narrowing.BEST)
    outcome = judge(cluster, make_pod("new", gpu_mem=8, namespace="ml-a"), config)  # 8+8>8 on A100s
    assert len(outcome.passed) == 1 and outcome.passed[0].startswith("t4-")


def test_a_whole_card_is_counted_at_each_nodes_card_size() -> None:
    """HAMi gives `nvidia.com/gpu: 1` without memory the whole card (its 40960 or 81920 MiB), so a quota of
    40960 MiB lets it on the 40 GB card and not on the 80 GB one."""
    cluster = make_hami_cluster(
        make_hami_node("small", gpus=1, mem=40960), make_hami_node("large", gpus=1, mem=81920, model="NVIDIA H100")
    )
    quotas_of(cluster).replace(
        [
            read_quota(
                make_quota("team", "ml-a", **{"limits.nvidia.com/gpumem": "40960"}), cluster.protocol.quota_resources
            )
        ]
    )
    pod = make_hami_pod("whole", namespace="ml-a")
    demand = cluster.protocol.pod_demand(pod)
    assert most_asked(demand) is None, "a share of each GPU's memory: known only per node"
    placer = placer_for(cluster, PolicyConfig())
    admit = quota_filter(pod, demand, placer, quotas_of(cluster), cluster.nodes, None)
    outcome = placer.filter(demand, ["small", "large"], cluster.nodes, "", None, admit)
    assert outcome.passed == ["small"]
    assert outcome.unresolvable == {
        "large": "namespace ml-a uses 0 of its 40960 MiB of GPU memory (ResourceQuota team); this pod needs 81920 MiB"
    }


def test_the_bind_refuses_what_the_quota_does_not_allow_even_when_the_filter_let_it_through() -> None:
    """Two pods filtered while the namespace held nothing: the first bind takes the room, the second is refused at
    its reservation, which checks and records in one step."""
    cluster = mixed_cluster(**{"limits.aliyun.com/gpu-mem": "16"})
    ledger = make_ledger(cluster)
    assert judge(cluster, make_pod("p1", gpu_mem=16, namespace="ml-a")).passed == list(NODES)
    assert judge(cluster, make_pod("p2", gpu_mem=16, namespace="ml-a")).passed == list(NODES)
    assert ledger.reserve(Allocation.uniform("u1", "ml-a/p1", "t4-1", (0,), 16)) is None
    refusal = ledger.reserve(Allocation.uniform("u2", "ml-a/p2", "t4-2", (0,), 16))
    assert refusal == "namespace ml-a uses 16 of its 16 GiB of GPU memory (ResourceQuota team); this pod needs 16 GiB"
    assert cluster.nodes["t4-2"].used == [0, 0]


# ---- preemption --------------------------------------------------------------------------------------------


def uid_of(cluster: Cache, name: str) -> str:
    return next(uid for uid, record in cluster.pods.items() if record.name == name)


def test_preemption_keeps_only_victims_that_free_the_namespaces_quota() -> None:
    cluster = mixed_cluster(
        running("mine", "t4-1", 0, 16),
        running("theirs", "t4-1", 1, 16, namespace="ml-b"),
        **{"limits.aliyun.com/gpu-mem": "16"},
    )
    mine, theirs = uid_of(cluster, "mine"), uid_of(cluster, "theirs")
    # Evicting ml-b's pod frees a GPU, but ml-a still holds 16 of its 16: 16+16>16. Evicting its own: 0+16=16.
    kept = preempt_candidates(Demand(16), {"t4-1": [theirs]}, cluster, 100, "ml-a", quotas_of(cluster))
    assert kept == {"t4-1": [mine]}, "our own victim instead: the namespace's pod"
    assert preempt_candidates(Demand(16), {"t4-1": [mine]}, cluster, 100, "ml-a", quotas_of(cluster)) == {
        "t4-1": [mine]
    }
    assert preempt_candidates(Demand(16), {"t4-1": [theirs]}, cluster, 100, "ml-b", quotas_of(cluster)) == {
        "t4-1": [theirs]
    }


def test_preemption_drops_a_node_when_no_victim_there_frees_the_quota() -> None:
    cluster = mixed_cluster(
        running("mine", "t4-2", 0, 16),
        running("theirs", "t4-1", 1, 16, namespace="ml-b"),
        **{"limits.aliyun.com/gpu-mem": "16"},
    )
    kept = preempt_candidates(
        Demand(16), {"t4-1": [uid_of(cluster, "theirs")]}, cluster, 100, "ml-a", quotas_of(cluster)
    )
    assert kept == {}


# ---- the requeue -------------------------------------------------------------------------------------------


def test_a_pod_refused_for_its_quota_is_retried_when_its_namespace_frees_room() -> None:
    cluster = mixed_cluster(running("held", "t4-1", 0, 16), **{"limits.aliyun.com/gpu-mem": "16"})
    asked: list[str] = []
    requeue = Requeue(cluster, asked.append, quotas=quotas_of(cluster))
    requeue.refused("waiting", Demand(8), "ml-a")
    requeue.freed(["t4-2"], since=0)
    assert asked == [], "16+8>16: room on t4-2's GPUs, none in the quota"
    cluster.forget_pod(uid_of(cluster, "held"))
    requeue.freed(["t4-1"], since=0)
    assert asked == ["room came free on t4-1 for a pod refused since"]


def test_a_quota_raised_retries_the_pods_it_kept_out_and_a_quota_still_full_does_not() -> None:
    cluster = mixed_cluster(running("held", "t4-1", 0, 16), **{"limits.aliyun.com/gpu-mem": "16"})
    asked: list[str] = []
    requeue = Requeue(cluster, asked.append, quotas=quotas_of(cluster))
    requeue.refused("waiting", Demand(8), "ml-a")
    resources = PROFILE.quota_resources
    quotas_of(cluster).apply(read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "20"}), resources))
    requeue.quota_changed("ml-a")
    assert asked == [], "16+8>20"
    quotas_of(cluster).apply(read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "24"}), resources))
    requeue.quota_changed("ml-b")
    assert asked == [], "another namespace's quota"
    requeue.quota_changed("ml-a")
    assert asked == ["the quotas of namespace ml-a changed, and a pod refused there fits a100-1 now"]
