"""Jobs placed whole: the ledger holds every member's GPUs or none, lets them go together, and a member's filter
and bind follow the job's hold (`core/jobs.py`, `Ledger.reserve_group` and its siblings).

Pods are gpushare's (GiB of GPU memory on 16 GiB GPUs); the jobs are Kueue's plain-pod groups, declared by the
label and annotation Kueue v0.17.0 reads (`groups.py` cites where)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from extender.core import gang, jobs
from extender.core.devices import Demand
from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL, GroupKey, Scheme
from extender.core.holds import Allocation, HoldState
from extender.core.ledger import Ledger
from extender.core.nodes import NodeState
from extender.core.placement.config import Ask, Policy, PolicyConfig, ask_of
from extender.core.placement.filtering import FilterOutcome
from extender.core.placement.fit import Cause
from extender.core.pods import pod_record
from extender.core.quota.limits import read_quota
from tests.builders import (
    PROFILE,
    FakeClock,
    bound_pod,
    make_cluster,
    make_ledger,
    make_node,
    make_pod,
    make_quota,
    placer_for,
    quotas_of,
)

JOB = GroupKey(Scheme.KUEUE, "default", "train")


def member(name: str, total: int, gpu_mem: int = 16, job: str = "train", **kwargs: Any) -> dict[str, Any]:
    """A pod of Kueue's plain-pod group `job` of `total` pods."""
    pod = make_pod(name, gpu_mem=gpu_mem, uid=f"uid-{name}", **kwargs)
    pod["metadata"]["labels"] = {KUEUE_GROUP: job}
    pod["metadata"]["annotations"][KUEUE_TOTAL] = str(total)
    return pod


def whole_gpu(uid: str, node: str, index: int) -> Allocation:
    return Allocation.uniform(uid, f"default/{uid}", node, (index,), 16)


def grouped(cluster: Any) -> dict[str, str]:
    """Pod UID -> node of every GROUPED hold."""
    return {uid: hold.allocation.node for uid, hold in cluster.reserved.items() if hold.state is HoldState.GROUPED}


# ---- the ledger ------------------------------------------------------------------------------------------------


def test_a_job_is_held_whole_or_not_at_all() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = make_ledger(cluster)
    too_many = [whole_gpu("a", "n1", 0), whole_gpu("b", "n1", 1), whole_gpu("c", "n1", 1)]
    assert ledger.reserve_group(JOB, too_many) == "pod default/c: GPU 1 on n1 has 0 free, needs 16"
    assert not cluster.reserved and cluster.nodes["n1"].used == [0, 0] and ledger.group_hold(JOB) is None
    assert ledger.reserve_group(JOB, too_many[:2]) is None
    assert grouped(cluster) == {"a": "n1", "b": "n1"} and cluster.nodes["n1"].used == [16, 16]
    other = Allocation.uniform("other", "default/other", "n1", (0,), 1)
    assert ledger.reserve(other) == "GPU 0 on n1 has 0 free, needs 1", "a job's holds count as reservations"
    assert ledger.assume(other, 0) is False
    assert not cluster.overcommitted()


