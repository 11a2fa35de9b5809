"""HAMi's protocol, both ways, from what HAMi v2.10.0's code produces and reads.

Every case cites the HAMi file and line it comes from (tag v2.10.0, commit 4707fb02; paths as in
tests/fixtures/hami/NOTES.md: `dev/` = pkg/device/, `nv/` = pkg/device/nvidia/, `plug/` = the device plugin's
nvinternal/plugin/, `lock/` = pkg/util/nodelock/nodelock.go). Values marked "ran" were produced by running
verbatim copies of HAMi's Go functions (NOTES.md §1, §4, §6).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.core.devices import Demand, Device, NodeLock, Request, Selectors, Strategy
from extender.core.holds import Allocation, Grant
from extender.core.protocols.hami import (
    ALLOCATED,
    LOCK,
    REGISTER,
    TO_ALLOCATE,
    Hami,
    decode,
    encode,
    lock_value,
    read_lock,
)
from extender.core.resources import InvalidPod

HAMI = Hami()

# E1 (ran): getAPIDevices for 2 x A100-40GB, split 10, scalings 1, NUMA 0 and 1 (plug/register.go:92-186,
# dev/devices.go:422 MarshalNodeDevices; index 0 and numa 0 omitted by omitempty, dev/devices.go:127-144).
E1 = (
    '[{"id":"GPU-0a1b2c3d-0000-1111-2222-333344445555","count":10,"devmem":40960,"devcore":100,'
    '"type":"NVIDIA A100-SXM4-40GB","mode":"hami-core","health":true},'
    '{"id":"GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff","index":1,"count":10,"devmem":40960,"devcore":100,'
    '"type":"NVIDIA A100-SXM4-40GB","numa":1,"mode":"hami-core","health":true}]'
)
# E2 (ran): V100 with deviceMemoryScaling 1.5, deviceCoreScaling 2, NVML health "Unhealthy": `health` omitted
# (register.go:148-165).
E2 = (
    '[{"id":"GPU-0a1b2c3d-0000-1111-2222-333344445555","count":10,"devmem":49152,"devcore":200,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core"}]'
)
A, B = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"


def hami_node(register: str | None = E1, allocatable: str = "20", **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "gpu-1", "annotations": dict(annotations)}
    if register is not None:
        meta["annotations"][REGISTER] = register
    return {"metadata": meta, "status": {"allocatable": {"nvidia.com/gpu": allocatable}}}


def hami_pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u-p", "annotations": dict(annotations)},
        "spec": {"initContainers": list(init), "containers": list(containers)},
    }


def container(name: str = "main", **limits: str) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": {f"nvidia.com/{key}": value for key, value in limits.items()}}}


# --- nodes -------------------------------------------------------------------------------------------------


def test_the_registration_of_two_a100s_reads_as_hami_decodes_it() -> None:
    """E1; the scheduler's DeviceUsage fields (sch/scheduler.go:665-686)."""
    found = HAMI.node_devices(hami_node())
    assert found.unreadable == "" and found.lock is None
    assert found.devices == (
        Device(0, 40960, True, 100, 10, "NVIDIA A100-SXM4-40GB", A, 0, "hami-core"),
        Device(1, 40960, True, 100, 10, "NVIDIA A100-SXM4-40GB", B, 1, "hami-core"),
    )


def test_a_gpu_registered_without_health_is_unhealthy_and_scaled_fields_are_kept() -> None:
    """E2: `health` omitted when false (omitempty, dev/devices.go:144); Fit refuses it (nv/device.go:730-734)."""
    (device,) = HAMI.node_devices(hami_node(E2)).devices
    assert (device.capacity, device.cores, device.healthy, device.usable) == (49152, 200, False, False)


