"""What the protocols read that `make mutation` found unguarded (`core/protocols/`): each way our per-device
annotation can be wrong, said exactly (the cache shows it as the node's unreadable reason), its bounds; the
unhealthy-GPU ConfigMap as the Go extender reads it; JSON annotation text and its size."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.core.devices import Device
from extender.core.protocols.gofields import json_text
from extender.core.protocols.gpushare import Profile
from tests.builders import PROFILE, make_node

IGNORED = "annotation gpu-extender.io/devices ignored: "


def node_annotated(text: str) -> dict[str, Any]:
    node = make_node(gpus=1, mem=16)
    node["metadata"]["annotations"]["gpu-extender.io/devices"] = text
    return node


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not JSON"),
        ("[]", "expected a non-empty list of devices"),
        ('{"index": 0, "memory": 16}', "expected a non-empty list of devices"),
        ('[{"index": 0}]', 'each device needs "index" and "memory"'),
        ('[{"memory": 16}]', 'each device needs "index" and "memory"'),
        ('["gpu"]', 'each device needs "index" and "memory"'),
        ('[{"index": true, "memory": 16}]', "bad or repeated device index True"),
        ('[{"index": -1, "memory": 16}]', "bad or repeated device index -1"),
        ('[{"index": "0", "memory": 16}]', "bad or repeated device index '0'"),
        ('[{"index": 0, "memory": 16}, {"index": 0, "memory": 16}]', "bad or repeated device index 0"),
        (orjson.dumps([{"index": i, "memory": 1} for i in range(257)]).decode(), "257 devices is more than 256"),
    ],
)  # fmt: skip
def test_a_wrong_devices_annotation_is_ignored_saying_why(text: str, why: str) -> None:
    found = PROFILE.node_devices(node_annotated(text))
    assert found.unreadable == f"{IGNORED}{why}"
    assert found.devices == (Device(0, 16),)  # from capacity


def test_a_device_of_unreadable_memory_names_its_index() -> None:
    found = PROFILE.node_devices(node_annotated('[{"index": 3, "memory": "lots"}]'))
    assert found.unreadable.startswith(f"{IGNORED}device 3 memory ")


def test_the_devices_annotation_reads_up_to_256_gpus_and_any_health_but_false_is_healthy() -> None:
    many = PROFILE.node_devices(node_annotated(orjson.dumps([{"index": i, "memory": 1} for i in range(256)]).decode()))
    assert many.unreadable == "" and len(many.devices) == 256
    listed = [{"index": 1, "memory": 8, "healthy": None}, {"index": 0, "memory": 8, "healthy": False}]
    found = PROFILE.node_devices(node_annotated(orjson.dumps(listed).decode()))
    assert found.devices == (Device(0, 0, healthy=False), Device(1, 8))


def configmap(name: str, gpus: object = None) -> dict[str, Any]:
    data = {} if gpus is None else {"gpus": gpus}
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "kube-system"}, "data": data}


def test_the_unhealthy_gpus_configmap_names_its_node_and_the_indexes_it_lists() -> None:
    assert Profile().unhealthy_gpus(configmap("unhealthy-gpu-n1", " 0, 2 ,x,,12345,3")) == ("n1", frozenset({0, 2, 3}))
    assert Profile().unhealthy_gpus(configmap("unhealthy-gpu-n1", "9999")) == ("n1", frozenset({9999}))
    assert Profile().unhealthy_gpus(configmap("unhealthy-gpu-n2")) == ("n2", frozenset())
    assert Profile().unhealthy_gpus(configmap("unhealthy-gpu-")) is None
    assert Profile().unhealthy_gpus(configmap("other-gpu-n1", "0")) is None


def test_json_text_reads_up_to_its_size_and_says_what_is_wrong() -> None:
    assert json_text('{"a": 1}', 8) == {"a": 1}
    with pytest.raises(ValueError, match=r"^not a string of at most 2 KiB$"):
        json_text(" " * 2049, 2048)
    with pytest.raises(ValueError, match=r"^not a string of at most 2 KiB$"):
        json_text(["a list"], 2048)
    with pytest.raises(ValueError, match=r"^not JSON$"):
        json_text("{", 2048)
    assert json_text(" " * 2046 + "[]", 2048) == []
