"""The quota book: limits per namespace, what each namespace holds on the holds, and the refusals' verdicts.

HAMi's cases cite HAMi v2.10.0 (commit 4707fb02) by file and line, paths as in tests/fixtures/hami/NOTES.md:
`quota.go` = pkg/device/quota.go, `nv/` = pkg/device/nvidia/, `dev/` = pkg/device/, `sch/` = pkg/scheduler/.
The arithmetic is in each case's id: `38+8>40` means used 38, the pod needs 8, the limit is 40.
"""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.holds import Allocation, Grant
from extender.core.placement.fit import Verdict
from extender.core.protocols import QuotaResources
from extender.core.quota.charges import Charge
from extender.core.quota.limits import read_quota
from tests.builders import (
    bound_pod,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_ledger,
    make_node,
    make_quota,
    quotas_of,
)
from tests.core.quota import GPUSHARE, HAMI

A100 = "NVIDIA A100-SXM4-40GB"


def make_hami_cluster_with(*quotas: tuple[str, dict[str, str]]) -> Cache:
    """Two idle A100-40GB GPUs, and the namespace ml-a's quotas."""
    cluster = make_hami_cluster(make_hami_node("gpu-1", gpus=2))
    quotas_of(cluster).replace(read_quota(make_quota(name, "ml-a", **hard), HAMI) for name, hard in quotas)
    return cluster


def book(*quotas: dict[str, Any], resources: QuotaResources = GPUSHARE) -> Cache:
    cluster = make_cluster(make_node("n1", gpus=4, mem=40))
    quotas_of(cluster).replace(read_quota(quota, resources) for quota in quotas)
    return cluster


def hold(cluster: Cache, uid: str, memory: int, namespace: str = "ml-a", index: int = 0) -> None:
    assert make_ledger(cluster).reserve(Allocation.uniform(uid, f"{namespace}/{uid}", "n1", (index,), memory)) is None


def memory(amount: int, model: str = "", cores: int = 0, gpus: int = 1) -> Charge:
    return Charge(((model, (amount, cores, gpus)),))


@pytest.mark.parametrize(
    ("limit", "used", "need", "refused"),
    [
        (40, 32, 8, False),  # quota.go:84: refused only when Used+memreq > limit
        (40, 38, 8, True),
        (40, 0, 41, True),
        (0, 0, 1, True),  # quota.go:30-35, :84: a limit of 0 is set (LimitSet) and blocks
    ],
    ids=["32+8=40-fits", "38+8>40", "0+41>40", "limit-0-blocks"],
)
def test_a_pod_is_refused_when_its_namespace_would_hold_more_than_the_limit(
    limit: int, used: int, need: int, refused: bool
) -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": str(limit)}))
    if used:
        hold(cluster, "held", used)
    refusal = quotas_of(cluster).refusal("ml-a", memory(need))
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.used, refusal.need, refusal.limit) == (used, need, limit)


def test_the_reason_names_the_namespace_what_it_uses_its_limit_and_the_pods_need() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem.A100": "40"}))
    hold(cluster, "held", 38)
    cluster.apply_node(make_node("n1", gpus=4, mem=40) | {"metadata": {"name": "n1", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}})  # fmt: skip
    refusal = quotas_of(cluster).refusal("ml-a", memory(8, "NVIDIA-A100-SXM4-40GB"))
    assert refusal is not None
    assert refusal.reason == (
        "namespace ml-a uses 38 of its 40 GiB of A100 memory (ResourceQuota team); this pod needs 8 GiB"
    )


@pytest.mark.parametrize(
    ("hard", "charge", "reason"),
    [
        (
            {"limits.nvidia.com/gpucores": "100"},
            memory(4000, A100, cores=30),
            "namespace ml-a uses 80 of its 100 % of GPU compute (ResourceQuota team); this pod needs 30 %",
        ),
        (
            {"limits.nvidia.com/gpu.A100": "1"},
            memory(4000, A100, cores=30),
            "namespace ml-a uses 1 of its 1 A100 GPUs (ResourceQuota team); this pod needs 1",
        ),
    ],
    ids=["compute-80+30>100", "gpus-1+1>1"],
)
def test_compute_and_gpu_limits_say_so_in_their_own_units(hard: dict[str, str], charge: Charge, reason: str) -> None:
    cluster = make_hami_cluster_with(("team", hard))
    assert (
        make_ledger(cluster).reserve(Allocation("x", "ml-a/x", "gpu-1", ((Grant(1, 1000, 80, "GPU-gpu-1-1"),),)))
        is None
    )
    refusal = quotas_of(cluster).refusal("ml-a", charge)
    assert refusal is not None and refusal.reason == reason


