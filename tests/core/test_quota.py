"""Quotas on what pods are given: ResourceQuotas' GPU keys read with HAMi's rules, counted on the holds.

HAMi's cases cite HAMi v2.10.0 (commit 4707fb02) by file and line, paths as in tests/fixtures/hami/NOTES.md:
`quota.go` = pkg/device/quota.go, `nv/` = pkg/device/nvidia/, `dev/` = pkg/device/, `sch/` = pkg/scheduler/.
The arithmetic is in each case's id: `38+8>40` means used 38, the pod needs 8, the limit is 40.
"""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.devices import Device
from extender.core.fit import Verdict
from extender.core.holds import Allocation, Grant
from extender.core.policy import PolicyConfig
from extender.core.protocols import QuotaResources
from extender.core.quota import (
    MAX_LIMITS,
    Charge,
    Limit,
    Quota,
    Resource,
    charge_of,
    counts_model,
    read_quota,
)
from extender.core.quota_fit import charge_on
from tests.builders import (
    PROFILE,
    bound_pod,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_ledger,
    make_node,
    make_quota,
)

HAMI = QuotaResources(memory="nvidia.com/gpumem", gpus="nvidia.com/gpu", cores="nvidia.com/gpucores")
HAMI_GIB = QuotaResources(
    memory="nvidia.com/gpumem", gpus="nvidia.com/gpu", cores="nvidia.com/gpucores", memory_factor=1024
)
GPUSHARE = PROFILE.quota_resources


def limits_of(resources: QuotaResources, **hard: str) -> tuple[Limit, ...]:
    return read_quota(make_quota("q", "ml-a", **hard), resources).limits


# ---- reading a ResourceQuota ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "hard", "read"),
    [
        # quota.go:290-298 managedQuotaName: "limits." + a device's memory or core resource name.
        (HAMI, {"limits.nvidia.com/gpumem": "40960"}, [("limits.nvidia.com/gpumem", Resource.MEMORY, 40960, "")]),
        (HAMI, {"limits.nvidia.com/gpucores": "200"}, [("limits.nvidia.com/gpucores", Resource.COMPUTE, 200, "")]),
        # quota.go:81-83: the limit is in units of memoryFactor MiB (FitQuota multiplies it).
        (HAMI_GIB, {"limits.nvidia.com/gpumem": "40"}, [("limits.nvidia.com/gpumem", Resource.MEMORY, 40960, "")]),
        # quota.go:291: requests.* and bare names are not HAMi's keys; Kubernetes counts requests.* itself.
        (HAMI, {"requests.nvidia.com/gpumem": "4000", "nvidia.com/gpumem": "4000", "limits.cpu": "4"}, []),
        # quota.go:244 AsInt64: a whole number within int64, whatever its suffix or exponent.
        (HAMI, {"limits.nvidia.com/gpumem": "2000m"}, [("limits.nvidia.com/gpumem", Resource.MEMORY, 2, "")]),
        (HAMI, {"limits.nvidia.com/gpumem": "1e3"}, [("limits.nvidia.com/gpumem", Resource.MEMORY, 1000, "")]),
        (HAMI, {"limits.nvidia.com/gpumem": "40Gi"}, [("limits.nvidia.com/gpumem", Resource.MEMORY, 40 * 2**30, "")]),
        # Ours: GPUs (HAMi reads no limits.nvidia.com/gpu), and one GPU model after the resource.
        (HAMI, {"limits.nvidia.com/gpu": "4"}, [("limits.nvidia.com/gpu", Resource.GPUS, 4, "")]),
        (
            HAMI,
            {"limits.nvidia.com/gpumem.A100": "40960", "limits.nvidia.com/gpu.Tesla-T4": "2"},
            [
                ("limits.nvidia.com/gpu.Tesla-T4", Resource.GPUS, 2, "Tesla-T4"),
                ("limits.nvidia.com/gpumem.A100", Resource.MEMORY, 40960, "A100"),
            ],
        ),
        (
            GPUSHARE,
            {"limits.aliyun.com/gpu-mem": "40", "limits.aliyun.com/gpu-count.A100": "2"},
            [
                ("limits.aliyun.com/gpu-count.A100", Resource.GPUS, 2, "A100"),
                ("limits.aliyun.com/gpu-mem", Resource.MEMORY, 40, ""),
            ],
        ),
        (GPUSHARE, {"limits.nvidia.com/gpumem": "4000", "requests.aliyun.com/gpu-mem": "40"}, []),
    ],
    ids=[
        "hami-memory",
        "hami-compute",
        "memory-factor-40x1024",
        "not-limits-keys",
        "2000m-is-2",
        "1e3-is-1000",
        "40Gi-is-a-number-of-MiB",
        "hami-gpus-ours",
        "per-model",
        "gpushare",
        "gpushare-ignores-hami-and-requests",
    ],
)
def test_the_gpu_keys_of_a_quota_are_read(
    resources: QuotaResources, hard: dict[str, str], read: list[tuple[str, Resource, int, str]]
) -> None:
    found = limits_of(resources, **hard)
    assert [(limit.key, limit.resource, limit.amount, limit.model) for limit in found] == read


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("1.5", "not a whole number"),  # quota.go:244-245: AsInt64 fails on a fraction: the key is skipped
        ("100m", "not a whole number"),
        ("1e30", "too large"),  # beyond int64: AsInt64 fails
        ("-1", "negative"),  # the API refuses it; a cluster file may not
        ("lots", "not a quantity"),
    ],
    ids=["fraction", "millis", "beyond-int64", "negative", "garbage"],
)
def test_a_quantity_that_is_no_whole_number_leaves_its_key_unread_and_says_why(value: str, why: str) -> None:
    quota = read_quota(make_quota("q", "ml-a", **{"limits.nvidia.com/gpumem": value}), HAMI)
    assert quota.limits == () and not quota.broken
    (problem,) = quota.unread
    assert problem.startswith("limits.nvidia.com/gpumem: ") and why in problem


