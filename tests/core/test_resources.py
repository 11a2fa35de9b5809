"""Quantities, a pod's demand, a node's devices: pure functions over Kubernetes JSON."""

from __future__ import annotations

import pytest

from extender.core.resources import NO_DEMAND, Demand, Device, InvalidPod, InvalidQuantity, node_devices, node_ready, parse_count, pod_demand
from tests.builders import PROFILE, make_node, make_pod


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16", 16),
        (4, 4),
        ("0", 0),
        ("1k", 1000),
        ("2k", 2000),
        ("1Ki", 1024),
        ("1Gi", 2**30),
        ("2e3", 2000),
        ("1e3", 1000),
        ("0.5k", 500),  # 0.5 x 1000
        ("0.5Ki", 512),  # 0.5 x 1024
        ("1.5Gi", 3 * 2**29),
        ("3000m", 3),  # 3000 / 1000
        ("+4", 4),
        (".5k", 500),
        ("5.", 5),
        ("1E", 10**18),  # the exa suffix, not an exponent
        ("7Ei", 7 * 2**60),
        ("-0", 0),
        ("0e999999999", 0),
        (4.0, 4),
        ("9223372036854775807", 2**63 - 1),  # int64's largest, as the API server
        ("1" + "0" * 5000 + "e-5000", 1),  # long, but 1
    ],
)
def test_parse_count_reads_whole_quantities(text: object, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-4", "negative"),
        ("1.5", "not a whole number"),
        ("500m", "not a whole number"),
        ("abc", "not a quantity"),
        ("", "not a quantity"),
        (True, "not a quantity"),
        (None, "not a quantity"),
        ("4 GiB", "not a quantity"),
        ("1e3k", "not a quantity"),
        (" 4 ", "not a quantity"),  # the API server refuses surrounding spaces
        ("\u00b2", "not a quantity"),  # superscript two: str.isdigit() says it is a digit, int() refuses it
        ("\u0664", "not a quantity"),  # Arabic-Indic four: int() would read 4
        ("\uff14", "not a quantity"),  # fullwidth four: int() would read 4
        ("9223372036854775808", "too large"),  # 2**63
        ("8Ei", "too large"),  # 2**63 too
        ("1e19", "too large"),
        (2**63, "too large"),
        (-1, "negative"),
        ("1e-3", "not a whole number"),
        ("1e-999999999", "not a whole number"),
        (4.5, "not a whole number"),
        (float("inf"), "not a quantity"),
    ],
)
def test_parse_count_refuses_with_the_value_quoted(text: object, message: str) -> None:
    with pytest.raises(InvalidQuantity, match=message) as refused:
        parse_count(text)
    assert str(refused.value).startswith(repr(text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1e999999", "too large"),
        ("1e1000000", "too large"),
        ("1e400000", "too large"),
        ("1e5000", "too large"),
        ("9" * 5000, "too large"),
        ("1" * 5000 + "e-4990", "not a whole number"),  # ~1.1e9, and a fraction
        ("0." + "0" * 5000 + "1e-999999", "not a whole number"),
    ],
    ids=["1e999999", "1e1000000", "1e400000", "1e5000", "5000-digits", "5000-digits-e-4990", "long-tiny-fraction"],
)
def test_huge_quantities_are_refused_without_building_them(text: str, message: str) -> None:
    """D2, D3: before, "1e999999" held the process 25 s (Decimal to int is quadratic) and "1e5000" was a 500.
    Refused here from the count of digits and the exponent alone: were the number built, this would take seconds."""
    with pytest.raises(InvalidQuantity, match=message):
        parse_count(text)


def test_a_long_value_is_quoted_cut_short() -> None:
    with pytest.raises(InvalidQuantity) as refused:
        parse_count("9" * 5000)
    assert str(refused.value) == f"'{'9' * 39}... (5002 characters) is too large (more than {2**63 - 1})"


def test_a_huge_integer_is_refused_without_printing_it() -> None:
    with pytest.raises(InvalidQuantity, match="an integer of 16610 bits is too large"):
        parse_count(10**5000)


def test_demand_sums_containers_like_the_device_plugin() -> None:
    pod = make_pod(gpu_mem=4)
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {PROFILE.memory_resource: "2"}}})
    assert pod_demand(pod, PROFILE) == Demand(memory=6, devices=1)


def test_demand_takes_the_largest_init_container_when_it_exceeds_the_sum() -> None:
    pod = make_pod(gpu_mem=4)
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {PROFILE.memory_resource: "10"}}}]
    assert pod_demand(pod, PROFILE).memory == 10  # max(4, 10)


def test_demand_reads_requests_when_limits_lack_the_resource() -> None:
    pod = make_pod(gpu_mem=None)
    pod["spec"]["containers"][0]["resources"] = {"requests": {PROFILE.memory_resource: "12"}}
    assert pod_demand(pod, PROFILE).memory == 12


def test_demand_spans_the_requested_gpu_count_rounding_up_per_device() -> None:
    demand = pod_demand(make_pod(gpu_mem=10, gpus=3), PROFILE)
    assert (demand.memory, demand.devices, demand.per_device) == (10, 3, 4)  # ceil(10 / 3)


def test_a_pod_without_the_resource_has_no_demand() -> None:
    assert pod_demand(make_pod(gpu_mem=None), PROFILE) is NO_DEMAND


@pytest.mark.parametrize(("value", "fragment"), [("-4", "is negative"), ("lots", "is not a quantity")])
def test_bad_pod_quantities_name_the_container(value: str, fragment: str) -> None:
    with pytest.raises(InvalidPod, match=rf"container main: limits aliyun.com/gpu-mem '{value}' {fragment}"):
        pod_demand(make_pod(gpu_mem=value), PROFILE)


def test_a_pod_without_spec_is_invalid() -> None:
    with pytest.raises(InvalidPod, match="spec"):
        pod_demand({"metadata": {"name": "p"}}, PROFILE)


def test_devices_come_from_capacity_split_evenly() -> None:
    assert node_devices(make_node(gpus=2, mem=16), PROFILE).devices == (Device(0, 16), Device(1, 16))


def test_device_annotation_lists_heterogeneous_and_unhealthy_devices() -> None:
    node = make_node(devices=[{"index": 1, "memory": 24}, {"index": 0, "memory": 16, "healthy": False}])
    assert node_devices(node, PROFILE).devices == (Device(0, 0, healthy=False), Device(1, 24))


def test_a_bad_device_annotation_falls_back_to_capacity_and_says_so() -> None:
    found = node_devices(make_node(gpus=1, mem=16, devices=[{"index": "zero"}]), PROFILE)
    assert found.devices == (Device(0, 16),)
    assert "ignored" in found.unreadable


def test_a_node_with_memory_but_no_count_has_no_devices_and_a_problem() -> None:
    node = make_node(gpus=0)
    node["status"]["capacity"][PROFILE.memory_resource] = "32"
    found = node_devices(node, PROFILE)
    assert found.devices == ()
    assert "no aliyun.com/gpu-count" in found.unreadable


def test_readiness_follows_the_ready_condition() -> None:
    assert node_ready(make_node(ready=True))
    assert not node_ready(make_node(ready=False))
    assert node_ready({"metadata": {"name": "bare"}})


def test_a_node_claiming_absurdly_many_gpus_is_ignored_with_a_reason() -> None:
    node = make_node("n1", gpus=2, mem=16)
    node["status"]["capacity"][PROFILE.count_resource] = "9" * 18  # a quantity, but no machine's GPU count
    found = node_devices(node, PROFILE)
    assert found.devices == () and "more than 256 GPUs" in found.unreadable
