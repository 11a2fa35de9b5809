"""Jobs declared by a PodGroup (scheduler-plugins' coscheduling, Volcano), placed whole through a member's filter
and bind (`core/jobs.py`), with the PodGroup's minimum read from the cache's PodGroups when the member asks
(`groups.resolve`, `Cache.podgroups`): a PodGroup created after its pods, a minMember changed, a CRD not installed.

Pods are gpushare's, each asking one whole GPU of 16 GiB; PodGroups carry only what is kept of them
(`groups.slim_podgroup`)."""

from __future__ import annotations

from typing import Any

from extender.core import jobs
from extender.core.cache import Cache
from extender.core.groups import (
    COSCHEDULING_GROUP,
    KUEUE_GROUP,
    KUEUE_TOTAL,
    NO_CRDS,
    VOLCANO_GROUPS,
    Declarations,
    Declared,
    GroupKey,
    PodGroups,
    Scheme,
    declared,
    having,
    listed,
    read,
    slim_podgroup,
)
from extender.core.holds import HoldState
from extender.core.ledger import Ledger
from extender.core.pods import pod_record
from extender.core.requeue import Requeue
from tests.builders import make_cluster, make_ledger, make_node, make_pod, placer_for

TRAIN = GroupKey(Scheme.COSCHEDULING, "default", "train")
NODES = ["n1", "n2"]


def coscheduled(name: str, group: str = "train") -> dict[str, Any]:
    """A pod of coscheduling's PodGroup `group`, named by its label."""
    pod = make_pod(name, gpu_mem=16, uid=f"uid-{name}")
    pod["metadata"]["labels"] = {COSCHEDULING_GROUP: group}
    return pod


def volcano(name: str, group: str = "train", annotation: str = VOLCANO_GROUPS[0]) -> dict[str, Any]:
    """A pod of Volcano's PodGroup `group`, named by its annotation."""
    pod = make_pod(name, gpu_mem=16, uid=f"uid-{name}")
    pod["metadata"]["annotations"][annotation] = group
    return pod


def podgroup(name: str, min_member: int, api_version: str = "scheduling.x-k8s.io/v1alpha1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "7"},
        "spec": {"minMember": min_member, "scheduleTimeoutSeconds": 60},
        "status": {"phase": "Pending", "running": 0},
    }


def coscheduling(*podgroups: dict[str, Any]) -> PodGroups:
    """coscheduling's CRD installed, with these PodGroups (Volcano's not installed)."""
    return listed(podgroups) if podgroups else PodGroups(coscheduling={})


def cluster_of(*pods: dict[str, Any], podgroups: PodGroups = NO_CRDS) -> tuple[Cache, Ledger]:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    cluster.podgroups = podgroups
    for pod in pods:
        cluster.apply_pod(pod)
    return cluster, make_ledger(cluster)


def filter_of(pod: dict[str, Any], cluster: Cache, ledger: Ledger) -> jobs.MemberFilter | None:
    """The member's filter as the verb makes it: its declaration resolved against the cache's PodGroups now. None
    when it is placed as any pod (it declares no job the cluster knows of, or its job has its minimum)."""
    said = declared(pod, cluster.podgroups)
    if said is None:
        return None
    return jobs.filter_member(pod_record(pod, cluster.protocol), said, NODES, cluster, ledger, placer_for(cluster))


def grouped(cluster: Cache) -> dict[str, str]:
    """Pod UID -> node of every GROUPED hold."""
    return {uid: hold.allocation.node for uid, hold in cluster.reserved.items() if hold.state is HoldState.GROUPED}


# ---- what the cache records, and what it resolves to ----------------------------------------------------------


def test_a_pod_naming_a_podgroup_is_recorded_by_the_podgroups_name_alone() -> None:
    record = pod_record(coscheduled("w-0"), make_cluster().protocol)
    assert record.group == Declarations("default/w-0", (Declared(TRAIN),))
    assert read(make_pod("plain", gpu_mem=4)) is None


def test_a_kueue_pod_is_recorded_as_before() -> None:
    pod = make_pod("w-0", gpu_mem=16)
    pod["metadata"]["labels"] = {KUEUE_GROUP: "train"}
    pod["metadata"]["annotations"][KUEUE_TOTAL] = "3"
    assert read(pod) == Declared(GroupKey(Scheme.KUEUE, "default", "train"), 3)


def test_a_podgroup_is_kept_as_its_name_namespace_and_min_member() -> None:
    assert slim_podgroup(podgroup("train", 3)) == {
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minMember": 3},
    }