@pytest.mark.parametrize(
    "key",
    ["limits.nvidia.com/gpumem.", "limits.nvidia.com/gpumem.--", "limits.nvidia.com/gpumem." + "A" * 200],
    ids=["empty-model", "no-words", "model-too-long"],
)
def test_a_key_without_a_readable_model_is_unread(key: str) -> None:
    quota = read_quota(make_quota("q", "ml-a", **{key: "1"}), HAMI)
    assert quota.limits == () and "no GPU model" in quota.unread[0]


def test_a_quota_with_more_gpu_keys_than_the_extender_reads_refuses_every_gpu_pod_of_its_namespace() -> None:
    hard = {f"limits.nvidia.com/gpumem.M{number}": "1" for number in range(MAX_LIMITS + 1)}
    quota = read_quota(make_quota("wide", "ml-a", **hard), HAMI)
    assert quota.limits == () and quota.broken == f"has {MAX_LIMITS + 1} GPU keys, more than the 32 the extender reads"
    cluster = make_cluster(make_node("n1"))
    cluster.quotas.replace([quota])
    refusal = cluster.quotas.refusal("ml-a", Charge((("", (1, 0, 1)),)))
    assert refusal is not None and refusal.reason.startswith("namespace ml-a: ResourceQuota wide has 33 GPU keys")
    assert refusal.verdict(freeable=100) is Verdict.UNRESOLVABLE
    assert cluster.quotas.refusal("ml-b", Charge((("", (1, 0, 1)),))) is None, "other namespaces are not limited"


def test_a_malformed_object_reads_as_a_quota_without_gpu_keys() -> None:
    for obj in ({}, {"spec": "x"}, {"spec": {"hard": ["limits.nvidia.com/gpumem"]}}, {"metadata": 3}):
        assert read_quota(obj, HAMI).limits == ()


