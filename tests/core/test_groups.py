"""Groups as users declare them (`core/groups.py`), and the all-or-nothing planner (`core/gang.py`).

Sources, at the versions read (from the Go module proxy): Kueue v0.17.0 (`kq/` = pkg/controller/jobs/pod/),
scheduler-plugins v0.31.8 (`cs/` = pkg/coscheduling/), volcano.sh/apis v1.12.1 (`vc/` =
pkg/apis/scheduling/v1beta1/). Where a case is the project's own test, its file and line are given.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.gang import Member, NoPlan, Plan, plan_group
from extender.core.groups import (
    COSCHEDULING_GROUP,
    KUEUE_GROUP,
    KUEUE_TOTAL,
    VOLCANO_GROUPS,
    Declared,
    GroupKey,
    PodGroups,
    Scheme,
    declared,
    membership,
    min_member,
)
from extender.core.holds import Hold, HoldState
from extender.core.objects import pod_key
from extender.core.placement.config import Ask
from extender.core.resources import pod_request
from tests.builders import (
    FakeClock,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_mig_node,
    make_node,
    make_pod,
    placer_for,
    random_cluster,
)


def grouped(
    name: str,
    namespace: str = "test-ns",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str = "",
    phase: str = "Pending",
    gated: bool = False,
) -> dict[str, Any]:
    pod = make_pod(name, namespace=namespace, uid=f"uid-{name}", node=node, phase=phase)
    pod["metadata"]["labels"] = dict(labels or {})
    pod["metadata"]["annotations"] |= annotations or {}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    return pod


def kueue(name: str, group: str | None, total: str | None, **kwargs: Any) -> dict[str, Any]:
    labels = {KUEUE_GROUP: group} if group is not None else {}
    annotations = {KUEUE_TOTAL: total} if total is not None else {}
    return grouped(name, labels=labels, annotations=annotations, **kwargs)


def podgroup(name: str, min_member: object = None, namespace: str = "ns") -> dict[str, Any]:
    spec = {} if min_member is None else {"minMember": min_member}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def crds(*podgroups: dict[str, Any], volcano: bool = False) -> PodGroups:
    known = {f"{pg['metadata']['namespace']}/{pg['metadata']['name']}": pg for pg in podgroups}
    return PodGroups(volcano=known) if volcano else PodGroups(coscheduling=known)


def coscheduled(name: str, group: str, **kwargs: Any) -> dict[str, Any]:
    return grouped(name, namespace="ns", labels={COSCHEDULING_GROUP: group}, **kwargs)


# -- Kueue's plain-pod groups


def test_kueue_group_is_its_label_and_total_count() -> None:
    """kq/pod_webhook_test.go:808-814: a pod of group "group-name" with total count "3" is valid."""
    said = declared(kueue("p", "group-name", "3"))
    assert said == Declared(GroupKey(Scheme.KUEUE, "test-ns", "group-name"), 3)


@pytest.mark.parametrize(
    ("group", "total", "problem"),
    [
        # kq/pod_webhook_test.go:721-731: a group name and no total count
        ("test-group", None, "both the label kueue.x-k8s.io/pod-group-name and the annotation"),
        # kq/pod_webhook_test.go:733-743: a total count and no group name
        (None, "3", "both the label kueue.x-k8s.io/pod-group-name and the annotation"),
        ("", "3", "both the label kueue.x-k8s.io/pod-group-name and the annotation"),
        # kq/pod_webhook_test.go:745-756: total count "0"
        ("test-group", "0", "kueue.x-k8s.io/pod-group-total-count '0' is not a count of at least 1"),
        # kq/pod_webhook_test.go:758-769: an empty total count
        ("test-group", "", "kueue.x-k8s.io/pod-group-total-count '' is not a count of at least 1"),
        # kq/pod_webhook_test.go:771-782: a name that is no DNS-1123 subdomain
        ("notAdns1123Subdomain*", "2", "'notAdns1123Subdomain*' is not a DNS-1123 subdomain"),
        # strconv.Atoi (kq/pod_controller.go:610) takes no spaces, no underscores, no fractions
        ("test-group", " 3", "' 3' is not a count"),
        ("test-group", "1_0", "'1_0' is not a count"),
        ("test-group", "2.0", "'2.0' is not a count"),
        ("test-group", "-2", "'-2' is not a count"),
        ("test-group", "9" * 20, "is not a count"),
    ],
)
def test_kueue_declaration_that_kueue_rejects_says_why(group: str | None, total: str | None, problem: str) -> None:
    said = declared(kueue("p", group, total))
    assert said is not None and problem in said.problem


@pytest.mark.parametrize(("total", "count"), [("+3", 3), ("03", 3), ("8", 8)])
def test_kueue_total_count_is_read_as_strconv_atoi_reads_it(total: str, count: int) -> None:
    said = declared(kueue("p", "g", total))
    assert said is not None and not said.problem and said.minimum == count


def test_kueue_members_disagreeing_on_the_total_make_the_group_wait() -> None:
    """kq/pod_controller.go:812-825: every pod of the group must carry the same total count."""
    pods = [kueue("a", "train-7", "8"), kueue("b", "train-7", "6")]
    group = membership(pods).groups[GroupKey(Scheme.KUEUE, "test-ns", "train-7")]
    reason = "pods a and b of job test-ns/train-7 disagree on its size (kueue.x-k8s.io/pod-group-total-count 8 and 6)"
    assert group.problem == reason
    assert group.gang().waiting == reason and not group.gang().members


def test_kueue_failed_member_is_left_out_of_the_group() -> None:
    """kq/pod_controller.go:800-803: failed pods are skipped when the group's counts are compared."""
    pods = [kueue("a", "train-7", "2"), kueue("b", "train-7", "3", phase="Failed"), kueue("c", "train-7", "2")]
    group = membership(pods).groups[GroupKey(Scheme.KUEUE, "test-ns", "train-7")]
    assert not group.problem and [member.name for member in group.members] == ["a", "c"]


