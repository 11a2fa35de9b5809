"""What the jobs' state machine (`job_machine.py`) found in the product, each as the shortest example: expected to
fail (xfail, strict) until the product is fixed, then to pass (and the mark to go).

- A pod deleted after its node left kept counting against its namespace's quota: the cache forgets the node in
  the pod's batch of changes and tells no `node_changed` for it, and the quota book took `node_forgotten` to mean
  its holds were counted out already. Fixed in `Quotas.node_forgotten`.
- A member's bind took its hold while its job's hold had lost a member (deleted before the expiry sweep): the job
  started in part. The state machine allows that window for the holds (the sweep closes it); it is the bind that
  must not start a member of a job no longer whole. Fixed in `Ledger.take_grouped`, which lets such a job go
  whole."""

from __future__ import annotations

from typing import Any

from extender.core import jobs
from extender.core.binding import BindRequest, RecentPods
from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL, declared
from extender.core.holds import Allocation
from extender.core.placement.config import PolicyConfig
from extender.core.pods import pod_record
from extender.core.quota.limits import read_quota
from extender.sources.file import FileBinder
from tests.builders import (
    PROFILE,
    bind_error,
    make_cluster,
    make_ledger,
    make_node,
    make_pod,
    make_quota,
    placer_for,
    quotas_of,
)


def test_a_pod_deleted_after_its_node_left_no_longer_counts_against_its_namespaces_quota() -> None:
    """A node is deleted while a pod holds GPUs there (the node stays, unknown, until the pod goes), then the pod is
    deleted: the node leaves the cache in the pod's batch of changes. The book must stop counting the pod's 4 GiB,
    or every later pod of the namespace is refused for memory no pod holds (until the extender restarts)."""
    cluster = make_cluster(make_node("n0", gpus=1, mem=16))
    quota = read_quota(make_quota("gpu-memory", "team", **{"limits.aliyun.com/gpu-mem": "16"}), PROFILE.quota_resources)
    quotas_of(cluster).apply(quota)
    pod = make_pod("p", gpu_mem=4, namespace="team", uid="uid-p")
    cluster.apply_pod(pod)
    assert make_ledger(cluster).reserve(Allocation.uniform("uid-p", "team/p", "n0", (0,), 4)) is None
    cluster.apply_node(make_node("n0"), deleted=True)

    cluster.apply_pod(pod, deleted=True)

    assert "n0" not in cluster.nodes
    assert quotas_of(cluster).held_in("team") == []
    assert quotas_of(cluster).used("team", quota.limits[0]) == 0


def member(name: str, total: int) -> dict[str, Any]:
    """A pod of Kueue's plain-pod group `train` of `total` pods, asking a whole 16 GiB GPU."""
    pod = make_pod(name, gpu_mem=16, uid=f"uid-{name}")
    pod["metadata"]["labels"] = {KUEUE_GROUP: "train"}
    pod["metadata"]["annotations"][KUEUE_TOTAL] = str(total)
    return pod


async def test_a_members_bind_is_refused_once_a_member_its_job_was_held_for_is_gone() -> None:
    """A job of two is planned and held on n1; member b is deleted (evicted, or its owner replacing it) before the
    sweep lets the job's hold go. Member a, passed n1 by its filter before that, comes to bind: it takes its hold and
    runs alone, a GPU held for a job that cannot start until b's replacement is planned, alone, if it ever fits
    (a's own filter, asked now, already says the job waits: "needs 2 pods to start; 1 exist")."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    a, b = member("a", 2), member("b", 2)
    for pod in (a, b):
        cluster.apply_pod(pod)
    ledger = make_ledger(cluster)
    said = declared(a)
    assert said is not None
    passed = jobs.filter_member(pod_record(a, PROFILE), said, ["n1"], cluster, ledger, placer_for(cluster))
    assert passed is not None and passed.node == "n1" and passed.planned
    cluster.apply_pod(b, deleted=True)

    request = BindRequest("a", "default", "uid-a", "n1")
    error = await bind_error(request, cluster, ledger, PolicyConfig(), FileBinder(cluster, [a]), RecentPods())

    assert error == "pod default/a: job default/train lost a member it was held for; it is planned again whole"
    assert not cluster.pods["uid-a"].node_name
    assert not cluster.reserved, "the job's hold let go whole"