# ---- GPU models --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "gpu", "counted"),
    [
        ("A100", "NVIDIA A100-SXM4-40GB", True),
        ("a100", "NVIDIA A100-SXM4-40GB", True),
        ("A100-40GB", "NVIDIA A100-SXM4-40GB", True),
        ("40GB-A100", "NVIDIA A100-SXM4-40GB", False),
        ("A10", "NVIDIA A100-SXM4-40GB", False),  # HAMi's use-gputype substring would say yes (dev/devices.go:719)
        ("A10", "NVIDIA A10", True),
        ("L40", "NVIDIA L40S", False),
        ("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", True),  # GFD's label, HAMi's registered type
        ("Tesla-T4", "Tesla-T4", True),
        ("T4", "NVIDIA-Tesla T4", True),
        ("H100", "", False),  # a GPU of unknown model counts only under limits for every model
    ],
    ids=[
        "word",
        "any-case",
        "words-in-order",
        "words-out-of-order",
        "A10-is-no-A100",
        "A10",
        "L40-is-no-L40S",
        "label-against-registration",
        "gpu-feature-discovery-label",
        "hami-type",
        "unknown-model",
    ],
)
def test_a_model_in_a_key_counts_gpus_whose_model_has_its_words_in_order(model: str, gpu: str, counted: bool) -> None:
    assert counts_model(Limit("k", Resource.MEMORY, 1, model), gpu) is counted


# ---- what a pod is given, as a quota counts it -------------------------------------------------------------


def hami_charge(pod: dict[str, Any], **node: Any) -> Charge:
    """What HAMi's protocol gives the pod on an idle node (one A100-40GB GPU by default)."""
    cluster = make_hami_cluster(make_hami_node("gpu-1", **{"gpus": 1, **node}))
    demand = cluster.protocol.pod_demand(pod)
    charge = charge_on(demand, cluster.nodes["gpu-1"], PolicyConfig(), None, None)
    assert charge is not None
    return charge


A100 = "NVIDIA A100-SXM4-40GB"


@pytest.mark.parametrize(
    ("pod", "node", "given"),
    [
        # nvidia.com/gpu alone: the whole card (nv/device.go:572-578 mempnum 100; Fit :780-783 Totalmem*100/100),
        # counted in full (quota.go:97-117 sums Usedmem).
        (make_hami_pod(), {}, (40960, 0, 1)),
        # gpumem-percentage 50 of a 40960 MiB GPU (nv/device.go:780-783, int32 division).
        (
            {**make_hami_pod(), "spec": {"containers": [{"name": "m", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}}}]}},
            {},
            (20480, 0, 1),
        ),
        (make_hami_pod(mem=4000, cores=30), {}, (4000, 30, 1)),
        # two GPUs of 4000 MiB: fitQuota sums over the pod's devices (nv/device.go:683-688).
        (make_hami_pod(gpus=2, mem=4000), {"gpus": 2}, (8000, 0, 2)),
        # an init container of 8000 and an app container of 4000 on the same GPU count at their peak
        # (fitQuota collapses with CollapseInitContainerUsage, nv/device.go:683; dev/initContainer.go:36-114).
        (
            make_hami_pod(mem=4000, init=({"name": "i", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}},)),
            {},
            (8000, 0, 1),
        ),
    ],
    ids=["whole-card-40960", "percentage-50-of-40960", "gpumem-4000-cores-30", "2x4000", "init-8000-app-4000-peak"],
)  # fmt: skip
def test_what_a_hami_pod_is_given_is_what_its_quota_counts(
    pod: dict[str, Any], node: dict[str, Any], given: tuple[int, int, int]
) -> None:
    assert hami_charge(pod, **node) == Charge(((A100, given),))


def test_a_gpushare_pod_over_two_gpus_is_counted_at_what_each_gpu_holds() -> None:
    allocation = Allocation.uniform("u", "ml-a/p", "n1", (0, 1), 3)  # 5 GiB over 2 GPUs: 3 + 3
    devices = (Device(0, 16, model="Tesla-T4"), Device(1, 16, model="Tesla-T4"))
    assert charge_of(allocation, devices) == Charge((("Tesla-T4", (6, 0, 2)),))