# -- coscheduling's PodGroup


def test_coscheduling_label_means_nothing_without_its_crd() -> None:
    assert declared(coscheduled("p", "pg1"), PodGroups()) is None


def test_coscheduling_pod_naming_a_missing_podgroup_is_refused() -> None:
    """cs/core/core_test.go:217-224: a pod naming a PodGroup that does not exist gets `PodGroupNotFound`."""
    said = declared(coscheduled("p", "pg-non-existent"), crds(podgroup("pg1", 2)))
    assert said == Declared(
        GroupKey(Scheme.COSCHEDULING, "ns", "pg-non-existent"),
        0,
        "coscheduling's PodGroup ns/pg-non-existent does not exist (yet)",
    )


def test_coscheduling_group_without_quorum_waits_for_its_pods() -> None:
    """cs/core/core_test.go:225-232: pg1 of minMember 2 with one pod waits."""
    found = membership([coscheduled("p", "pg1")], crds(podgroup("pg1", 2)))
    assert found.groups[GroupKey(Scheme.COSCHEDULING, "ns", "pg1")].gang().waiting == (
        "job ns/pg1 needs 2 pods to start; 1 exist, 0 bound"
    )


def test_coscheduling_group_with_a_member_bound_plans_the_one_it_lacks() -> None:
    """cs/core/core_test.go:233-243: p1b bound and p1a asking make pg1's minMember of 2."""
    pods = [coscheduled("p1a", "pg1"), coscheduled("p1b", "pg1", node="node")]
    group = membership(pods, crds(podgroup("pg1", 2))).groups[GroupKey(Scheme.COSCHEDULING, "ns", "pg1")]
    assert [member.name for member in group.gang().members] == ["p1a"]


def test_members_past_the_minimum_are_placed_as_any_pod() -> None:
    """cs/core/core_test.go:101-113 (pod count more than minMember): pg1 of minMember 2 with three pods; once
    two are bound the third goes alone."""
    pods = [coscheduled("p1a", "pg1"), coscheduled("p1b", "pg1"), coscheduled("p1c", "pg1")]
    group = membership(pods, crds(podgroup("pg1", 2))).groups[GroupKey(Scheme.COSCHEDULING, "ns", "pg1")]
    assert [member.name for member in group.gang().members] == ["p1a", "p1b"]
    pods[0]["spec"]["nodeName"] = pods[1]["spec"]["nodeName"] = "node"
    group = membership(pods, crds(podgroup("pg1", 2))).groups[GroupKey(Scheme.COSCHEDULING, "ns", "pg1")]
    assert group.gang().members == () and group.gang().waiting == ""


