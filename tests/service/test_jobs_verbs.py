"""Jobs placed whole, through the verbs over HTTPS as kube-scheduler calls them (`core/jobs.py`): two jobs that
do not both fit, their members' filters and binds interleaved: one is placed whole, the other waits whole and
holds nothing; a hold whose members do not come is let go, counted and logged; a member's bind goes only where
its job's hold is. Binds are the file source's (it applies each binding to the cache, as the watch would)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from extender.core import jobplan
from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL
from extender.core.holds import HoldState
from extender.core.ledger import Ledger
from extender.service.verbs import _expire
from extender.sources.file import FileBinder
from tests.builders import FakeClock, bind_body, filter_body, make_cluster, make_node, make_pod, quotas_of
from tests.conftest import ClientFor, make_service

NODES = ["n1", "n2"]


def member(job: str, number: int, total: int) -> dict[str, Any]:
    """Pod `number` of Kueue plain-pod group `job` of `total` pods, each asking one whole 16 GiB GPU."""
    pod = make_pod(f"{job}-{number}", gpu_mem=16, uid=f"uid-{job}-{number}")
    pod["metadata"]["labels"] = {KUEUE_GROUP: job}
    pod["metadata"]["annotations"][KUEUE_TOTAL] = str(total)
    return pod


async def test_two_jobs_that_do_not_both_fit_arriving_interleaved_one_runs_whole_the_other_waits_whole(
    client_for: ClientFor,
) -> None:
    """Four GPUs, two jobs of three: without groups the interleaved pods would split them 2 and 2, and neither
    job would start."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    first = [member("a", n, 3) for n in range(3)]
    second = [member("b", n, 3) for n in range(3)]
    pods = [pod for pair in zip(first, second, strict=True) for pod in pair]  # a-0, b-0, a-1, b-1, ...
    for pod in pods:
        cluster.apply_pod(pod)
    asked: list[str] = []
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, pods), requeue=asked.append))
    waiting = "job default/b needs 3 pods of 1 GPU with 16 GiB; 1 fit now"
    for pod in pods:
        reply = await (await client.post("/filter", data=filter_body(pod, NODES))).json()
        if pod in first:
            assert reply["NodeNames"] and len(reply["NodeNames"]) == 1, reply
            bound = await (await client.post("/bind", data=bind_body(pod, reply["NodeNames"][0]))).json()
            assert bound["Error"] == ""
        else:
            assert reply["NodeNames"] == [] and reply["FailedNodes"] == {}
            assert reply["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, waiting), "no preemption for one"
    placed = {record.name: record.node_name for record in cluster.pods.values() if record.node_name}
    assert placed == {"a-0": "n1", "a-1": "n1", "a-2": "n2"}
    assert not cluster.reserved.keys() & {f"uid-b-{n}" for n in range(3)}, "the waiting job holds nothing"
    assert asked == ["job default/a is held whole: its members may bind"]
    assert not cluster.overcommitted()


async def test_a_members_bind_elsewhere_than_its_planned_node_is_refused(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    pods = [member("a", n, 2) for n in range(2)]
    for pod in pods:
        cluster.apply_pod(pod)
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, pods)))
    reply = await (await client.post("/filter", data=filter_body(pods[0], NODES))).json()
    assert reply["NodeNames"] == ["n1"]
    bound = await (await client.post("/bind", data=bind_body(pods[1], "n2"))).json()
    assert bound["Error"] == "pod default/a-1 is held on n1 for job default/a, not on n2"
    assert cluster.hold_of("uid-a-1").state is HoldState.GROUPED  # type: ignore[union-attr]


async def test_a_member_sent_without_its_planned_node_waits_for_it(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    pods = [member("a", n, 2) for n in range(2)]
    for pod in pods:
        cluster.apply_pod(pod)
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, pods)))
    assert (await (await client.post("/filter", data=filter_body(pods[0], NODES))).json())["NodeNames"] == ["n1"]
    reply = await (await client.post("/filter", data=filter_body(pods[1], ["n2"]))).json()
    reason = "pod default/a-1 is held on node n1 for its job, not among the nodes sent"
    assert reply["NodeNames"] == [] and reply["FailedAndUnresolvableNodes"] == {"n2": reason}