def test_gpus_named_by_uuid_are_counted_under_their_model() -> None:
    allocation = Allocation("u", "ml-a/p", "n1", ((Grant(-1, 4000, 10, "GPU-b"),),))
    devices = (Device(0, 40960, model="A"), Device(1, 40960, model="B", uuid="GPU-b"))
    assert charge_of(allocation, devices) == Charge((("B", (4000, 10, 1)),))


# ---- the verdict ------------------------------------------------------------------------------------------


def make_hami_cluster_with(*quotas: tuple[str, dict[str, str]]) -> Cache:
    """Two idle A100-40GB GPUs, and the namespace ml-a's quotas."""
    cluster = make_hami_cluster(make_hami_node("gpu-1", gpus=2))
    cluster.quotas.replace(read_quota(make_quota(name, "ml-a", **hard), HAMI) for name, hard in quotas)
    return cluster


def book(*quotas: dict[str, Any], resources: QuotaResources = GPUSHARE) -> Cache:
    cluster = make_cluster(make_node("n1", gpus=4, mem=40))
    cluster.quotas.replace(read_quota(quota, resources) for quota in quotas)
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
    refusal = cluster.quotas.refusal("ml-a", memory(need))
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.used, refusal.need, refusal.limit) == (used, need, limit)


def test_the_reason_names_the_namespace_what_it_uses_its_limit_and_the_pods_need() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem.A100": "40"}))
    hold(cluster, "held", 38)
    cluster.apply_node(make_node("n1", gpus=4, mem=40) | {"metadata": {"name": "n1", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}})  # fmt: skip
    refusal = cluster.quotas.refusal("ml-a", memory(8, "NVIDIA-A100-SXM4-40GB"))
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
    refusal = cluster.quotas.refusal("ml-a", charge)
    assert refusal is not None and refusal.reason == reason


def test_a_compute_limit_of_0_lets_a_pod_asking_no_compute_through_but_not_once_the_namespace_is_over_it() -> None:
    cluster = make_hami_cluster_with(("team", {"limits.nvidia.com/gpucores": "0"}))
    assert cluster.quotas.refusal("ml-a", memory(4000, A100, cores=0)) is None  # quota.go:90: 0+0 > 0 is false
    assert cluster.quotas.refusal("ml-a", memory(4000, A100, cores=10)) is not None
    over = make_hami_cluster_with(("team", {"limits.nvidia.com/gpucores": "50"}))
    assert (
        make_ledger(over).reserve(Allocation("x", "ml-a/x", "gpu-1", ((Grant(0, 1000, 50, "GPU-gpu-1-0"),),))) is None
    )
    over.quotas.replace([read_quota(make_quota("team", "ml-a", **{"limits.nvidia.com/gpucores": "40"}), HAMI)])
    # The quota lowered under what the namespace holds: 50+0 > 40 refuses even a pod asking no compute (quota.go:90).
    assert over.quotas.refusal("ml-a", memory(4000, A100, cores=0)) is not None


def test_a_limit_for_one_model_does_not_refuse_a_pod_given_another_model() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem.A100": "0"}))
    assert cluster.quotas.refusal("ml-a", memory(8, "Tesla-T4")) is None
    assert cluster.quotas.refusal("ml-a", memory(8, "NVIDIA-A100-SXM4-40GB")) is not None


def test_every_quota_of_a_namespace_counts_on_its_own_so_the_strictest_refuses() -> None:
    """HAMi keeps one limit per namespace and key, the last quota written (quota.go:242-266), and deleting either
    quota unsets it (quota.go:269-286); Kubernetes checks each quota, and so do we."""
    cluster = book(
        make_quota("loose", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}),
        make_quota("strict", "ml-a", **{"limits.aliyun.com/gpu-mem": "10"}),
    )
    refusal = cluster.quotas.refusal("ml-a", memory(12))
    assert refusal is not None and refusal.quota == "strict"
    cluster.quotas.apply(read_quota(make_quota("loose", "ml-a"), GPUSHARE), deleted=True)
    assert cluster.quotas.refusal("ml-a", memory(12)) is not None, "deleting the loose one leaves the strict one"