def test_gang_takes_the_pending_members_first_by_name_whatever_order_they_come_in() -> None:
    pods = [coscheduled(name, "pg1") for name in ("w-2", "w-0", "w-1")]
    group = membership(pods, crds(podgroup("pg1", 2))).groups[GroupKey(Scheme.COSCHEDULING, "ns", "pg1")]
    assert [member.name for member in group.gang().members] == ["w-0", "w-1"]


def test_gated_members_do_not_count_as_ready_to_place() -> None:
    pods = [coscheduled("a", "pg1"), coscheduled("b", "pg1", gated=True)]
    group = membership(pods, crds(podgroup("pg1", 2))).groups[GroupKey(Scheme.COSCHEDULING, "ns", "pg1")]
    assert group.gang().waiting == "job ns/pg1 needs 2 pods to start; 2 exist (1 gated), 0 bound"


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (None, 0),  # omitempty: absent is 0, and a group of minimum 0 starts at once
        (3, 3),
        ("3", "spec.minMember '3' is not a count"),
        (True, "spec.minMember True is not a count"),
        (-1, "spec.minMember -1 is not a count"),
        (2**31, "spec.minMember 2147483648 is not a count"),
    ],
)
def test_podgroup_min_member_is_an_int32(value: object, read: int | str) -> None:
    """cs: apis/scheduling/v1alpha1/types.go:151 and vc/types.go:177: `MinMember int32`, omitempty."""
    assert min_member(podgroup("pg1", value)) == read


def test_podgroup_of_minimum_zero_places_its_members_as_any_pod() -> None:
    group = membership([coscheduled("a", "pg1")], crds(podgroup("pg1"))).groups[
        GroupKey(Scheme.COSCHEDULING, "ns", "pg1")
    ]
    assert group.minimum == 0 and group.gang().members == () and group.gang().waiting == ""


def test_unreadable_min_member_refuses_the_pod() -> None:
    found = membership([coscheduled("a", "pg1")], crds(podgroup("pg1", "two")))
    assert found.refused == {"uid-a": "coscheduling's PodGroup ns/pg1: spec.minMember 'two' is not a count"}
    assert not found.groups


# -- Volcano's PodGroup


@pytest.mark.parametrize("annotation", VOLCANO_GROUPS)
def test_volcano_group_is_either_annotation(annotation: str) -> None:
    """vc/labels.go:30-36: both keys identify "which PodGroup it belongs to"."""
    pod = grouped("p", namespace="ns", annotations={annotation: "job-1"})
    said = declared(pod, crds(podgroup("job-1", 4), volcano=True))
    assert said == Declared(GroupKey(Scheme.VOLCANO, "ns", "job-1"), 4)


def test_volcano_annotations_naming_two_podgroups_are_refused() -> None:
    pod = grouped("p", namespace="ns", annotations={VOLCANO_GROUPS[0]: "job-1", VOLCANO_GROUPS[1]: "job-2"})
    said = declared(pod, crds(podgroup("job-1", 4), podgroup("job-2", 4), volcano=True))
    assert said is not None and said.problem == (
        "scheduling.k8s.io/group-name 'job-1' and scheduling.volcano.sh/group-name 'job-2' name two PodGroups"
    )


def test_volcano_annotation_means_nothing_without_its_crd() -> None:
    pod = grouped("p", namespace="ns", annotations={VOLCANO_GROUPS[0]: "job-1"})
    assert declared(pod, crds(podgroup("job-1", 4))) is None  # only coscheduling's CRD installed


def test_pod_in_two_schemes_is_refused() -> None:
    pod = grouped("p", namespace="ns", labels={KUEUE_GROUP: "g", COSCHEDULING_GROUP: "pg1"})
    pod["metadata"]["annotations"][KUEUE_TOTAL] = "2"
    found = membership([pod], crds(podgroup("pg1", 2)))
    assert found.refused == {
        "uid-p": "pod ns/p declares two groups (Kueue's pod group ns/g and coscheduling's PodGroup ns/pg1); it may "
        "start with one"
    }
    assert not found.groups and not found.group_of


