"""The gpushare protocol: a pod's demand and a node's GPUs as the gpushare device plugin advertises them, and
the annotations an allocation is written in and read back from."""

from __future__ import annotations

import pytest

from extender.core.devices import NO_DEMAND, Demand, Device
from extender.core.protocols.gpushare import Profile, SeveralGpus
from extender.core.resources import InvalidPod
from tests.builders import PROFILE, make_node, make_pod


def test_demand_sums_containers_like_the_device_plugin() -> None:
    pod = make_pod(gpu_mem=4)
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {PROFILE.memory_resource: "2"}}})
    assert PROFILE.pod_demand(pod) == Demand(memory=6, devices=1)


def test_demand_takes_the_largest_init_container_when_it_exceeds_the_sum() -> None:
    pod = make_pod(gpu_mem=4)
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {PROFILE.memory_resource: "10"}}}]
    assert PROFILE.pod_demand(pod).memory == 10  # max(4, 10)


def test_demand_reads_requests_when_limits_lack_the_resource() -> None:
    pod = make_pod(gpu_mem=None)
    pod["spec"]["containers"][0]["resources"] = {"requests": {PROFILE.memory_resource: "12"}}
    assert PROFILE.pod_demand(pod).memory == 12


def test_demand_spans_the_requested_gpu_count_rounding_up_per_device() -> None:
    demand = PROFILE.pod_demand(make_pod(gpu_mem=10, gpus=3))
    assert (demand.memory, demand.devices, demand.per_device) == (10, 3, 4)  # ceil(10 / 3)


def test_a_pod_asking_several_gpus_is_refused_saying_the_plugin_gives_one_at_most() -> None:
    demand = PROFILE.pod_demand(make_pod(gpu_mem=16, gpus=2))
    assert PROFILE.refusal(demand) == (
        "asks 2 GPUs (aliyun.com/gpu-count: 2); gpushare's device plugin gives a pod one GPU at most: "
        "its container would start without a GPU"
    )


def test_the_refusal_names_the_count_resource_of_the_profile() -> None:
    profile = Profile(memory_resource="example.com/gpu-mem", count_resource="example.com/gpu-count")
    refusal = profile.refusal(profile.pod_demand(make_pod(gpu_mem=30, gpus=3, profile=profile)))
    assert refusal is not None and refusal.startswith("asks 3 GPUs (example.com/gpu-count: 3); ")


@pytest.mark.parametrize(
    ("several_gpus", "gpus", "refused"),
    [
        (SeveralGpus.REFUSE, None, False),  # no count: one GPU
        (SeveralGpus.REFUSE, 1, False),
        (SeveralGpus.REFUSE, 2, True),
        (SeveralGpus.BIND, 2, False),  # a node side that reads gpu-extender.io/device-indexes
        (SeveralGpus.BIND, 8, False),
    ],
)
def test_only_several_gpus_are_refused_and_only_unless_told_to_bind(
    several_gpus: SeveralGpus, gpus: int | None, refused: bool
) -> None:
    profile = Profile(several_gpus=several_gpus)
    demand = profile.pod_demand(make_pod(gpu_mem=16, gpus=gpus))
    assert (profile.refusal(demand) is not None) is refused


def test_the_default_profile_refuses_several_gpus() -> None:
    assert Profile().several_gpus is SeveralGpus.REFUSE


def test_a_pod_without_the_resource_has_no_demand() -> None:
    assert PROFILE.pod_demand(make_pod(gpu_mem=None)) is NO_DEMAND


@pytest.mark.parametrize(("value", "fragment"), [("-4", "is negative"), ("lots", "is not a quantity")])
def test_bad_pod_quantities_name_the_container(value: str, fragment: str) -> None:
    with pytest.raises(InvalidPod, match=rf"container main: limits aliyun.com/gpu-mem '{value}' {fragment}"):
        PROFILE.pod_demand(make_pod(gpu_mem=value))


def test_a_pod_without_spec_is_invalid() -> None:
    with pytest.raises(InvalidPod, match="spec"):
        PROFILE.pod_demand({"metadata": {"name": "p"}})


def test_devices_come_from_capacity_split_evenly() -> None:
    assert PROFILE.node_devices(make_node(gpus=2, mem=16)).devices == (Device(0, 16), Device(1, 16))


def test_device_annotation_lists_heterogeneous_and_unhealthy_devices() -> None:
    node = make_node(devices=[{"index": 1, "memory": 24}, {"index": 0, "memory": 16, "healthy": False}])
    assert PROFILE.node_devices(node).devices == (Device(0, 0, healthy=False), Device(1, 24))


def test_a_bad_device_annotation_falls_back_to_capacity_and_says_so() -> None:
    found = PROFILE.node_devices(make_node(gpus=1, mem=16, devices=[{"index": "zero"}]))
    assert found.devices == (Device(0, 16),)
    assert "ignored" in found.unreadable


def test_a_node_with_memory_but_no_count_has_no_devices_and_a_problem() -> None:
    node = make_node(gpus=0)
    node["status"]["capacity"][PROFILE.memory_resource] = "32"
    found = PROFILE.node_devices(node)
    assert found.devices == ()
    assert "no aliyun.com/gpu-count" in found.unreadable


def test_a_node_claiming_absurdly_many_gpus_is_ignored_with_a_reason() -> None:
    node = make_node("n1", gpus=2, mem=16)
    node["status"]["capacity"][PROFILE.count_resource] = "9" * 18  # a quantity, but no machine's GPU count
    found = PROFILE.node_devices(node)
    assert found.devices == () and "more than 256 GPUs" in found.unreadable