async def test_a_hold_whose_members_do_not_come_is_let_go_whole_counted_and_logged(
    client_for: ClientFor, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    pods = [member("a", n, 3) for n in range(3)]
    for pod in pods:
        cluster.apply_pod(pod)
    ledger = Ledger(cluster, 300.0, clock, quotas_of(cluster), group_ttl=30.0)
    service = make_service(cluster, binder=FileBinder(cluster, pods), ledger=ledger)
    client = await client_for(service)
    assert (await (await client.post("/filter", data=filter_body(pods[0], NODES))).json())["NodeNames"] == ["n1"]
    assert (await (await client.post("/bind", data=bind_body(pods[0], "n1"))).json())["Error"] == ""
    clock.advance(31)
    with caplog.at_level(logging.WARNING, "extender.service.verbs"):
        _expire(service)
    assert "hold of job default/a on n1, n2 let go: 2 of its 3 members did not come to bind within 30 s" in caplog.text
    assert [record.allocation.pod_uid for record in cluster.reserved.values()] == [], "a-0 is bound: observed"
    assert cluster.nodes["n1"].used == [16, 0] and cluster.nodes["n2"].used == [0, 0]
    metrics = await (await client.get("/metrics")).text()
    assert "extender_group_hold_expiries_total 1.0" in metrics
    # a-1's bind now finds no hold while its job lacks members: refused, and its next filter plans the rest whole
    bound = await (await client.post("/bind", data=bind_body(pods[1], "n1"))).json()
    assert bound["Error"].endswith("which holds nothing now: planned whole at its next filter")
    reply = await (await client.post("/filter", data=filter_body(pods[2], NODES))).json()
    assert reply["NodeNames"] == ["n2"], "a-1 takes n1's last GPU, a-2 n2 (first fit, ties by name)"
    grouped = {uid: hold.allocation.node for uid, hold in cluster.reserved.items() if hold.state is HoldState.GROUPED}
    assert grouped == {"uid-a-1": "n1", "uid-a-2": "n2"}


async def test_a_job_refused_for_want_of_pods_is_retried_when_the_watch_shows_its_missing_pod(
    client_for: ClientFor,
) -> None:
    """The pod completing a job plans it at its own filter; but if that filter came before the watch showed a
    member created just before it, the job is refused short of pods, and that member's arrival is the only news
    left: kube-scheduler is asked to retry then."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    pods = [member("a", n, 2) for n in range(2)]
    cluster.apply_pod(pods[1])
    asked: list[str] = []
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, pods), requeue=asked.append))
    reply = await (await client.post("/filter", data=filter_body(pods[1], ["n1"]))).json()
    assert reply["FailedAndUnresolvableNodes"] == {"n1": "job default/a needs 2 pods to start; 1 exist, 0 bound"}
    assert asked == []
    cluster.apply_pod(pods[0])
    assert asked == ["pod default/a-0 of job default/a arrived; its members refused for want of it may start"]
    cluster.apply_pod(make_pod("plain", 4))
    assert len(asked) == 1, "once per refusal, and only for a job's pods"


async def test_a_jobs_members_still_to_bind_keep_the_cpu_planned_for_them(client_for: ClientFor) -> None:
    """The gang replay's churn found this: a job of 16 with 15 members bound waited a minute for its last, whose
    planned node another pod had filled meanwhile. kube-scheduler counts only pods bound or assumed, so it sends
    a held node to any pod; the hold keeps the GPUs, and now the cpu and memory planned there too. Each node has
    16 cores; job a's two pods ask 12 each, so each goes to a node of its own; pod c asks 8 cores and a small share
    of a GPU, which its GPUs alone would let it have on either node."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    pods = [member("a", n, 2) for n in range(2)]
    for pod in pods:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "12"}
    other = make_pod("c", gpu_mem=2, cpu="8", uid="uid-c")
    for pod in [*pods, other]:
        cluster.apply_pod(pod)
    client = await client_for(make_service(cluster, binder=FileBinder(cluster, [*pods, other])))
    assert (await (await client.post("/filter", data=filter_body(pods[0], NODES))).json())["NodeNames"] == ["n1"]
    assert (await (await client.post("/bind", data=bind_body(pods[0], "n1"))).json())["Error"] == ""

    # n1 has a-0's 12 cores bound: kube-scheduler's own filter refuses c there, and sends only n2
    reply = await (await client.post("/filter", data=filter_body(other, ["n2"]))).json()
    held = "node n2's cpu left is held for pods of job default/a still to bind"
    assert reply["NodeNames"] == [] and reply["FailedAndUnresolvableNodes"] == {"n2": held}, reply
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_filter_rejections_total{cause="job_hold"} 1.0' in metrics
    # kube-scheduler passed c to n2 before the job's plan (its filter did not see the hold): its bind is refused
    bound = await (await client.post("/bind", data=bind_body(other, "n2"))).json()
    assert bound["Error"] == f"pod default/c: {held}"

    assert (await (await client.post("/filter", data=filter_body(pods[1], NODES))).json())["NodeNames"] == ["n2"]
    assert (await (await client.post("/bind", data=bind_body(pods[1], "n2"))).json())["Error"] == ""
    assert {record.name: record.node_name for record in cluster.pods.values()} == {"a-0": "n1", "a-1": "n2", "c": ""}