def test_pods_of_other_namespaces_are_other_groups() -> None:
    pods = [kueue("a", "g", "1"), kueue("b", "g", "1", namespace="other")]
    assert len(membership(pods).groups) == 2


# -- the planner

GIB = "GiB"


def member_of(cluster: Cache, pod: dict[str, Any], nodes: frozenset[str] | None = None) -> Member:
    demand = cluster.protocol.pod_demand(pod)
    return Member(
        pod["metadata"]["uid"], pod_key(pod), demand, pod_request(pod, "cpu", 3), pod_request(pod, "memory"), nodes
    )


def members(cluster: Cache, prefix: str, count: int, **pod: Any) -> list[Member]:
    return [member_of(cluster, make_pod(f"{prefix}-{i}", uid=f"uid-{prefix}-{i}", **pod)) for i in range(count)]


def applied(cluster: Cache, plan: Plan) -> list[str]:
    """The plan's allocations recorded in the cache as reservations: what the cache finds over capacity."""
    for allocation in plan.allocations:
        cluster.hold(Hold(allocation, HoldState.RESERVED, since=0.0))
    return cluster.overcommitted()


def test_group_that_fits_is_planned_whole_without_taking_a_gpu_twice() -> None:
    """Two nodes of 2 GPUs of 16 GiB; four pods of 10 GiB: one per GPU (binpack would put two on GPU 0 if the
    first were not counted: 10 + 10 > 16)."""
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    plan = plan_group("team/train", members(cluster, "w", 4, gpu_mem=10), cluster.nodes, GIB)
    assert isinstance(plan, Plan)
    assert sorted((a.node, a.indexes) for a in plan.allocations) == [
        ("n1", (0,)), ("n1", (1,)), ("n2", (0,)), ("n2", (1,))
    ]  # fmt: skip
    assert applied(cluster, plan) == []


def test_group_that_does_not_fit_says_how_many_would() -> None:
    """n1 has 4 GPUs, n2 one, all of 16 GiB: 5 of 8 whole-GPU pods fit."""
    cluster = make_cluster(make_node("n1", gpus=4), make_node("n2", gpus=1))
    answer = plan_group("team/train-7", members(cluster, "w", 8, gpu_mem=16), cluster.nodes, GIB)
    assert answer == NoPlan("job team/train-7 needs 8 pods of 1 GPU with 16 GiB; 5 fit now", 5)


def test_mixed_shapes_are_counted_per_shape_largest_first() -> None:
    cluster = make_cluster(make_node("n1", gpus=2))
    pods = members(cluster, "w", 2, gpu_mem=4) + members(cluster, "ps", 1, gpu_mem=32, gpus=2)
    answer = plan_group("j", pods, cluster.nodes, GIB)
    assert answer == NoPlan("job j needs 3 pods (1 of 2 GPUs with 16 GiB each, 2 of 1 GPU with 4 GiB); 1 fit now", 1)


def test_cpu_and_memory_are_counted_as_members_are_planned() -> None:
    """n1 allocates 16 cpus: two pods of 10 do not both fit there, whatever its GPUs hold."""
    cluster = make_cluster(make_node("n1", cpu="16"), make_node("n2", cpu="16"))
    plan = plan_group("j", members(cluster, "w", 2, gpu_mem=1, cpu="10"), cluster.nodes, GIB)
    assert isinstance(plan, Plan) and sorted(a.node for a in plan.allocations) == ["n1", "n2"]
    answer = plan_group("j", members(cluster, "w", 3, gpu_mem=1, cpu="10"), cluster.nodes, GIB)
    assert isinstance(answer, NoPlan) and answer.fit == 2


def test_memory_is_counted_as_members_are_planned() -> None:
    """Nodes allocate 64Gi of memory: two pods of 40Gi go to two nodes, a third to none."""
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    plan = plan_group("j", members(cluster, "w", 2, gpu_mem=1, memory="40Gi"), cluster.nodes, GIB)
    assert isinstance(plan, Plan) and sorted(a.node for a in plan.allocations) == ["n1", "n2"]
    answer = plan_group("j", members(cluster, "w", 3, gpu_mem=1, memory="40Gi"), cluster.nodes, GIB)
    assert isinstance(answer, NoPlan) and answer.fit == 2