def test_a_quota_is_charged_with_the_whole_job_at_once() -> None:
    """A quota of 40 GiB has room for two members of 16 GiB, not three: the job of three is refused whole."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    quota = make_quota("team", "default", **{"limits.aliyun.com/gpu-mem": "40"})
    quotas_of(cluster).apply(read_quota(quota, PROFILE.quota_resources))
    ledger = make_ledger(cluster)
    three = [whole_gpu("a", "n1", 0), whole_gpu("b", "n1", 1), whole_gpu("c", "n2", 0)]
    refusal = ledger.reserve_group(JOB, three)
    assert refusal is not None and refusal.startswith("pod default/c: ") and "team" in refusal
    assert not cluster.reserved and quotas_of(cluster).held_in("default") == []
    assert ledger.reserve_group(JOB, three[:2]) is None
    assert [uid for uid, _, _ in quotas_of(cluster).held_in("default")] == ["a", "b"]


def test_a_members_bind_takes_its_hold_on_its_planned_node_only() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    ledger = make_ledger(cluster)
    assert ledger.reserve_group(JOB, [whole_gpu("a", "n1", 0), whole_gpu("b", "n2", 0)]) is None
    assert ledger.take_grouped("a", "n2") is None, "planned on n1"
    taken = ledger.take_grouped("a", "n1")
    assert taken is not None and taken.state is HoldState.RESERVED
    assert ledger.group_hold(JOB) is not None and ledger.group_hold(JOB).waiting == ["b"]  # type: ignore[union-attr]
    assert ledger.take_grouped("b", "n2") is not None
    assert ledger.group_hold(JOB) is None, "every member's bind came: the job's hold has done its work"
    assert cluster.nodes["n1"].used == [16, 0] and cluster.nodes["n2"].used == [16, 0]


def test_a_jobs_hold_expires_whole_after_its_ttl_keeping_the_members_bound() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=3, mem=16))
    ledger = Ledger(cluster, 300.0, clock, quotas_of(cluster), group_ttl=60.0)
    members = [whole_gpu(uid, "n1", index) for index, uid in enumerate("abc")]
    assert ledger.reserve_group(JOB, members) is None
    assert ledger.take_grouped("a", "n1") is not None
    clock.advance(59)
    assert ledger.expire_groups() == [] and ledger.expire() == []
    clock.advance(2)
    assert ledger.expire() == [], "a job's holds are not single reservations: the reservation TTL is not theirs"
    (released,) = ledger.expire_groups()
    assert released.why == "2 of its 3 members did not come to bind within 60 s"
    assert sorted(hold.allocation.pod_uid for hold in released.holds) == ["b", "c"]
    assert cluster.nodes["n1"].used == [16, 0, 0], "the member whose bind came keeps its reservation"
    assert ledger.group_hold(JOB) is None and ledger.group_of("b") is None
    assert "b" not in cluster.abandoned, "nothing was written for a job's hold"


def test_a_job_that_loses_a_waiting_member_is_let_go_whole_at_the_next_sweep() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    pods = [member("a", 2), member("b", 2)]
    for pod in pods:
        cluster.apply_pod(pod)
    ledger = make_ledger(cluster)
    assert ledger.reserve_group(JOB, [whole_gpu("uid-a", "n1", 0), whole_gpu("uid-b", "n1", 1)]) is None
    cluster.apply_pod(pods[1], deleted=True)
    (released,) = ledger.expire_groups()
    assert released.why.startswith("1 of its members' holds are gone")
    assert not cluster.reserved and cluster.nodes["n1"].used == [0, 0]


# ---- a member's filter -----------------------------------------------------------------------------------------


def filter_of(pod: dict[str, Any], cluster: Any, ledger: Ledger, names: list[str]) -> jobs.MemberFilter | None:
    record = pod_record(pod, cluster.protocol)
    assert record.group is not None
    return jobs.filter_member(record, record.group, names, cluster, ledger, placer_for(cluster))


def test_the_first_members_filter_plans_and_holds_the_job_and_the_others_get_their_planned_nodes() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    pods = [member(name, 3) for name in ("w-0", "w-1", "w-2")]
    for pod in pods:
        cluster.apply_pod(pod)
    ledger = make_ledger(cluster)
    first = filter_of(pods[1], cluster, ledger, ["n1", "n2"])
    assert first == jobs.MemberFilter("n1", planned=True)
    assert grouped(cluster) == {"uid-w-0": "n1", "uid-w-1": "n1", "uid-w-2": "n2"}, "first fit, nodes by name"
    assert filter_of(pods[2], cluster, ledger, ["n1", "n2"]) == jobs.MemberFilter("n2")
    assert filter_of(pods[0], cluster, ledger, ["n2"]) == jobs.MemberFilter("n1"), "the verb says n1 was not sent"


def test_a_job_that_does_not_fit_holds_nothing_and_says_how_many_fit() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    ledger = make_ledger(cluster)
    first = [member(f"a-{n}", 3, job="a") for n in range(3)]
    second = [member(f"b-{n}", 3, job="b") for n in range(3)]
    for pod in first + second:
        cluster.apply_pod(pod)
    assert filter_of(first[0], cluster, ledger, ["n1", "n2"]) == jobs.MemberFilter("n1", planned=True)
    refused = filter_of(second[0], cluster, ledger, ["n1", "n2"])
    assert refused == jobs.MemberFilter(reason="job default/b needs 3 pods of 1 GPU with 16 GiB; 1 fit now")
    assert set(grouped(cluster)) == {"uid-a-0", "uid-a-1", "uid-a-2"}, "b holds nothing: a part would starve a"


def test_a_job_waits_whole_until_its_members_exist_and_are_ungated() -> None:
    cluster = make_cluster(make_node("n1", gpus=4, mem=16))
    ledger = make_ledger(cluster)
    pods = [member("w-0", 3), member("w-1", 3)]
    for pod in pods:
        cluster.apply_pod(pod)
    said = filter_of(pods[0], cluster, ledger, ["n1"])
    assert said == jobs.MemberFilter(reason="job default/train needs 3 pods to start; 2 exist, 0 bound", short=True)
    gated = member("w-2", 3)
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    cluster.apply_pod(gated)
    said = filter_of(pods[0], cluster, ledger, ["n1"])
    short = "job default/train needs 3 pods to start; 3 exist (1 gated), 0 bound"
    assert said == jobs.MemberFilter(reason=short, short=True)
    del gated["spec"]["schedulingGates"]
    cluster.apply_pod(gated)
    assert filter_of(pods[0], cluster, ledger, ["n1"]) == jobs.MemberFilter("n1", planned=True)
    assert not cluster.reserved.keys() - {"uid-w-0", "uid-w-1", "uid-w-2"}


def test_members_past_the_minimum_wait_for_it_then_are_placed_as_any_pod() -> None:
    cluster = make_cluster(make_node("n1", gpus=4, mem=16))
    ledger = make_ledger(cluster)
    pods = [member(f"w-{n}", 2) for n in range(3)]  # 3 pods, 2 to start
    for pod in pods:
        cluster.apply_pod(pod)
    assert filter_of(pods[2], cluster, ledger, ["n1"]) == jobs.MemberFilter(
        reason="pod default/w-2 waits for the first 2 pods of job default/train to start"
    )
    assert filter_of(pods[0], cluster, ledger, ["n1"]) == jobs.MemberFilter("n1", planned=True)
    assert filter_of(pods[2], cluster, ledger, ["n1"]) == jobs.MemberFilter(
        reason="pod default/w-2 waits for the first 2 pods of job default/train to start"
    )
    for uid in ("uid-w-0", "uid-w-1"):
        assert ledger.take_grouped(uid, "n1") is not None
    assert filter_of(pods[2], cluster, ledger, ["n1"]) is None, "the minimum is placed: the rest go as any pod"


def test_members_that_disagree_on_the_jobs_size_are_refused_with_why() -> None:
    cluster = make_cluster(make_node("n1", gpus=4, mem=16))
    ledger = make_ledger(cluster)
    for pod in (member("w-0", 2), member("w-1", 3)):
        cluster.apply_pod(pod)
    said = filter_of(member("w-1", 3), cluster, ledger, ["n1"])
    assert said == jobs.MemberFilter(
        reason=f"pods w-0 and w-1 of job default/train disagree on its size ({KUEUE_TOTAL} 2 and 3)"
    )


def test_a_member_asking_no_gpu_is_placed_as_any_pod_and_counts_toward_the_minimum() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = make_ledger(cluster)
    launcher = member("launcher", 3, gpu_mem=None)
    workers = [member("w-0", 3), member("w-1", 3)]
    for pod in [launcher, *workers]:
        cluster.apply_pod(pod)
    assert filter_of(launcher, cluster, ledger, ["n1"]) is None
    assert filter_of(workers[0], cluster, ledger, ["n1"]) == jobs.MemberFilter("n1", planned=True)
    assert set(grouped(cluster)) == {"uid-w-0", "uid-w-1"}


def test_a_members_bind_without_a_hold_is_refused_while_its_job_lacks_members() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = make_ledger(cluster)
    pods = [member("w-0", 2), member("w-1", 2)]
    for pod in pods:
        cluster.apply_pod(pod)
    record = pod_record(pods[0], cluster.protocol)
    assert jobs.unheld(record, cluster, ledger) == (
        "pod default/w-0 is a member of job default/train, which holds nothing now: planned whole at its next filter"
    )
    plain = pod_record(make_pod("plain", 4), cluster.protocol)
    assert jobs.unheld(plain, cluster, ledger) is None


def test_after_a_restart_a_job_is_planned_again_whole_its_bound_members_counted() -> None:
    """The holds live in memory: a restarted extender (a new cache and ledger, from the API's objects) holds
    nothing, sees the members bound, and plans the members still pending together, never one alone."""
    bound = [member(f"w-{n}", 4, node="n1", indexes=(n,), phase="Running") for n in range(2)]
    pending = [member(f"w-{n}", 4) for n in range(2, 4)]
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16), pods=(*bound, *pending))
    ledger = make_ledger(cluster)
    assert not cluster.reserved
    assert jobs.unheld(pod_record(pending[0], cluster.protocol), cluster, ledger) is not None, "never one alone"
    assert filter_of(pending[1], cluster, ledger, ["n1", "n2"]) == jobs.MemberFilter("n2", planned=True)
    assert grouped(cluster) == {"uid-w-2": "n2", "uid-w-3": "n2"}


def test_a_job_of_alike_members_that_does_not_fit_costs_one_pass_over_the_nodes(monkeypatch: Any) -> None:
    """Every parse of a member's filter is bounded work: 64 members alike on 50 full nodes are judged against each
    node once between them (planning only takes room, so a node that refused one refuses the next), not 64 times:
    on 5,000 full nodes that was 736 ms of the event loop a filter, now 11."""
    cluster = make_cluster(*(make_node(f"n{n:02d}", gpus=1, mem=16) for n in range(50)))
    for n in range(50):
        cluster.apply_pod(make_pod(f"busy-{n}", gpu_mem=12, node=f"n{n:02d}", indexes=(0,), phase="Running"))
    pods = [member(f"w-{n:02d}", 64) for n in range(64)]
    for pod in pods:
        cluster.apply_pod(pod)
    judged: list[str] = []
    real = gang.judge

    def counting(demand: Any, state: Any, unit: str, pod: str = "") -> Any:
        judged.append(state.name)
        return real(demand, state, unit, pod)

    monkeypatch.setattr(gang, "judge", counting)
    names = [f"n{n:02d}" for n in range(50)]
    said = filter_of(pods[0], cluster, make_ledger(cluster), names)
    assert said == jobs.MemberFilter(reason="job default/train needs 64 pods of 1 GPU with 16 GiB; 0 fit now")
    assert judged == [], "the policy's values say no node takes the ask: none is tried"
    members = [gang.Member(f"uid-w-{n:02d}", f"default/w-{n:02d}", Demand(memory=16, devices=1)) for n in range(64)]
    plan = gang.plan_group("default/train", members, cluster.nodes, "GiB", names=names)
    assert isinstance(plan, gang.NoPlan) and plan.fit == 0
    assert sorted(judged) == names, "by name alone, each node judged once for the 64 alike members"


def test_a_members_filter_plans_the_job_again_once_a_member_it_was_held_for_is_gone() -> None:
    """w-1 deleted (its owner makes w-1b in its place) before the sweep: the next member's filter lets the hold
    go and plans the job with the pods it has now, rather than pass a node for a job that cannot start."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    pods = [member("w-0", 2), member("w-1", 2)]
    for pod in pods:
        cluster.apply_pod(pod)
    ledger = make_ledger(cluster)
    assert filter_of(pods[0], cluster, ledger, ["n1", "n2"]) == jobs.MemberFilter("n1", planned=True)
    cluster.apply_pod(pods[1], deleted=True)
    replacement = member("w-1b", 2)
    cluster.apply_pod(replacement)
    assert filter_of(pods[0], cluster, ledger, ["n1", "n2"]) == jobs.MemberFilter("n1", planned=True)
    assert grouped(cluster) == {"uid-w-0": "n1", "uid-w-1b": "n1"}


def test_members_waiting_keep_the_cpu_and_memory_planned_for_them_from_other_pods() -> None:
    """What `HeldRoom` refuses and `crowds` says, short of cpu or of memory, and what it lets through: a pod fitting
    beside the members, a pod whose own requests the node counts already, nodes where no member waits, and every
    node once the members bound (their holds taken: reservations, as kube-scheduler's assumed pods)."""
    cluster = make_cluster(make_node("n1", cpu="16", memory="64Gi"), make_node("n2", cpu="16", memory="64Gi"))
    pods = [member(f"m{n}", 2, cpu="10", memory="40Gi") for n in range(2)]
    for pod in pods:
        cluster.apply_pod(pod)
    ledger, placer = make_ledger(cluster), placer_for(cluster)
    assert ledger.waiting_on() == {}
    first = pod_record(pods[0], cluster.protocol)
    said = jobs.declared_group(first, cluster.podgroups)
    assert said is not None
    planned = jobs.filter_member(first, said, ["n1", "n2"], cluster, ledger, placer)
    assert planned == jobs.MemberFilter("n1", planned=True)
    assert ledger.waiting_on() == {"n1": JOB, "n2": JOB}
    assert (cluster.nodes["n2"].cpu_requested, cluster.nodes["n2"].memory_requested) == (10_000, 40 * 2**30)

    def outcome(cpu: str, memory: str, own: str = "") -> FilterOutcome:
        ask = placer_ask(cpu, memory)
        check = jobs.held_room("uid-x", ask, cluster.nodes, cluster, ledger)
        assert check is not None
        result = FilterOutcome(passed=["n1", "n2", "n3"])
        jobs.HeldRoom(check.uid, check.ask, check.states, check.waiting, own)(result)
        return result

    cpu_short = outcome("7", "1Gi")
    assert cpu_short.passed == ["n3"], "n3 is no node of the cache: the filter's own judging refuses it"
    assert cpu_short.unresolvable == {
        "n1": "node n1's cpu left is held for pods of job default/train still to bind",
        "n2": "node n2's cpu left is held for pods of job default/train still to bind",
    }
    assert cpu_short.causes[Cause.JOB_HOLD] == 2
    memory = "node n1's memory left is held for pods of job default/train still to bind"
    assert outcome("1", "25Gi").unresolvable["n1"] == memory
    assert outcome("6", "24Gi").passed == ["n1", "n2", "n3"], "6 cores and 24 GiB fit beside 10 and 40"
    assert outcome("7", "1Gi", own="n2").passed == ["n2", "n3"], "its own requests are counted on n2 already"
    assert jobs.held_room("uid-x", placer_ask("0", "0"), cluster.nodes, cluster, ledger) is None, "asks nothing"
    assert jobs.crowds(7_000, 0, cluster.nodes["n2"], JOB) is not None
    assert jobs.crowds(7_000, 0, cluster.nodes["n2"], JOB, counted=True) is None

    for pod in pods:
        assert ledger.take_grouped(pod["metadata"]["uid"], ledger.held_for(pod["metadata"]["uid"]) or "") is not None
    assert ledger.waiting_on() == {}
    assert jobs.held_room("uid-x", placer_ask("7", "1Gi"), cluster.nodes, cluster, ledger) is None


def placer_ask(cpu: str, memory: str, gpu_mem: int = 1) -> Ask:
    """The ask of a pod of `gpu_mem` GiB of GPU memory on one GPU with these requests."""
    pod = make_pod("x", gpu_mem=gpu_mem, cpu=cpu, memory=memory)
    return ask_of(pod, Demand(memory=gpu_mem, devices=1))


@pytest.mark.parametrize(
    "config", [PolicyConfig(), PolicyConfig(policy=Policy.FILL)], ids=["fragmentation", "fill-binpack"]
)
def test_a_job_is_planned_on_the_nodes_the_placement_policy_prefers_not_by_name(config: PolicyConfig) -> None:
    """n1 is empty, n2 runs a pod of 8 GiB on one of its 16 GiB GPUs: the policy puts a pod of 8 GiB beside it (the
    fullest GPU that fits, leaving n1's whole GPUs whole), and so does the job's plan, where first fit by name had
    put both members on n1 and cut one of its whole GPUs. The gang replay's fill-up measured the cost of name order:
    3 to 7 points of the GPUs allocated."""
    cluster = make_cluster(
        make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16), pods=(bound_pod("x", "n2", (0,), 8),)
    )
    pods = [member(f"w-{n}", 2, gpu_mem=8) for n in range(2)]
    for pod in pods:
        cluster.apply_pod(pod)
    placer = placer_for(cluster, config)
    first, second = placer.values(placer_ask("0", "0", gpu_mem=8), ["n1", "n2"], cluster.nodes).tolist()
    assert second < first, "the policy prefers n2"
    record = pod_record(pods[0], cluster.protocol)
    assert record.group is not None
    ledger = make_ledger(cluster)
    assert jobs.filter_member(record, record.group, ["n1", "n2"], cluster, ledger, placer) == jobs.MemberFilter(
        "n2", planned=True
    )
    held = {
        uid: (hold.allocation.node, tuple(grant.index for grants in hold.allocation.containers for grant in grants))
        for uid, hold in cluster.reserved.items()
    }
    assert held == {"uid-w-0": ("n2", (0,)), "uid-w-1": ("n2", (1,))}, "8 GiB beside x, then on n2's other GPU"