def test_listed_podgroups_are_told_apart_by_api_version_and_a_crd_none_lists_is_not_installed() -> None:
    found = listed(
        [
            podgroup("a", 2),
            podgroup("b", 3, "scheduling.volcano.sh/v1beta1"),
            podgroup("c", 4, "scheduling.run.ai/v2alpha2"),  # another scheduler's PodGroup: no one's here
        ]
    )
    assert found.coscheduling is not None and set(found.coscheduling) == {"default/a"}
    assert found.volcano is not None and set(found.volcano) == {"default/b"}
    only = listed([podgroup("a", 2)])
    assert only.volcano is None and having(only, Scheme.VOLCANO, {}).volcano == {}


# ---- placed whole ---------------------------------------------------------------------------------------------


def test_a_coscheduling_job_is_planned_whole_at_its_first_members_filter() -> None:
    pods = [coscheduled(f"w-{n}") for n in range(3)]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling(podgroup("train", 3)))
    assert filter_of(pods[1], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    assert grouped(cluster) == {"uid-w-0": "n1", "uid-w-1": "n1", "uid-w-2": "n2"}
    assert filter_of(pods[2], cluster, ledger) == jobs.MemberFilter("n2")
    assert filter_of(pods[0], cluster, ledger) == jobs.MemberFilter("n1")


def test_a_volcano_job_is_planned_whole_whichever_annotation_names_it() -> None:
    pods = [volcano("w-0"), volcano("w-1", annotation=VOLCANO_GROUPS[1])]
    cluster, ledger = cluster_of(*pods, podgroups=listed([podgroup("train", 2, "scheduling.volcano.sh/v1beta1")]))
    assert filter_of(pods[0], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    assert grouped(cluster) == {"uid-w-0": "n1", "uid-w-1": "n1"}
    assert ledger.group_hold(GroupKey(Scheme.VOLCANO, "default", "train")) is not None


def test_a_job_too_big_for_the_nodes_is_refused_whole_and_holds_nothing() -> None:
    pods = [coscheduled(f"w-{n}") for n in range(5)]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling(podgroup("train", 5)))
    refused = filter_of(pods[0], cluster, ledger)
    assert refused is not None and refused.reason == "job default/train needs 5 pods of 1 GPU with 16 GiB; 4 fit now"
    assert not cluster.reserved


def test_a_members_bind_without_a_hold_is_refused_while_its_podgroup_lacks_members() -> None:
    pods = [coscheduled("w-0"), coscheduled("w-1")]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling(podgroup("train", 2)))
    assert jobs.unheld(pod_record(pods[0], cluster.protocol), cluster, ledger) == (
        "pod default/w-0 is a member of job default/train, which holds nothing now: planned whole at its next filter"
    )


# ---- the PodGroup read when the member asks --------------------------------------------------------------------