@pytest.mark.parametrize(
    "register",
    [
        f'[{{"id":"{A}","count":10,"devmem":24576,"devcore":100,"type":"NVIDIA L4","health":"healthy"}}]',
        f"{A},10,24576,100,NVIDIA-L4,0,true:",  # the stale colon format of docs/develop/protocol.md
        f'[{{"id":"{A}","count":"10","devmem":24576,"devcore":100,"type":"NVIDIA L4","health":true}}]',
        f'[{{"id":"{A}","count":10.0,"devmem":24576,"devcore":100,"type":"NVIDIA L4","health":true}}]',
        "{}",
    ],
)
def test_what_hamis_scheduler_cannot_decode_leaves_the_node_without_gpus(register: str) -> None:
    """E4: Go's json.Unmarshal refuses a wrong type anywhere, and the colon format (nv/device.go:307-311)."""
    found = HAMI.node_devices(hami_node(register))
    assert found.devices == () and "unreadable" in found.unreadable


def test_only_gpus_whose_type_names_nvidia_are_offered() -> None:
    """sch/score.go:43-52 getNodeResources keeps devices whose type contains "nvidia", any case."""
    register = f'[{{"id":"{A}","count":10,"devmem":24576,"devcore":100,"type":"A100","health":true}}]'
    assert HAMI.node_devices(hami_node(register)).devices == ()


def test_a_node_without_registration_or_with_no_allocatable_gpus_has_none() -> None:
    """A node whose plugin stopped (allocatable nvidia.com/gpu 0) is dropped (nv/device.go:254-257); one whose
    registration vanished is dropped too, where HAMi keeps its stale devices (sch/scheduler.go:507-509)."""
    assert "has not registered" in HAMI.node_devices(hami_node(None)).unreadable
    assert "is 0" in HAMI.node_devices(hami_node(allocatable="0")).unreadable


def test_cordoned_uuids_take_no_new_pods() -> None:
    """nv/device.go:698-713: comma list, items trimmed, empties skipped; Fit refuses them (:735-738)."""
    devices = HAMI.node_devices(hami_node(**{"hami.io/device-cordon": f" {B} , ,"})).devices
    assert [device.cordoned for device in devices] == [False, True]


@pytest.mark.parametrize(
    ("value", "lock"),
    [
        ("2026-08-21T10:00:00Z,default,pod1", NodeLock(1787306400.0, "default/pod1")),  # lock/:306-311
        ("2026-08-21T10:00:00Z", NodeLock(1787306400.0, "")),  # legacy bare RFC 3339 (lock/:293-304)
        ("2026-08-21T12:00:00+02:00,ns,p", NodeLock(1787306400.0, "ns/p")),  # local zone, as time.Now() writes
        ("not a time", NodeLock(0.0, "")),  # unreadable: abandoned, the next bind takes it over
    ],
)
def test_the_node_lock_is_read_as_hami_writes_it(value: str, lock: NodeLock) -> None:
    assert read_lock(value) == lock
    assert HAMI.node_devices(hami_node(**{LOCK: value})).lock == lock


def test_the_lock_we_write_is_the_one_hami_parses() -> None:
    assert lock_value(1787306400.0, "default", "pod1") == "2026-08-21T10:00:00Z,default,pod1"


# --- pods --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "request_"),
    [
        # R1-R10 of NOTES.md §2 (nv/device.go:520-600 GenerateResourceRequests, defaults config.go:306-309)
        ({"gpu": "1"}, Request(1, 0, 100, 0)),  # neither memory nor percentage: the whole GPU (:572-578)
        ({"gpu": "1", "gpumem": "4000"}, Request(1, 4000, 0, 0)),
        ({"gpu": "2", "gpumem-percentage": "25", "gpucores": "30"}, Request(2, 0, 25, 30)),
        ({"gpu": "1", "gpumem": "4000", "gpumem-percentage": "50"}, Request(1, 4000, 0, 0)),  # gpumem wins
        ({"gpu": "1", "gpumem": "0"}, Request(1, 0, 100, 0)),
        ({"gpu": "1", "gpumem-percentage": "0"}, Request(1, 0, 100, 0)),  # <= 0 ignored (:563-569)
        ({"gpu": "1", "gpumem-percentage": "150"}, Request(1, 0, 100, 0)),  # > 100 is 100 (:559-562)
        ({"gpu": "1", "gpucores": "150"}, Request(1, 0, 100, 100)),  # clamped, as Fit records it (:772-776)
    ],
)
def test_a_containers_resources_read_as_hamis(limits: dict[str, str], request_: Request) -> None:
    demand = HAMI.pod_demand(hami_pod(container(**limits)))
    assert demand.requests == (request_,)


