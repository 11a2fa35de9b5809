"""What a pod is given, per GPU model, as a quota counts it (HAMi v2.10.0 `quota.go`, cited by file and line)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.devices import Device
from extender.core.holds import Allocation, Grant
from extender.core.placement.config import PolicyConfig
from extender.core.quota.admission import charge_on
from extender.core.quota.charges import Charge, charge_of
from tests.builders import (
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    placer_for,
)


def hami_charge(pod: dict[str, Any], **node: Any) -> Charge:
    """What HAMi's protocol gives the pod on an idle node (one A100-40GB GPU by default)."""
    cluster = make_hami_cluster(make_hami_node("gpu-1", **{"gpus": 1, **node}))
    demand = cluster.protocol.pod_demand(pod)
    state = cluster.nodes["gpu-1"]
    charge = charge_on(state, placer_for(cluster, PolicyConfig()).choose(demand, state))
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