def test_a_compute_limit_of_0_lets_a_pod_asking_no_compute_through_but_not_once_the_namespace_is_over_it() -> None:
    cluster = make_hami_cluster_with(("team", {"limits.nvidia.com/gpucores": "0"}))
    assert quotas_of(cluster).refusal("ml-a", memory(4000, A100, cores=0)) is None  # quota.go:90: 0+0 > 0 is false
    assert quotas_of(cluster).refusal("ml-a", memory(4000, A100, cores=10)) is not None
    over = make_hami_cluster_with(("team", {"limits.nvidia.com/gpucores": "50"}))
    assert (
        make_ledger(over).reserve(Allocation("x", "ml-a/x", "gpu-1", ((Grant(0, 1000, 50, "GPU-gpu-1-0"),),))) is None
    )
    quotas_of(over).replace([read_quota(make_quota("team", "ml-a", **{"limits.nvidia.com/gpucores": "40"}), HAMI)])
    # The quota lowered under what the namespace holds: 50+0 > 40 refuses even a pod asking no compute (quota.go:90).
    assert quotas_of(over).refusal("ml-a", memory(4000, A100, cores=0)) is not None


def test_a_limit_for_one_model_does_not_refuse_a_pod_given_another_model() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem.A100": "0"}))
    assert quotas_of(cluster).refusal("ml-a", memory(8, "Tesla-T4")) is None
    assert quotas_of(cluster).refusal("ml-a", memory(8, "NVIDIA-A100-SXM4-40GB")) is not None


def test_every_quota_of_a_namespace_counts_on_its_own_so_the_strictest_refuses() -> None:
    """HAMi keeps one limit per namespace and key, the last quota written (quota.go:242-266), and deleting either
    quota unsets it (quota.go:269-286); Kubernetes checks each quota, and so do we."""
    cluster = book(
        make_quota("loose", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}),
        make_quota("strict", "ml-a", **{"limits.aliyun.com/gpu-mem": "10"}),
    )
    refusal = quotas_of(cluster).refusal("ml-a", memory(12))
    assert refusal is not None and refusal.quota == "strict"
    quotas_of(cluster).apply(read_quota(make_quota("loose", "ml-a"), GPUSHARE), deleted=True)
    assert quotas_of(cluster).refusal("ml-a", memory(12)) is not None, "deleting the loose one leaves the strict one"


def test_a_quota_removed_stops_limiting() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "0"}))
    assert quotas_of(cluster).refusal("ml-a", memory(1)) is not None
    assert quotas_of(cluster).apply(read_quota(make_quota("team", "ml-a"), GPUSHARE), deleted=True)  # quota.go:269-286
    assert quotas_of(cluster).refusal("ml-a", memory(1)) is None
    assert not quotas_of(cluster).active


def test_a_quota_changed_to_hold_no_gpu_key_stops_limiting_too() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "0"}))
    assert quotas_of(cluster).apply(read_quota(make_quota("team", "ml-a", **{"limits.cpu": "4"}), GPUSHARE))
    assert quotas_of(cluster).refusal("ml-a", memory(1)) is None


def test_applying_the_same_quota_again_changes_nothing() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "4"}))
    again = read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "4"}), GPUSHARE)
    assert not quotas_of(cluster).apply(again), "a quota's status rewritten by its controller is no change of ours"
    assert quotas_of(cluster).replace([again]) == []


@pytest.mark.parametrize(
    ("freeable", "verdict"),
    [(0, Verdict.UNRESOLVABLE), (5, Verdict.UNRESOLVABLE), (6, Verdict.FAILED)],
    ids=["38+8-0>40", "38+8-5>40", "38+8-6=40"],
)
def test_a_refusal_is_resolvable_only_when_evicting_the_namespaces_own_pods_frees_enough(
    freeable: int, verdict: Verdict
) -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}))
    hold(cluster, "held", 38)
    refusal = quotas_of(cluster).refusal("ml-a", memory(8))
    assert refusal is not None and refusal.verdict(freeable) is verdict


def test_a_pod_needing_more_than_the_limit_is_never_resolvable() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "4"}))
    refusal = quotas_of(cluster).refusal("ml-a", memory(8))
    assert refusal is not None and refusal.verdict(freeable=100) is Verdict.UNRESOLVABLE


def used(cluster: Cache, namespace: str = "ml-a", key: str = "limits.aliyun.com/gpu-mem") -> int:
    for _, limit in quotas_of(cluster).limits(namespace):
        if limit.key == key:
            return quotas_of(cluster).used(namespace, limit)
    raise LookupError(key)