def test_memory_factor_and_default_memory_apply_as_in_hami() -> None:
    """R10: defaultMemory is not multiplied by memoryFactor (:572-578), gpumem is (:544-548)."""
    hami = Hami(default_memory=2048, memory_factor=1024)
    assert hami.pod_demand(hami_pod(container(gpu="1"))).requests == (Request(1, 2048, 0, 0),)
    assert hami.pod_demand(hami_pod(container(gpu="1", gpumem="8"))).requests == (Request(1, 8192, 0, 0),)


def test_a_plain_memory_request_is_a_plain_demand_for_the_fast_path() -> None:
    demand = HAMI.pod_demand(hami_pod(container(gpu="2", gpumem="4000")))
    assert demand == Demand(8000, 2) and demand.plain and demand.per_device == 4000


def test_a_pod_on_several_gpus_is_never_refused_since_hamis_plugin_runs_it() -> None:
    """HAMi's device plugin gives each container every GPU its allocation lists (not gpushare's one GPU a pod)."""
    several = HAMI.pod_demand(hami_pod(container(gpu="4", gpumem="4000"), container("side", gpu="2")))
    assert several.devices == 6 and HAMI.refusal(several) is None


def test_memory_without_a_gpu_count_is_refused_naming_the_webhook() -> None:
    """R8: HAMi's webhook adds nvidia.com/gpu (nv/device.go:398-415); without it kubelet never calls the plugin."""
    with pytest.raises(InvalidPod, match=r"container main asks .* without nvidia\.com/gpu.*webhook"):
        HAMI.pod_demand(hami_pod(container(gpumem="4000")))


@pytest.mark.parametrize(("gpumem", "message"), [("1500m", "is not a whole number"), ("4Gi", "more MiB than HAMi")])
def test_an_unreadable_gpumem_is_a_clear_error_where_hami_drops_the_container(gpumem: str, message: str) -> None:
    """R9: HAMi silently treats `4Gi` or `1500m` as no GPU at all (:537-543)."""
    with pytest.raises(InvalidPod, match=rf"container main.*nvidia\.com/gpumem.*{message}"):
        HAMI.pod_demand(hami_pod(container(gpu="1", gpumem=gpumem)))


def test_init_and_app_containers_are_requests_of_their_own_init_first() -> None:
    """dev/devices.go:639-691 Resourcereqs: init containers first; a container without GPUs has no entry."""
    pod = hami_pod(
        container("sidecar"),
        container("main", gpu="1", gpumem="2000", gpucores="20"),
        init=(container("prep", gpu="1", gpumem="1000", gpucores="10"),),
    )
    assert HAMI.pod_demand(pod).requests == (Request(1, 1000, 0, 10, init=True), Request(1, 2000, 0, 20))