def test_members_of_a_podgroup_created_after_them_wait_then_are_placed_whole() -> None:
    pods = [coscheduled("w-0"), coscheduled("w-1")]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling())
    waiting = filter_of(pods[0], cluster, ledger)
    assert waiting is not None
    assert waiting.reason == "pod default/w-0: coscheduling's PodGroup default/train does not exist (yet)"
    assert jobs.unheld(pod_record(pods[0], cluster.protocol), cluster, ledger) == waiting.reason
    assert not cluster.reserved
    cluster.podgroups = coscheduling(podgroup("train", 2))
    assert filter_of(pods[0], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    assert grouped(cluster) == {"uid-w-0": "n1", "uid-w-1": "n1"}


def test_a_raised_min_member_makes_the_job_wait_for_its_pods_then_plans_them_all() -> None:
    pods = [coscheduled(f"w-{n}") for n in range(3)]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling(podgroup("train", 4)))
    waiting = filter_of(pods[0], cluster, ledger)
    assert waiting is not None and waiting.reason == "job default/train needs 4 pods to start; 3 exist, 0 bound"
    cluster.podgroups = coscheduling(podgroup("train", 3))
    assert filter_of(pods[0], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    assert len(grouped(cluster)) == 3


def test_a_min_member_changed_after_the_job_was_held_is_planned_again_whole() -> None:
    """Held for a minimum of 2 (w-0, w-1), then minMember 3: the hold is for members that are no longer the ones
    to place, so the next filter lets it go and plans the three."""
    pods = [coscheduled(f"w-{n}") for n in range(3)]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling(podgroup("train", 2)))
    assert filter_of(pods[0], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    assert set(grouped(cluster)) == {"uid-w-0", "uid-w-1"}
    past = filter_of(pods[2], cluster, ledger)
    assert past is not None
    assert past.reason == "pod default/w-2 waits for the first 2 pods of job default/train to start"
    cluster.podgroups = coscheduling(podgroup("train", 3))
    assert filter_of(pods[2], cluster, ledger) == jobs.MemberFilter("n2", planned=True)
    assert grouped(cluster) == {"uid-w-0": "n1", "uid-w-1": "n1", "uid-w-2": "n2"}
    assert not cluster.overcommitted()


def test_a_min_member_lowered_to_what_is_bound_places_the_rest_as_any_pod() -> None:
    pods = [coscheduled(f"w-{n}") for n in range(3)]
    pods[0]["spec"]["nodeName"] = "n1"
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling(podgroup("train", 3)))
    assert filter_of(pods[1], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    cluster.podgroups = coscheduling(podgroup("train", 1))
    assert filter_of(pods[2], cluster, ledger) is None, "its minimum is bound: the others go as any pod"
    assert not grouped(cluster), "the hold made for the old minimum is let go: it would hold GPUs for nothing"
    assert jobs.unheld(pod_record(pods[2], cluster.protocol), cluster, ledger) is None


def test_without_its_crd_a_podgroup_label_places_the_pod_as_any_pod() -> None:
    pods = [coscheduled("w-0"), coscheduled("w-1")]
    cluster, ledger = cluster_of(*pods, podgroups=listed([podgroup("train", 2, "scheduling.volcano.sh/v1beta1")]))
    assert filter_of(pods[0], cluster, ledger) is None
    assert jobs.unheld(pod_record(pods[0], cluster.protocol), cluster, ledger) is None
    assert not cluster.reserved


def test_a_crd_removed_places_its_waiting_members_as_any_pod() -> None:
    pods = [coscheduled("w-0"), coscheduled("w-1")]
    cluster, ledger = cluster_of(*pods, podgroups=coscheduling())
    assert filter_of(pods[0], cluster, ledger) is not None
    cluster.podgroups = having(cluster.podgroups, Scheme.COSCHEDULING, None)
    assert filter_of(pods[0], cluster, ledger) is None


# ---- the jobs index ---------------------------------------------------------------------------------------------


def test_a_pod_of_kueue_and_coscheduling_is_kueues_member_until_coschedulings_crd_is_installed() -> None:
    """Filed under both groups (`Jobs`): which one counts is the PodGroups' to say at the time."""
    pods = []
    for n in range(2):
        pod = coscheduled(f"w-{n}")
        pod["metadata"]["labels"][KUEUE_GROUP] = "train"
        pod["metadata"]["annotations"][KUEUE_TOTAL] = "2"
        pods.append(pod)
    cluster, ledger = cluster_of(*pods)
    kueue = GroupKey(Scheme.KUEUE, "default", "train")
    assert cluster.groups.members(kueue) == cluster.groups.members(TRAIN) == {"uid-w-0", "uid-w-1"}
    assert filter_of(pods[0], cluster, ledger) == jobs.MemberFilter("n1", planned=True)
    assert ledger.group_hold(kueue) is not None
    ledger.release_group(kueue)
    cluster.podgroups = coscheduling(podgroup("train", 2))
    refused = filter_of(pods[0], cluster, ledger)
    assert refused is not None and refused.reason == (
        "pod default/w-0: pod default/w-0 declares two groups (Kueue's pod group default/train and coscheduling's "
        "PodGroup default/train); it may start with one"
    )


def test_a_member_that_drops_its_label_leaves_the_index() -> None:
    pod = coscheduled("w-0")
    cluster, _ = cluster_of(pod)
    assert cluster.groups.members(TRAIN) == {"uid-w-0"}
    del pod["metadata"]["labels"][COSCHEDULING_GROUP]
    cluster.apply_pod(pod)
    assert cluster.groups.members(TRAIN) == frozenset() and len(cluster.groups) == 0


def test_a_pod_naming_a_podgroup_arriving_for_a_job_found_short_asks_kube_scheduler_to_retry() -> None:
    """`Requeue.pod_arrived` reads what the cache recorded, which for a PodGroup's pod is every group it may be of."""
    cluster, _ = cluster_of(podgroups=coscheduling(podgroup("train", 2)))
    asked: list[str] = []
    requeue = Requeue(cluster, asked.append)
    requeue.job_short(TRAIN)
    cluster.apply_pod(make_pod("plain", gpu_mem=4))
    cluster.apply_pod(coscheduled("w-0"))
    assert asked == ["pod default/w-0 of job default/train arrived; its members refused for want of it may start"]