async def first_member_bound(client_for: ClientFor) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Job a of two pods on two nodes of one GPU each, a-0 filtered and bound through a service: a-0 as the API
    then shows it (with what its bind wrote), and the job's pods as created."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    pods = [member("a", n, 2) for n in range(2)]
    for pod in pods:
        cluster.apply_pod(pod)
    binder = FileBinder(cluster, pods)
    client = await client_for(make_service(cluster, binder=binder))
    assert (await (await client.post("/filter", data=filter_body(pods[0], NODES))).json())["NodeNames"] == ["n1"]
    assert (await (await client.post("/bind", data=bind_body(pods[0], "n1"))).json())["Error"] == ""
    return binder._pods["uid-a-0"], pods


async def test_a_job_half_bound_when_the_extender_restarts_is_held_again_before_any_other_pod_is_filtered(
    client_for: ClientFor,
) -> None:
    """a-0's bind writes the job's hold on its pod beside its allocation; an extender started afresh from the
    API's objects holds a-1's GPU again before it answers anything, so a pod filtered first cannot take it, and
    a-1 is passed its planned node."""
    shown, pods = await first_member_bound(client_for)
    assert jobplan.decode(shown["metadata"]["annotations"][jobplan.ANNOTATION]).waiting[0].node == "n2"

    other = make_pod("c", gpu_mem=16, uid="uid-c")
    again = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    for pod in [shown, pods[1], other]:
        again.apply_pod(pod)
    asked: list[str] = []
    client = await client_for(
        make_service(again, binder=FileBinder(again, [shown, pods[1], other]), requeue=asked.append)
    )
    reply = await (await client.post("/filter", data=filter_body(other, NODES))).json()
    full = "needs 16 GiB on one GPU; all 1 GPUs here are full; no pod on its GPUs has a lower priority, so preemption"
    assert reply["NodeNames"] == [] and reply["FailedAndUnresolvableNodes"] == {
        "n1": f"{full} cannot help",
        "n2": f"{full} cannot help",
    }, "n2's GPU is a-1's again"
    assert asked == ["job default/a is held whole: its members may bind"]
    assert (await (await client.post("/filter", data=filter_body(pods[1], NODES))).json())["NodeNames"] == ["n2"]
    assert (await (await client.post("/bind", data=bind_body(pods[1], "n2"))).json())["Error"] == ""


async def test_a_standby_holds_no_written_hold_again_until_it_leads(client_for: ClientFor) -> None:
    """A standby's watch shows the written hold too; were its sweep to hold the job, the leader's binds of the
    members would look to it like members lost, let go and counted as expired. It holds it once it is ready (the
    leader), at its sweep as at its first filter."""
    shown, pods = await first_member_bound(client_for)
    again = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    for pod in [shown, pods[1]]:
        again.apply_pod(pod)
    leading = False
    standby = make_service(again, ready=lambda: leading)
    _expire(standby)
    assert not again.reserved, "a standby holds nothing"
    leading = True
    _expire(standby)
    assert [hold.state for hold in again.reserved.values()] == [HoldState.GROUPED]