def test_two_groups_that_cannot_both_fit_get_one_plan() -> None:
    """Four GPUs; jobs a and b each need three. Whichever is planned first fits, and against what its plan leaves
    the other does not, in either order."""
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    a, b = members(cluster, "a", 3, gpu_mem=16), members(cluster, "b", 3, gpu_mem=16)
    for first, second, name in ((a, b, "b"), (b, a, "a")):
        plan = plan_group("first", first, cluster.nodes, GIB)
        assert isinstance(plan, Plan)
        assert plan_group(name, second, plan.left, GIB) == NoPlan(
            f"job {name} needs 3 pods of 1 GPU with 16 GiB; 1 fit now", 1
        )
    assert cluster.overcommitted() == [] and not cluster.reserved  # planning changed nothing in the cache


def test_a_members_own_assumption_is_given_back_before_planning() -> None:
    cluster = make_cluster(make_node("n1", gpus=1))
    (only,) = members(cluster, "w", 1, gpu_mem=16)
    plan = plan_group("j", [only], cluster.nodes, GIB)
    assert isinstance(plan, Plan)
    cluster.hold(Hold(plan.allocations[0], HoldState.ASSUMED, since=0.0))
    again = plan_group("j", [only], cluster.nodes, GIB)
    assert isinstance(again, Plan) and again.allocations == plan.allocations


def test_members_go_only_to_nodes_they_may_use() -> None:
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    pod = make_pod("w", uid="uid-w", gpu_mem=4)
    plan = plan_group("j", [member_of(cluster, pod, frozenset({"n2"}))], cluster.nodes, GIB)
    assert isinstance(plan, Plan) and plan.node_of("uid-w") == "n2"


def test_plan_does_not_depend_on_the_order_members_are_given() -> None:
    cluster = make_cluster(make_node("n1", gpus=4), make_node("n2", gpus=2, mem=8))
    given = (
        members(cluster, "w", 3, gpu_mem=8) + members(cluster, "x", 2, gpu_mem=12) + members(cluster, "y", 1, gpu_mem=4)
    )
    first = plan_group("j", given, cluster.nodes, GIB)
    second = plan_group("j", list(reversed(given)), cluster.nodes, GIB)
    assert isinstance(first, Plan) and isinstance(second, Plan)
    assert sorted(first.allocations, key=str) == sorted(second.allocations, key=str)


def test_hami_core_members_share_gpus_by_compute() -> None:
    """Two HAMi-core GPUs of 100 % compute; pods of 10000 MiB and 50 %: two per GPU, the fifth finds none."""
    cluster = make_hami_cluster(make_hami_node("gpu-1", gpus=2))
    pods = [member_of(cluster, make_hami_pod(f"w{i}", mem=10000, cores=50)) for i in range(5)]
    answer = plan_group("j", pods, cluster.nodes, "MiB")
    assert answer == NoPlan("job j needs 5 pods of 1 GPU with 10000 MiB and 50 % compute; 4 fit now", 4)
    plan = plan_group("j", pods[:4], cluster.nodes, "MiB")
    assert isinstance(plan, Plan)
    assert sorted(a.indexes for a in plan.allocations) == [(0,), (0,), (1,), (1,)]
    assert applied(cluster, plan) == []


def test_mig_members_get_instances_that_do_not_overlap() -> None:
    """One A100-40GB in MIG mode: three 2g.10gb instances (slices 0, 2, 4) and no fourth (slice 6 is 1g)."""
    cluster = make_hami_cluster(make_mig_node("mig-1"))
    pods = [member_of(cluster, make_hami_pod(f"w{i}", mem=10240)) for i in range(4)]
    answer = plan_group("j", pods, cluster.nodes, "MiB")
    assert answer == NoPlan("job j needs 4 pods of 1 GPU with 10240 MiB; 3 fit now", 3)
    plan = plan_group("j", pods[:3], cluster.nodes, "MiB")
    assert isinstance(plan, Plan)
    starts = sorted(use.instances[0].start for a in plan.allocations for use in a.uses)
    assert starts == [0, 2, 4]
    assert applied(cluster, plan) == []


