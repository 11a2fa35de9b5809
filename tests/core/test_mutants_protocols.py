"""What the protocols read that `make mutation` found unguarded (`core/protocols/`): each way our per-device
annotation can be wrong, said exactly (the cache shows it as the node's unreadable reason), its bounds; the
unhealthy-GPU ConfigMap as the Go extender reads it; JSON annotation text and its size; HAMi's allocation texts
(devices and MIG reservations) and its node registration (GPUs, MIG profiles) at their bounds and defaults, as
HAMi's own decoders read them."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from extender.core.devices import Demand, Device
from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance, MigProfile
from extender.core.protocols.gofields import json_text
from extender.core.protocols.gpushare import Profile
from extender.core.protocols.hami import decode, encode
from extender.core.protocols.hami_mig import decode_instances, read_profiles
from extender.core.protocols.hami_policy import weights, with_links
from tests.builders import HAMI, PROFILE, make_hami_node, make_node

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


# ---- HAMi: hami.io/vgpu-devices-allocated and hami.io/vgpu-mig-allocations ---------------------------------


def test_hamis_devices_text_is_read_entry_by_entry_and_refused_whole_when_one_is_wrong() -> None:
    text = "GPU-a,NVIDIA,1000,30:;;GPU-b,NVIDIA,2147483647,150:GPU-c,NVIDIA,0,0:;"
    assert decode(text) == (
        (Grant(-1, 1000, 30, "GPU-a"),),
        (Grant(-1, 2147483647, 100, "GPU-b"), Grant(-1, 0, 0, "GPU-c")),
    )
    assert decode("erased:GPU-a,NVIDIA,1,2:;") == ((Grant(-1, 1, 2, "GPU-a"),),)
    with pytest.raises(ValueError, match=r"^device entry ',NVIDIA,1,2': expected uuid,type,memory,cores$"):
        decode(",NVIDIA,1,2:;")
    with pytest.raises(ValueError, match=r"^device entry 'GPU-a,NVIDIA,1': expected uuid,type,memory,cores$"):
        decode("GPU-a,NVIDIA,1:;")
    long_entry = "GPU-" + "x" * 100 + ",NVIDIA"
    with pytest.raises(ValueError, match=r"^device entry '" + long_entry[:80] + r"': expected"):
        decode(long_entry + ":;")


@pytest.mark.parametrize("memory", ["2147483648", "12345678901", "-1", "1e3", "٣", "", "+5", "00002147483648"])
def test_hamis_memory_beyond_int32_or_not_decimal_digits_is_refused(memory: str) -> None:
    with pytest.raises(ValueError, match=r"is not a whole number of at most 2\^31-1$"):
        decode(f"GPU-a,NVIDIA,{memory},0:;")


@pytest.mark.parametrize(("memory", "read"), [("0000000016", 16), ("000000000002147483647", 2147483647), ("0", 0)])
def test_hamis_memory_with_leading_zeros_is_read_as_its_parseint_reads_it(memory: str, read: int) -> None:
    """HAMi reads the field with strconv.ParseInt(s, 10, 32) (pkg/device/devices.go:512 and 517,
    DecodeContainerDevices, at v2.10.0), which takes leading zeros; the length bound applies to the digits after
    them."""
    assert decode(f"GPU-a,NVIDIA,{memory},0:;") == ((Grant(-1, read, 0, "GPU-a"),),)


def test_a_number_too_long_is_named_by_its_first_40_characters() -> None:
    with pytest.raises(ValueError) as refused:
        decode(f"GPU-a,NVIDIA,{'9' * 50},0:;")
    assert str(refused.value) == f"{'9' * 40!r} is not a whole number of at most 2^31-1"


def test_hamis_devices_text_is_read_up_to_64_kib() -> None:
    entry = "GPU-a,NVIDIA,1,2:"
    fill = ";" * (64 * 1024 - len(entry))
    assert decode(entry + fill) == ((Grant(-1, 1, 2, "GPU-a"),),)
    with pytest.raises(ValueError, match=r"^too long$"):
        decode(entry + fill + ";")


def test_encode_names_each_gpu_by_its_uuid_or_the_nodes() -> None:
    grants = ((Grant(0, 1000, 30), Grant(1, 500, 0, "GPU-own")), (Grant(2, 10, 0),))
    assert encode(grants, {0: "GPU-zero"}) == "GPU-zero,NVIDIA,1000,30:GPU-own,NVIDIA,500,0:;,NVIDIA,10,0:;"


def reservation(container: int = 0, device: int = 0, **fields: Any) -> dict[str, Any]:
    entry = {"containerIndex": container, "deviceIndex": device, "gpuUUID": "GPU-a", "profile": "1g.5gb"}
    return entry | {"placement": {"start": 6, "size": 1}} | fields


def test_mig_reservations_are_read_whole_or_refused_saying_which() -> None:
    listed = [reservation(), reservation(1, placement={"start": 4, "size": 2}, profile="2g.10gb")]
    assert decode_instances(orjson.dumps(listed).decode()) == [
        ("GPU-a", MigInstance("1g.5gb", 6, 1)),
        ("GPU-a", MigInstance("2g.10gb", 4, 2)),
    ]
    assert decode_instances(None) == [] and decode_instances("") == []
    for broken, why in [
        ([reservation(placement={"start": 6})], "MIG allocation 0 is incomplete"),
        ([reservation(), reservation(1, profile="")], "MIG allocation 1 is incomplete"),
        ([reservation(gpuUUID="")], "MIG allocation 0 is incomplete"),
        ([reservation(migUUID="MIG-1")], "MIG allocation 0 has partial runtime identity"),
        ([reservation(), reservation()], "duplicate MIG allocation for container 0 device 0"),
        (["GPU-a"], "reservation 0 is not an object"),
        ({"a": 1}, "expected a JSON array of reservations"),
    ]:
        with pytest.raises(ValueError, match=f"^{why}$"):
            decode_instances(orjson.dumps(broken).decode())
    complete = reservation(migUUID="MIG-1", gpuInstanceID=1, computeInstanceID=0)
    assert decode_instances(orjson.dumps([complete]).decode()) == [("GPU-a", MigInstance("1g.5gb", 6, 1))]


# ---- HAMi: hami.io/node-nvidia-register and its migProfiles -------------------------------------------------


def registered(listed: object) -> Any:
    node = make_hami_node("gpu-1", gpus=1)
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = (
        listed if isinstance(listed, str) or not isinstance(listed, list) else orjson.dumps(listed).decode()
    )
    return HAMI.node_devices(node)


def gpu(index: int = 0, **fields: Any) -> dict[str, Any]:
    return {"type": "NVIDIA A100", "index": index} | fields


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        (5, "not a string"),
        ("{", "not JSON (HAMi v2.8 and later write a JSON array)"),
        ('{"index": 0}', "expected a JSON array of GPUs"),
        ([gpu(i) for i in range(257)], "257 GPUs is more than 256"),
        (["GPU-0"], "each GPU must be an object"),
        ([gpu(0), gpu(0)], "bad or repeated GPU index 0"),
        ([gpu(0, migProfiles=[{"name": "1g.5gb"}, "2g"])], "each MIG profile must be an object"),
        ([gpu(0, migProfiles=[{"name": ""}])], "MIG profile name is empty"),
        ([gpu(0, migProfiles={"name": "1g.5gb"})], "migProfiles must be an array of at most 64 profiles"),
        ([gpu(0, migProfiles=[{"name": "1g.5gb", "placements": [{"start": 6}]}])],
         "MIG profile '1g.5gb': placement (6, 0) is not within the GPU's slices"),
        ([gpu(0, migProfiles=[{"name": "1g.5gb", "placements": [{"start": 60, "size": 5}]}])],
         "MIG profile '1g.5gb': placement (60, 5) is not within the GPU's slices"),
        ([gpu(0, migProfiles=[{"name": "1g.5gb", "placements": [6]}])],
         "MIG profile '1g.5gb': each placement must be an object"),
        ([gpu(0, migProfiles=[{"name": "1g.5gb", "placements": {"start": 6}}])],
         "MIG profile '1g.5gb': placements must be an array of at most 64"),
    ],
)  # fmt: skip
def test_a_registration_hami_could_not_read_says_why(listed: object, why: str) -> None:
    found = registered(listed)
    assert (found.devices, found.unreadable) == ((), f"hami.io/node-nvidia-register unreadable: {why}")


def test_a_registration_gives_go_zero_values_for_what_it_leaves_out_and_skips_other_vendors() -> None:
    found = registered([{"type": "Ascend910", "index": 0, "devmem": 1}, gpu(1)])
    assert found.unreadable == ""
    assert found.devices == (Device(1, 0, healthy=False, cores=0, slots=0, model="NVIDIA A100", uuid="", mode=""),)
    assert registered([gpu(i) for i in range(256)]).unreadable == ""
    untyped = registered([{"index": 0, "devmem": 1}])
    assert (untyped.devices, untyped.unreadable) == ((), "hami.io/node-nvidia-register lists no NVIDIA GPU")


def test_a_mig_profile_gives_go_zero_values_for_what_it_leaves_out() -> None:
    [device] = registered(
        [gpu(0, mode="mig", migProfiles=[{"name": "1g.5gb", "placements": [{"start": 6, "size": 1}]}])]
    ).devices
    assert device.profiles == (MigProfile("1g.5gb", 0, 0, 0, ((6, 1),)),)
    assert read_profiles(None) == () and read_profiles([]) == ()


# ---- HAMi's scoring weights and pair scores (hami_policy) ---------------------------------------------------

LONG = "k" * 30


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("slot=1,core=1", "expected slot, core and memory weights (slot=1,core=1,memory=3)"),
        ("slot=1,core=1,memory", "expected key=value entries (slot=1,core=1,memory=3)"),
        ("slot=1,slot=1,memory=1", "duplicate 'slot' weight"),
        (f"slot=1,core=1,{LONG}=1", f"unknown weight {LONG[:20]!r}"),
        ("slot=1,core=1,memory=" + "9" * 19, f"memory weight {'9' * 19!r} must be a whole number of at least 0"),
        ("slot=1,core=1,memory=1=2", "memory weight '1=2' must be a whole number of at least 0"),
        ("slot=1,core=1,memory=++1", "memory weight '++1' must be a whole number of at least 0"),
        ("slot=0,core=0,memory=0", "at least one weight must be above 0"),
    ],
)  # fmt: skip
def test_scoring_weights_that_hami_would_refuse_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        weights(text)
    assert str(refused.value).startswith(why)


def test_scoring_weights_read_a_plus_and_up_to_18_digits() -> None:
    assert weights(None) == (1, 1, 1)
    assert weights(" slot = +2 , core=0,memory=" + "9" * 18) == (2, 0, 999_999_999_999_999_999)
    with pytest.raises(ValueError) as refused:
        weights(f"slot=1,core=1,memory={'9' * 25}")
    assert str(refused.value) == f"memory weight {'9' * 20!r} must be a whole number of at least 0"


def gpus_named(*uuids: str) -> list[Device]:
    return [Device(index, 40960, uuid=uuid) for index, uuid in enumerate(uuids)]


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        ({"uuid": "GPU-0"}, "expected a JSON array of at most 256 GPUs"),
        ([{"uuid": f"GPU-{i}"} for i in range(257)], "expected a JSON array of at most 256 GPUs"),
        (["GPU-0"], "each GPU's scores must be an object"),
        ([{"uuid": 5}], "expected {uuid: string, score: {uuid: number}}"),
        ([{"uuid": "GPU-0", "score": "GPU-1"}], "expected {uuid: string, score: {uuid: number}}"),
        ([{"uuid": "GPU-0", "score": {"GPU-1": True}}], "score 'True' of GPU-0 to GPU-1 is not a whole number"),
        ([{"uuid": "GPU-0", "score": {"GPU-1": 10001}}], "score '10001' of GPU-0 to GPU-1 is not a whole number"),
    ],
)  # fmt: skip
def test_pair_scores_that_gos_decoder_would_refuse_say_why(listed: object, why: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        with_links(gpus_named("GPU-0", "GPU-1"), orjson.dumps(listed).decode())


def test_pair_scores_are_given_to_the_gpus_they_name_the_first_entry_of_a_uuid_winning() -> None:
    devices = gpus_named("GPU-0", "GPU-1")
    assert with_links(devices, None) == tuple(devices) and with_links(devices, "null") == tuple(devices)
    listed = [
        {"uuid": "GPU-0", "score": {"GPU-1": 100, "GPU-2": -10000}},
        {"uuid": "GPU-0", "score": {"GPU-1": 1}},
        {"score": {"GPU-0": 5}},
    ]
    linked = with_links(devices, orjson.dumps(listed).decode())
    assert [device.links for device in linked] == [(("GPU-1", 100), ("GPU-2", -10000)), ()]
    assert len(with_links(devices, orjson.dumps([{"uuid": f"GPU-{i}"} for i in range(256)]).decode())) == 2


def test_mig_reservations_are_told_apart_by_container_and_device_their_go_zero_values_counting() -> None:
    def read(*entries: dict[str, Any]) -> list[tuple[str, MigInstance]]:
        return decode_instances(orjson.dumps(list(entries)).decode())

    one = {"gpuUUID": "GPU-a", "profile": "1g.5gb", "placement": {"size": 1}}  # start 0, container 0, device 0
    assert (
        read(one, one | {"deviceIndex": 1}, one | {"containerIndex": 1}) == [("GPU-a", MigInstance("1g.5gb", 0, 1))] * 3
    )
    with pytest.raises(ValueError, match=r"^duplicate MIG allocation for container 1 device 0$"):
        read(one | {"containerIndex": 1}, one | {"containerIndex": 1, "deviceIndex": 0})
    for missing in ("gpuUUID", "profile"):
        with pytest.raises(ValueError, match=r"^MIG allocation 0 is incomplete$"):
            read({key: value for key, value in one.items() if key != missing})
    runtime_empty = one | {"migUUID": "", "gpuInstanceID": None, "computeInstanceID": ""}
    assert read(runtime_empty) == [("GPU-a", MigInstance("1g.5gb", 0, 1))]
    with pytest.raises(ValueError, match=r"^MIG allocation 0 is incomplete$"):
        read(*[{}] * 4096)  # as many as HAMi may write: read, and refused for what they lack
    with pytest.raises(ValueError, match=r"^not a string of at most 64 KiB$"):
        decode_instances("[]" + " " * (64 * 1024 - 1))


def pod_annotated(node_name: str = "", **annotations: str) -> dict[str, Any]:
    spec = {"nodeName": node_name} if node_name else {}
    meta = {"name": "p", "namespace": "default", "uid": "uid-p", "annotations": annotations}
    return {"kind": "Pod", "metadata": meta, "spec": spec}


def test_gpushare_reads_a_pods_node_from_its_binding_else_our_annotation_and_its_memory_else_its_demand() -> None:
    idx, mem, ours = "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_POD", "gpu-extender.io/node"
    recorded = PROFILE.recorded(pod_annotated("n1", **{idx: "1", mem: "6"}), Demand(4))
    assert (recorded.node, recorded.allocation) == ("n1", Allocation.uniform("uid-p", "default/p", "n1", (1,), 6))
    assert PROFILE.recorded(pod_annotated(**{ours: "n2", idx: "0"}), Demand(4)).allocation == Allocation.uniform(
        "uid-p", "default/p", "n2", (0,), 4
    )
    assert PROFILE.recorded(pod_annotated("n1", **{idx: "0,1"}), None).allocation == Allocation.uniform(
        "uid-p", "default/p", "n1", (0, 1), 0
    )
    assert PROFILE.recorded(pod_annotated("n1", **{idx: "0", mem: "0"}), Demand(4)).allocation is not None
    assert PROFILE.recorded(pod_annotated("n1", **{idx: "-1", mem: "4"}), Demand(4)).allocation is None
    assert PROFILE.recorded(pod_annotated("n1", **{idx: "0", mem: "-4"}), Demand(4)).allocation is None
    assert PROFILE.recorded(pod_annotated(**{idx: "0", mem: "4"}), Demand(4)).node in ("", None)
