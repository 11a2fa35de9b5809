"""What the jobs' state machine (`job_machine.py`) found in the product, each as the shortest example: expected to
fail (xfail, strict) until the product is fixed, then to pass (and the mark to go).

- A pod deleted after its node left kept counting against its namespace's quota: the cache forgets the node in
  the pod's batch of changes and tells no `node_changed` for it, and the quota book took `node_forgotten` to mean
  its holds were counted out already. Fixed in `Quotas.node_forgotten`."""

from __future__ import annotations

from extender.core.holds import Allocation
from extender.core.quota.limits import read_quota
from tests.builders import PROFILE, make_cluster, make_ledger, make_node, make_pod, make_quota, quotas_of


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
