"""A ResourceQuota's GPU keys read with HAMi's rules, and which GPU models a limit counts.

HAMi's cases cite HAMi v2.10.0 (commit 4707fb02) by file and line, paths as in tests/fixtures/hami/NOTES.md:
`quota.go` = pkg/device/quota.go, `nv/` = pkg/device/nvidia/, `dev/` = pkg/device/, `sch/` = pkg/scheduler/.
"""

from __future__ import annotations

import pytest

from extender.core.placement.fit import Verdict
from extender.core.protocols import QuotaResources
from extender.core.quota.charges import Charge
from extender.core.quota.limits import MAX_LIMITS, Limit, Quota, Resource, counts_model, read_quota
from tests.builders import (
    make_cluster,
    make_node,
    make_quota,
    quotas_of,
)
from tests.core.quota import GPUSHARE, HAMI, HAMI_GIB


def limits_of(resources: QuotaResources, **hard: str) -> tuple[Limit, ...]:
    return read_quota(make_quota("q", "ml-a", **hard), resources).limits


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
    quotas_of(cluster).replace([quota])
    refusal = quotas_of(cluster).refusal("ml-a", Charge((("", (1, 0, 1)),)))
    assert refusal is not None and refusal.reason.startswith("namespace ml-a: ResourceQuota wide has 33 GPU keys")
    assert refusal.verdict(freeable=100) is Verdict.UNRESOLVABLE
    assert quotas_of(cluster).refusal("ml-b", Charge((("", (1, 0, 1)),))) is None, "other namespaces are not limited"


def test_a_malformed_object_reads_as_a_quota_without_gpu_keys() -> None:
    for obj in ({}, {"spec": "x"}, {"spec": {"hard": ["limits.nvidia.com/gpumem"]}}, {"metadata": 3}):
        assert read_quota(obj, HAMI).limits == ()


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


def test_quota_values_compare_by_what_they_say() -> None:
    assert Quota("a", "b", (Limit("k", Resource.GPUS, 1, "A100"),)) == Quota(
        "a", "b", (Limit("k", Resource.GPUS, 1, "A100"),)
    )