def test_each_member_is_ranked_with_the_members_before_it_planned() -> None:
    """The policy's values are read once per ask over the nodes as they are, and again for each node the plan
    changed, on its scratch copy, once per change: with a rank that prefers the node holding least, three members
    of 4 GiB spread over three nodes that could each take all three, ties by name; by name alone they stack on
    n1."""
    cluster = make_cluster(*(make_node(f"n{n}", gpus=1, mem=16) for n in (1, 2, 3)))
    members = [gang.Member(f"uid-w-{n}", f"default/w-{n}", Demand(memory=4, devices=1)) for n in range(3)]
    asked: list[list[str]] = []

    def least_held(member: gang.Member, names: Sequence[str], states: Mapping[str, NodeState]) -> Any:
        asked.append(list(names))
        return np.array([len(states[name].holds) for name in names], dtype=float)

    spread = gang.plan_group("default/train", members, cluster.nodes, "GiB", rank=least_held)
    assert isinstance(spread, gang.Plan)
    assert [allocation.node for allocation in spread.allocations] == ["n1", "n2", "n3"]
    assert asked == [["n1", "n2", "n3"], ["n1"], ["n2"]], "once in all, then the node the member before changed"
    stacked = gang.plan_group("default/train", members, cluster.nodes, "GiB")
    assert isinstance(stacked, gang.Plan)
    assert [allocation.node for allocation in stacked.allocations] == ["n1", "n1", "n1"]


