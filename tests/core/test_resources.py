"""Quantities, a pod's demand, a node's devices: pure functions over Kubernetes JSON."""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.resources import (
    InvalidQuantity,
    node_allocatable,
    node_ready,
    parse_count,
    parse_milli,
    pod_request,
    required_values,
)
from tests.builders import make_node


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


def test_readiness_follows_the_ready_condition() -> None:
    assert node_ready(make_node(ready=True))
    assert not node_ready(make_node(ready=False))
    assert node_ready({"metadata": {"name": "bare"}})


# --- cpu and memory, as kube-scheduler counts them ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "millis"),
    [("250m", 250), ("2", 2000), ("1.5", 1500), ("0.1", 100), (3, 3000), ("1k", 1_000_000), ("0", 0)],
)
def test_a_cpu_quantity_is_read_in_millicores(value: object, millis: int) -> None:
    assert parse_milli(value) == millis


@pytest.mark.parametrize("value", ["0.0005", "-1", "1e999999", "lots", "1Mi5"])
def test_a_cpu_quantity_finer_than_a_millicore_or_malformed_is_refused_in_bounded_work(value: str) -> None:
    with pytest.raises(InvalidQuantity):
        parse_milli(value)


def _pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), overhead: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers), "initContainers": list(init)}
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"name": "p"}, "spec": spec}


def _container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}}


@pytest.mark.parametrize(
    ("pod", "cpu"),
    [
        (_pod(_container({"cpu": "500m"}), _container({"cpu": "1"})), 1500),  # containers add up
        (_pod(_container(limits={"cpu": "2"})), 2000),  # a limit alone is the request
        (_pod(_container({"cpu": "1"}), init=(_container({"cpu": "3"}),)), 3000),  # the largest init when larger
        (_pod(_container({"cpu": "1"}), overhead={"cpu": "250m"}), 1250),  # RuntimeClass overhead on top
        (_pod(_container({"cpu": "a lot"})), 0),  # unreadable: counts nothing, never a refusal
        (_pod(_container()), 0),
    ],
    ids=["sum", "limit", "init", "overhead", "unreadable", "none"],
)
def test_a_pods_cpu_is_what_kube_scheduler_counts(pod: dict[str, Any], cpu: int) -> None:
    assert pod_request(pod, "cpu", scale=3) == cpu


def test_a_pods_memory_is_in_bytes() -> None:
    assert pod_request(_pod(_container({"memory": "1Gi"}), _container({"memory": "512Mi"})), "memory") == 1536 << 20


def test_a_nodes_allocatable_is_read_and_its_capacity_stands_in_when_it_has_none() -> None:
    node = {"status": {"allocatable": {"cpu": "7800m"}, "capacity": {"cpu": "8", "memory": "32Gi"}}}
    assert node_allocatable(node, "cpu", scale=3) == 7800
    assert node_allocatable(node, "memory") == 32 << 30
    assert node_allocatable({"status": {"allocatable": {"cpu": "many"}}}, "cpu", scale=3) == 0


MODEL = "nvidia.com/gpu.product"


def _affinity(*terms: list[dict[str, Any]], selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if terms:
        required = {"nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"spec": spec}


def _in(*values: str, key: str = MODEL, operator: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("pod", "models"),
    [
        (_affinity([_in("T4", "V100")]), ("T4", "V100")),
        (_affinity(selector={MODEL: "A100"}), ("A100",)),
        (_affinity([_in("T4", "A100")], selector={MODEL: "A100"}), ("A100",)),  # both must hold
        (_affinity([_in("T4")], [_in("V100")]), ("T4", "V100")),  # terms are ORed
        (_affinity([_in("T4")], [_in("x", key="zone")]), ()),  # a term that lets any model: no restriction
        (_affinity([_in("T4", "V100"), _in("V100", "A100")]), ("V100",)),  # expressions of a term are ANDed
        (_affinity([_in("T4", operator="NotIn")]), ()),
        (_affinity(), ()),
        ({"spec": {"affinity": "garbage"}}, ()),
    ],
    ids=["in", "selector", "both", "ored", "unrestricted-term", "anded", "not-in", "none", "garbage"],
)
def test_the_gpu_models_a_pod_requires_come_from_its_selector_and_required_affinity(
    pod: dict[str, Any], models: tuple[str, ...]
) -> None:
    assert required_values(pod, MODEL) == models