def test_member_without_gpus_takes_cpu_only() -> None:
    cluster = make_cluster(make_node("n1", cpu="4"))
    launcher = member_of(cluster, make_pod("launcher", uid="uid-l", gpu_mem=None, cpu="3"))
    plan = plan_group("j", [launcher, *members(cluster, "w", 1, gpu_mem=4, cpu="1")], cluster.nodes, GIB)
    assert isinstance(plan, Plan) and plan.allocations[0].containers == ()
    over = plan_group("j", [launcher, *members(cluster, "w", 1, gpu_mem=4, cpu="2")], cluster.nodes, GIB)
    assert isinstance(over, NoPlan) and over.fit == 1


def test_random_plans_never_overcommit_and_place_every_member() -> None:
    """Seeded: 40 random clusters (`random_cluster`), a random group each; every plan recorded in the cache
    leaves every GPU within its capacity."""
    rng = random.Random(45)
    planned = 0
    for round_ in range(40):
        cluster = random_cluster(rng)
        group = [
            member_of(
                cluster,
                make_pod(f"g{i}", uid=f"uid-{round_}-{i}", gpu_mem=rng.randint(1, 16), gpus=rng.choice((None, 2))),
            )
            for i in range(rng.randint(1, 10))
        ]
        plan = plan_group("j", group, cluster.nodes, GIB)
        if isinstance(plan, NoPlan):
            assert 0 <= plan.fit < len(group)
            continue
        planned += 1
        assert {a.pod_uid for a in plan.allocations} == {m.uid for m in group}
        assert applied(cluster, plan) == []
    assert planned >= 10  # the draw plans enough groups to mean something


def test_member_the_device_plugin_cannot_run_refuses_the_group() -> None:
    """gpushare's plugin gives a pod one GPU at most (`Profile.refusal`): the group is refused for that reason."""
    cluster = make_cluster(make_node("n1", gpus=4))
    group = members(cluster, "w", 1, gpu_mem=4) + members(cluster, "ps", 1, gpu_mem=8, gpus=2)
    answer = plan_group("j", group, cluster.nodes, GIB, refusal=cluster.protocol.refusal)
    assert isinstance(answer, NoPlan) and answer.fit == 0
    assert answer.reason.startswith("job j: pod default/ps-0 asks 2 GPUs (aliyun.com/gpu-count: 2); gpushare's")


def test_nodes_not_ready_or_locked_take_no_member() -> None:
    """A node that is not Ready, or that HAMi's device plugin holds locked for another pod, is judged as a single
    pod's filter judges it (`judge.judge`)."""
    cluster = make_cluster(make_node("n1", ready=False), make_node("n2"))
    plan = plan_group("j", members(cluster, "w", 2, gpu_mem=16), cluster.nodes, GIB)
    assert isinstance(plan, Plan) and {a.node for a in plan.allocations} == {"n2"}
    locked = make_hami_node("gpu-1", **{"hami.io/mutex.lock": "2026-08-21T10:00:00Z,default,other"})
    hami = make_hami_cluster(
        locked, make_hami_node("gpu-2"), pods=(make_hami_pod("other"),), clock=FakeClock(1_787_306_400.0 + 10)
    )
    assert hami.nodes["gpu-1"].lock is not None
    plan = plan_group("j", [member_of(hami, make_hami_pod("w", mem=1000))], hami.nodes, "MiB")
    assert isinstance(plan, Plan) and plan.allocations[0].node == "gpu-2"


def test_the_fragmentation_policys_choice_plans_on_scratch_nodes_too() -> None:
    """`Placer.choose` as the planner's `choose`: it judges a node it does not know as the cache's afresh, so the
    GPUs it gives on a node a member was planned on count that member."""
    cluster = make_cluster(make_node("n1", gpus=4), make_node("n2", gpus=2))
    placer = placer_for(cluster)
    group = members(cluster, "w", 5, gpu_mem=12) + members(cluster, "x", 1, gpu_mem=4)
    plan = plan_group("j", group, cluster.nodes, GIB, lambda demand, state: placer.choose(demand, state, Ask(demand)))
    assert isinstance(plan, Plan)
    assert applied(cluster, plan) == []