def test_the_ledgers_rules_for_a_jobs_hold_and_its_members() -> None:
    """What `reserve_group` refuses (a member whose bind runs, one holding GPUs of its own already; an assumption
    is no rival), that holding a job again lets its earlier hold go, that two holds taken in one tick of the clock
    are told apart by their time, and what `take_grouped` refuses (a hold of another kind; a job that lost a member
    before the sweep, let go whole)."""
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    ledger = make_ledger(cluster, clock=clock)
    with ledger.in_flight("a", "n1"):
        assert ledger.reserve_group(JOB, [whole_gpu("a", "n1", 0)]) == "pod default/a: a bind of it is running"
    assert ledger.reserve(whole_gpu("a", "n1", 0)) is None
    assert ledger.reserve_group(JOB, [whole_gpu("a", "n1", 1)]) == "pod default/a holds GPUs already (reserved)"
    assert ledger.take_grouped("a", "n1") is None, "a reservation, not a job's hold"
    assert ledger.assume(whole_gpu("b", "n1", 1), 0)
    assert ledger.reserve_group(JOB, [whole_gpu("b", "n1", 1)]) is None, "its own assumption is no rival"
    first = ledger.group_hold(JOB)
    assert first is not None and first.since == clock.now and ledger.group_of("b") == JOB
    assert ledger.reserve_group(JOB, [whole_gpu("c", "n2", 0), whole_gpu("d", "n2", 1)]) is None
    again = ledger.group_hold(JOB)
    assert grouped(cluster) == {"c": "n2", "d": "n2"}, "the job's earlier hold let go"
    assert again is not None and 0 < again.since - first.since < 0.001, "later, in the same tick"

    cluster.apply_pod(make_pod("d", gpu_mem=16, uid="d"))
    cluster.apply_pod(make_pod("d", gpu_mem=16, uid="d"), deleted=True)
    assert ledger.take_grouped("c", "n2") is None, "d is gone: the job cannot start"
    assert ledger.group_hold(JOB) is None and grouped(cluster) == {}, "let go whole"