def test_a_reservation_counts_at_once_and_a_release_gives_it_back_at_once() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}))
    ledger = make_ledger(cluster)
    assert ledger.reserve(Allocation.uniform("a", "ml-a/a", "n1", (0,), 16)) is None
    assert used(cluster) == 16
    assert ledger.reserve(Allocation.uniform("b", "ml-a/b", "n1", (1,), 16)) is None
    assert ledger.reserve(Allocation.uniform("c", "ml-a/c", "n1", (2,), 16)) == (
        "namespace ml-a uses 32 of its 40 GiB of GPU memory (ResourceQuota team); this pod needs 16 GiB"
    )
    assert used(cluster) == 32
    ledger.release("a")
    assert used(cluster) == 16
    assert ledger.reserve(Allocation.uniform("c", "ml-a/c", "n1", (2,), 16)) is None


def test_reserving_again_for_the_same_pod_counts_it_once() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "20"}))
    ledger = make_ledger(cluster)
    assert ledger.reserve(Allocation.uniform("a", "ml-a/a", "n1", (0,), 12)) is None
    assert ledger.reserve(Allocation.uniform("a", "ml-a/a", "n1", (1,), 20)) is None  # 12 - 12 own + 20 = 20
    assert used(cluster) == 20


def test_other_namespaces_pods_count_nothing() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "8"}))
    hold(cluster, "other", 30, namespace="ml-b")
    assert used(cluster) == 0
    assert quotas_of(cluster).refusal("ml-a", memory(8)) is None


def test_usage_is_rebuilt_from_the_pods_alone_after_a_restart() -> None:
    quota = make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"})
    pods = (
        bound_pod("a", "n1", (0,), 16, namespace="ml-a"),
        bound_pod("b", "n1", (1,), 16, namespace="ml-a"),
        bound_pod("c", "n1", (2,), 16, namespace="ml-b"),
    )
    restarted = make_cluster(make_node("n1", gpus=4, mem=40), pods=pods)
    quotas_of(restarted).replace([read_quota(quota, GPUSHARE)])  # the quotas' list may come after the pods'
    assert used(restarted) == 32
    fresh = make_cluster(make_node("n1", gpus=4, mem=40))
    quotas_of(fresh).replace([read_quota(quota, GPUSHARE)])
    fresh.replace([make_node("n1", gpus=4, mem=40)], list(pods))  # or before
    assert used(fresh) == 32


def test_a_deleted_pod_stops_counting() -> None:
    pod = bound_pod("a", "n1", (0,), 16, namespace="ml-a")
    cluster = make_cluster(make_node("n1", gpus=4, mem=40), pods=(pod,))
    quotas_of(cluster).replace(
        [read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}), GPUSHARE)]
    )
    cluster.apply_pod(pod, deleted=True)
    assert used(cluster) == 0


def test_a_node_labelled_with_its_model_later_moves_its_pods_usage_to_that_model() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem.T4": "40"}))
    hold(cluster, "a", 16)
    assert used(cluster, key="limits.aliyun.com/gpu-mem.T4") == 0
    labelled = make_node("n1", gpus=4, mem=40)
    labelled["metadata"]["labels"]["nvidia.com/gpu.product"] = "Tesla-T4"
    cluster.apply_node(labelled)
    assert used(cluster, key="limits.aliyun.com/gpu-mem.T4") == 16


def test_nothing_is_counted_while_no_quota_limits_anything() -> None:
    cluster = make_cluster(make_node("n1", gpus=4, mem=40), pods=(bound_pod("a", "n1", (0,), 16, namespace="ml-a"),))
    assert not quotas_of(cluster).active and quotas_of(cluster).held_in("ml-a") == []
    quotas_of(cluster).replace(
        [read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}), GPUSHARE)]
    )
    assert [charge for _, _, charge in quotas_of(cluster).held_in("ml-a")] == [memory(16)]


def test_the_report_shows_each_limit_with_what_its_namespace_uses() -> None:
    cluster = book(
        make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40", "limits.aliyun.com/gpu-count": "1.5"})
    )
    hold(cluster, "a", 16)
    assert quotas_of(cluster).report() == [
        {
            "namespace": "ml-a",
            "name": "team",
            "limits": [
                {"key": "limits.aliyun.com/gpu-mem", "resource": "memory", "model": "", "limit": 40, "used": 16}
            ],
            "unread": ["limits.aliyun.com/gpu-count: '1.5' is not a whole number; HAMi reads only whole numbers too"],
        }
    ]