def test_a_quota_removed_stops_limiting() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "0"}))
    assert cluster.quotas.refusal("ml-a", memory(1)) is not None
    assert cluster.quotas.apply(read_quota(make_quota("team", "ml-a"), GPUSHARE), deleted=True)  # quota.go:269-286
    assert cluster.quotas.refusal("ml-a", memory(1)) is None
    assert not cluster.quotas.active


def test_a_quota_changed_to_hold_no_gpu_key_stops_limiting_too() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "0"}))
    assert cluster.quotas.apply(read_quota(make_quota("team", "ml-a", **{"limits.cpu": "4"}), GPUSHARE))
    assert cluster.quotas.refusal("ml-a", memory(1)) is None


def test_applying_the_same_quota_again_changes_nothing() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "4"}))
    again = read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "4"}), GPUSHARE)
    assert not cluster.quotas.apply(again), "a quota's status rewritten by its controller is no change of ours"
    assert cluster.quotas.replace([again]) == []


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
    refusal = cluster.quotas.refusal("ml-a", memory(8))
    assert refusal is not None and refusal.verdict(freeable) is verdict


def test_a_pod_needing_more_than_the_limit_is_never_resolvable() -> None:
    cluster = book(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "4"}))
    refusal = cluster.quotas.refusal("ml-a", memory(8))
    assert refusal is not None and refusal.verdict(freeable=100) is Verdict.UNRESOLVABLE


# ---- usage follows the holds -------------------------------------------------------------------------------


def used(cluster: Cache, namespace: str = "ml-a", key: str = "limits.aliyun.com/gpu-mem") -> int:
    for _, limit in cluster.quotas.limits(namespace):
        if limit.key == key:
            return cluster.quotas.used(namespace, limit)
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
    assert cluster.quotas.refusal("ml-a", memory(8)) is None


def test_usage_is_rebuilt_from_the_pods_alone_after_a_restart() -> None:
    quota = make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"})
    pods = (
        bound_pod("a", "n1", (0,), 16, namespace="ml-a"),
        bound_pod("b", "n1", (1,), 16, namespace="ml-a"),
        bound_pod("c", "n1", (2,), 16, namespace="ml-b"),
    )
    restarted = make_cluster(make_node("n1", gpus=4, mem=40), pods=pods)
    restarted.quotas.replace([read_quota(quota, GPUSHARE)])  # the quotas' list may come after the pods'
    assert used(restarted) == 32
    fresh = make_cluster(make_node("n1", gpus=4, mem=40))
    fresh.quotas.replace([read_quota(quota, GPUSHARE)])
    fresh.replace([make_node("n1", gpus=4, mem=40)], list(pods))  # or before
    assert used(fresh) == 32


def test_a_deleted_pod_stops_counting() -> None:
    pod = bound_pod("a", "n1", (0,), 16, namespace="ml-a")
    cluster = make_cluster(make_node("n1", gpus=4, mem=40), pods=(pod,))
    cluster.quotas.replace([read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}), GPUSHARE)])
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
    assert not cluster.quotas.active and cluster.quotas.held_in("ml-a") == []
    cluster.quotas.replace([read_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40"}), GPUSHARE)])
    assert [charge for _, _, charge in cluster.quotas.held_in("ml-a")] == [memory(16)]


def test_the_report_shows_each_limit_with_what_its_namespace_uses() -> None:
    cluster = book(
        make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40", "limits.aliyun.com/gpu-count": "1.5"})
    )
    hold(cluster, "a", 16)
    assert cluster.quotas.report() == [
        {
            "namespace": "ml-a",
            "name": "team",
            "limits": [
                {"key": "limits.aliyun.com/gpu-mem", "resource": "memory", "model": "", "limit": 40, "used": 16}
            ],
            "unread": ["limits.aliyun.com/gpu-count: '1.5' is not a whole number; HAMi reads only whole numbers too"],
        }
    ]


def test_quota_values_compare_by_what_they_say() -> None:
    assert Quota("a", "b", (Limit("k", Resource.GPUS, 1, "A100"),)) == Quota(
        "a", "b", (Limit("k", Resource.GPUS, 1, "A100"),)
    )