def test_the_sweep_judges_every_job_and_lets_go_only_past_the_ttl() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = Ledger(cluster, 300.0, clock, quotas_of(cluster), group_ttl=60.0)
    older = GroupKey(Scheme.KUEUE, "default", "older")
    assert ledger.reserve_group(JOB, [whole_gpu("a", "n1", 0)]) is None
    clock.advance(1)
    assert ledger.reserve_group(older, [whole_gpu("b", "n1", 1)]) is None
    clock.advance(59)
    assert [released.group.key for released in ledger.expire_groups()] == [], "JOB at exactly its TTL: kept"
    clock.advance(0.5)
    assert [released.group.key for released in ledger.expire_groups()] == [JOB]
    clock.advance(1)
    assert [released.group.key for released in ledger.expire_groups()] == [older]


def test_the_sweep_lets_go_a_job_that_lost_a_member_whatever_job_comes_before_it() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=(make_pod("b", gpu_mem=16, uid="b"),))
    ledger = Ledger(cluster, 300.0, clock, quotas_of(cluster), group_ttl=60.0)
    other = GroupKey(Scheme.KUEUE, "default", "other")
    assert ledger.reserve_group(JOB, [whole_gpu("a", "n1", 0)]) is None
    assert ledger.reserve_group(other, [whole_gpu("b", "n1", 1)]) is None
    cluster.apply_pod(make_pod("b", gpu_mem=16, uid="b"), deleted=True)
    assert [released.group.key for released in ledger.expire_groups()] == [other], "JOB is young and whole"