@pytest.mark.parametrize(
    ("annotations", "selectors"),
    [
        # NOTES.md §7 (dev/devices.go:693-738, nv/device.go:482-503)
        ({"nvidia.com/use-gputype": "a100"}, Selectors(use_models=("A100",))),
        ({"nvidia.com/use-gputype": "V100, H100"}, Selectors(use_models=("V100", "H100"))),
        ({"nvidia.com/nouse-gputype": " , "}, Selectors()),
        ({"nvidia.com/use-gpuuuid": "GPU-B, GPU-A"}, Selectors(use_uuids=("GPU-B", "GPU-A"))),
        ({"nvidia.com/nouse-gpuuuid": "GPU-A "}, Selectors(avoid_uuids=("GPU-A",))),
        ({"nvidia.com/numa-bind": "T"}, Selectors(numa_bind=True)),
        ({"nvidia.com/numa-bind": "yes"}, Selectors()),  # strconv.ParseBool: silently off
        ({"hami.io/gpu-scheduler-policy": "binpack, mutex"}, Selectors(exclusive=True, order=("binpack",))),
        ({"nvidia.com/vgpu-mode": "hami-core"}, Selectors(modes="hami-core")),
    ],
)
def test_selectors_read_as_hamis(annotations: dict[str, str], selectors: Selectors) -> None:
    assert HAMI.pod_demand(hami_pod(container(gpu="1", gpumem="1000"), **annotations)).selectors == selectors


def test_selectors_match_as_hamis() -> None:
    a100 = Device(0, 40960, model="NVIDIA A100-SXM4-40GB", uuid="GPU-A", mode="hami-core")
    assert Selectors(use_models=("A10",)).admits(a100)  # a substring: A10 matches an A100, as in HAMi
    assert not Selectors(avoid_models=("NVIDIA",)).admits(a100)
    assert not Selectors(use_uuids=("gpu-a",)).admits(a100)  # exact, case-sensitive
    assert not Selectors(modes="mig").admits(a100)


@pytest.mark.parametrize(
    ("annotation", "value", "strategy"),
    [
        ("hami.io/gpu-scheduler-policy", "spread", Strategy.SPREAD),
        ("hami.io/gpu-scheduler-policy", "binpack, mutex", Strategy.BINPACK),
        ("hami.io/node-scheduler-policy", "spread", Strategy.SPREAD),
    ],
)
def test_a_pods_own_policies_are_read(annotation: str, value: str, strategy: Strategy) -> None:
    demand = HAMI.pod_demand(hami_pod(container(gpu="1", gpumem="1000"), **{annotation: value}))
    assert strategy in (demand.device_strategy, demand.node_strategy) and not demand.plain


@pytest.mark.parametrize("value", ["Binpack", "binpack,topology", "best-fit"])
def test_a_word_that_is_no_policy_is_refused_where_hami_silently_spreads(value: str) -> None:
    """pkg/scheduler/policy/gpu_policy.go:85-126 at v2.10.0: a single unknown value sorts as spread, an unknown
    word of a chain is dropped; here the pod is refused with the word named, since a typo would move pods."""
    with pytest.raises(InvalidPod, match="is not one of binpack, spread, numa, mutex, topology-aware"):
        HAMI.pod_demand(hami_pod(container(gpu="1"), **{"hami.io/gpu-scheduler-policy": value}))


# --- allocations ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("containers", "text"),
    [
        # NOTES.md §4 P1-P3 (dev/devices.go:451-484 EncodeContainerDevices / EncodePodSingleDevice; ran)
        (((Grant(0, 4000, 30, "GPU-A"),),), "GPU-A,NVIDIA,4000,30:;"),
        (((Grant(1, 20480, 0, "GPU-B"), Grant(0, 20480, 0, "GPU-A")),), "GPU-B,NVIDIA,20480,0:GPU-A,NVIDIA,20480,0:;"),
        (
            ((Grant(0, 1000, 10, "GPU-A"),), (Grant(0, 2000, 20, "GPU-A"),)),
            "GPU-A,NVIDIA,1000,10:;GPU-A,NVIDIA,2000,20:;",
        ),
    ],
)
def test_allocations_encode_and_decode_as_hami(containers: tuple[tuple[Grant, ...], ...], text: str) -> None:
    assert encode(containers, {}) == text
    unresolved = tuple(tuple(Grant(-1, g.memory, g.cores, g.uuid) for g in grants) for grants in containers)
    assert decode(text) == unresolved


@pytest.mark.parametrize(
    "text",
    [
        "GPU-A,NVIDIA,1000,10:;;GPU-A,NVIDIA,2000,20:;",  # the positional layout (devices typed "NVIDIA")
        ";GPU-A,NVIDIA,1000,10:;GPU-A,NVIDIA,2000,20:;",
    ],
)
def test_empty_entries_of_gpu_less_containers_are_skipped(text: str) -> None:
    """dev/devices.go:529-556 keeps empty entries; the plugin pops the next non-empty one (plug/util.go:112-128)."""
    assert decode(text) == ((Grant(-1, 1000, 10, "GPU-A"),), (Grant(-1, 2000, 20, "GPU-A"),))


@pytest.mark.parametrize("text", [";;", ";;;;", ";GPU-B,NVIDIA,2000,20:;;"])
def test_what_the_plugin_erased_is_no_longer_to_allocate(text: str) -> None:
    """NOTES.md §6 (ran): Allocate's erase patch leaves `;;` and `;;;;`; what remains is still to allocate."""
    remaining = decode(text)
    assert remaining == (() if "GPU" not in text else ((Grant(-1, 2000, 20, "GPU-B"),),))


@pytest.mark.parametrize("text", ["GPU-A,NVIDIA,4Gi,10:;", "GPU-A,NVIDIA:;", "GPU-A,NVIDIA,9999999999999,0:;"])
def test_an_unreadable_allocation_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode(text)


def test_the_binding_carries_every_annotation_the_plugin_reads() -> None:
    """sch/scheduler.go:1124-1146 (filter) and :1031-1034 (bind); the plugin reads them in plug/server.go:747."""
    allocation = Allocation("u-p", "default/p", "gpu-1", ((Grant(0, 4000, 30, A),),))
    annotations = HAMI.allocation_annotations(allocation, (), 1787306400.5)
    assert annotations == {
        "hami.io/vgpu-node": "gpu-1",
        "hami.io/vgpu-time": "1787306400",
        TO_ALLOCATE: f"{A},NVIDIA,4000,30:;",
        ALLOCATED: f"{A},NVIDIA,4000,30:;",
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1787306400",
    }


def test_an_allocation_is_read_back_from_the_pod_for_recovery() -> None:
    """sch/scheduler.go:144-170: a pod counts by its vgpu-node annotation and its allocated devices."""
    pod = hami_pod(
        container("main", gpu="1", gpumem="2000", gpucores="20"),
        init=(container("prep", gpu="1", gpumem="1000", gpucores="10"),),
        **{
            "hami.io/vgpu-node": "gpu-1",
            "hami.io/vgpu-time": "1787306400",
            ALLOCATED: f"{A},NVIDIA,1000,10:;{A},NVIDIA,2000,20:;",
        },
    )
    recorded = HAMI.recorded(pod, HAMI.pod_demand(pod))
    assert (recorded.node, recorded.since) == ("gpu-1", 1787306400.0)
    assert recorded.allocation is not None and recorded.allocation.init_containers == 1
    (use,) = recorded.allocation.uses
    assert (use.uuid, use.memory, use.cores, use.slots) == (A, 2000, 20, 1), "the init container at its peak"


def test_a_failed_allocation_is_still_recorded() -> None:
    """The plugin sets bind-phase=failed when it cannot allocate (plug/util.go:407-414); HAMi's scheduler never
    reads bind-phase and counts the pod until it ends (sch/scheduler.go:144-153, 185-190): so do we."""
    pod = hami_pod(
        container(gpu="1", gpumem="2000"),
        **{"hami.io/vgpu-node": "gpu-1", "hami.io/bind-phase": "failed", ALLOCATED: f"{A},NVIDIA,2000,0:;"},
    )
    allocation = HAMI.recorded(pod, HAMI.pod_demand(pod)).allocation
    assert allocation is not None and [(use.uuid, use.memory) for use in allocation.uses] == [(A, 2000)]


def test_registration_json_round_trips_through_orjson() -> None:
    assert len(orjson.loads(E1)) == 2
