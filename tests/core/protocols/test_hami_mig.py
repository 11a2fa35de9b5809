"""HAMi's MIG formats (`protocols/hami_mig.py`) and a MIG node through the cache and the general fit.

HAMi paths at tag v2.10.0 (commit 4707fb02): `dev/` = pkg/device/, `nv/` = pkg/device/nvidia/, `sch/` =
pkg/scheduler/, `plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/. Expected values are those HAMi's
own tests assert, or what its code does by the lines cited.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance, MigProfile
from extender.core.placement.config import PolicyConfig, ask_of
from extender.core.placement.fit import Cause, Verdict
from extender.core.placement.measure import gpu_room
from extender.core.preemption import fits_after_eviction
from extender.core.protocols.hami import ALLOCATED, REGISTER, encode
from extender.core.protocols.hami_mig import MIG_ALLOCATIONS, decode_instances, encode_instances
from tests.builders import (
    HAMI,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_ledger,
    make_mig_node,
    placer_for,
)

# The registration of nv/device_test.go:2472 (`TestGetNodeDevices_MigProfilesFromNode`).
REGISTERED = (
    '[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","mode":"mig",'
    '"migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,"placements":[{"start":6,"size":1}]}]}]'
)


def node_with(register: str) -> dict[str, Any]:
    node = make_hami_node("gpu-1")
    node["metadata"]["annotations"][REGISTER] = register
    return node


def mig_pod(name: str, mem: int, **annotations: str) -> dict[str, Any]:
    return make_hami_pod(name, mem=mem, **{"nvidia.com/vgpu-mode": "mig", **annotations})


def bound_mig_pod(name: str, node: str, grants: tuple[Grant, ...]) -> dict[str, Any]:
    """A pod HAMi bound to MIG instances: its device entries and its reservations, as the binding wrote them."""
    pod = make_hami_pod(name, gpus=len(grants), mem=grants[0].memory)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    pod["metadata"]["annotations"] |= {
        "hami.io/vgpu-node": node,
        ALLOCATED: encode((grants,), {}),
        MIG_ALLOCATIONS: encode_instances((grants,), {}),
        "hami.io/bind-phase": "success",
    }
    return pod


# --- the registration ------------------------------------------------------------------------------------------


def test_a_mig_gpu_reads_with_its_profiles_and_placements() -> None:
    """nv/device_test.go:2466-2500: mode `mig`, the profile with its one placement."""
    (device,) = HAMI.node_devices(node_with(REGISTERED)).devices
    assert device.mig and (device.capacity, device.cores, device.slots) == (40960, 100, 7)
    assert device.profiles == (MigProfile("1g.5gb", 5120, 14, 1, ((6, 1),)),)


@pytest.mark.parametrize(
    "profiles",
    [
        '{"name":"1g.5gb"}',  # not an array
        '[{"name":"1g.5gb","memoryMB":"5120"}]',  # a string where Go wants int32
        '[{"name":"1g.5gb","memoryMB":5120,"placements":[{"start":-1,"size":1}]}]',  # uint32
        '[{"name":"1g.5gb","memoryMB":5120,"placements":{"start":0,"size":1}}]',
        "[" + ",".join(['{"name":"x"}'] * 65) + "]",  # more profiles than any GPU has
    ],
)
def test_migprofiles_go_cannot_decode_leave_the_node_unreadable(profiles: str) -> None:
    """Go's json.Unmarshal fails the whole registration on a wrong type (nv/device.go:307-311)."""
    register = REGISTERED.replace(REGISTERED[REGISTERED.index('[{"name"') : -2], profiles)
    found = HAMI.node_devices(node_with(register))
    assert found.devices == () and "unreadable" in found.unreadable


# --- the reservation ------------------------------------------------------------------------------------------


def test_the_reservation_is_written_as_hamis_encoder_writes_it() -> None:
    """`TestEncodeDecodeMigAllocations` (nv/mig_profiles_test.go:36-59): one 1g.5gb at (6, 1) on GPU-a, container
    0, device 0; Go marshals the fields in declaration order and leaves out the empty runtime identity
    (nv/mig_allocations.go:37-48)."""
    grant = Grant(0, 5120, 14, "GPU-a", MigInstance("1g.5gb", 6, 1))
    assert encode_instances(((grant,),), {}) == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}}]'
    )
    assert encode_instances(((Grant(0, 5120, 14, "GPU-a"),),), {}) == ""


def test_container_index_is_the_entrys_and_device_index_the_gpus_in_it() -> None:
    """containerIndex is the container's entry in the device annotation (its position among the pod's GPU
    containers, init first), deviceIndex the GPU's in the entry: the plugin resolves a container from its entry's
    position (`popNextContainerDevices`, plug/util.go:106-128) and matches reservations to it by that index
    (plug/util.go:324-333); HAMi's `EncodeMigAllocations` numbers the same way (nv/mig_allocations.go:48-60)."""
    first = Grant(0, 5120, 14, "GPU-a", MigInstance("1g.5gb", 6, 1))
    second = Grant(1, 5120, 14, "GPU-b", MigInstance("1g.5gb", 6, 1))
    other = Grant(0, 10240, 28, "GPU-a", MigInstance("2g.10gb", 0, 2))
    listed = orjson.loads(encode_instances(((first, second), (Grant(1, 100, 0, "GPU-b"),), (other,)), {}))
    assert [(entry["containerIndex"], entry["deviceIndex"], entry["gpuUUID"]) for entry in listed] == [
        (0, 0, "GPU-a"),
        (0, 1, "GPU-b"),
        (2, 0, "GPU-a"),
    ]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (  # nv/mig_profiles_test.go:61-66
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
            '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]',
            "duplicate",
        ),
        (  # nv/mig_profiles_test.go:82-87
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
            '"migUUID":"MIG-a"}]',
            "partial runtime identity",
        ),
        ('[{"profile":"1g.5gb"}]', "incomplete"),  # dev/pod_test.go:404: no GPU, no placement
        ('[{"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":0}}]', "incomplete"),
        ("{}", "array"),
        ("[" + ",".join(["{}"] * 5000) + "]", "array"),  # more than any pod could hold
    ],
)
def test_reservations_hamis_decoder_refuses_are_refused(raw: str, error: str) -> None:
    """`DecodeMigAllocations` (nv/mig_allocations.go:79-112)."""
    with pytest.raises(ValueError, match=error):
        decode_instances(raw)


def test_a_reservation_with_its_runtime_identity_decodes() -> None:
    """nv/mig_profiles_test.go:68-80: the plugin's migUUID, gpuInstanceID 4, computeInstanceID 0 are complete."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
        '"migUUID":"MIG-a","gpuInstanceID":4,"computeInstanceID":0}]'
    )
    assert decode_instances(raw) == [("GPU-a", MigInstance("2g.10gb", 0, 2))]


def test_an_allocation_read_back_holds_its_instances() -> None:
    """After a restart the instances are counted again, matched to the pod's GPUs in order (sch/scheduler.go:
    788-797), and the annotations written from them are the same."""
    grant = Grant(0, 10240, 28, "GPU-mig-1-0", MigInstance("2g.10gb", 2, 2))
    pod = bound_mig_pod("p", "mig-1", (grant,))
    recorded = HAMI.recorded(pod, HAMI.pod_demand(pod))
    assert recorded.allocation is not None
    assert recorded.allocation.containers == ((Grant(-1, 10240, 28, "GPU-mig-1-0", MigInstance("2g.10gb", 2, 2)),),)
    written = HAMI.allocation_annotations(Allocation("u", "default/p", "mig-1", ((grant,),)), (), 0.0)
    assert written[MIG_ALLOCATIONS] == pod["metadata"]["annotations"][MIG_ALLOCATIONS]


# --- a MIG node in the cache and the fit ------------------------------------------------------------------------


def test_a_mig_gpu_offers_the_largest_profile_it_can_still_place() -> None:
    """Three 2g.10gb held leave a 1g.5gb (nv/mig_capability_test.go:52-69): the GPU's free is 5,120 MiB, not the
    10,240 its memory would say."""
    pods = tuple(
        bound_mig_pod(f"p{start}", "mig-1", (Grant(0, 10240, 28, "GPU-mig-1-0", MigInstance("2g.10gb", start, 2)),))
        for start in (0, 2, 4)
    )
    state = make_hami_cluster(make_mig_node(), pods=pods).nodes["mig-1"]
    assert state.used == [30720] and state.occupied == [((0, 2), (2, 2), (4, 2))]
    assert state.free == [5120] and state.fit_free == 5120


def test_a_pod_too_large_for_the_free_slices_is_refused_in_words() -> None:
    """`CardMigTopologyInfeasible` (nv/device.go:814-823), said as a person reads it."""
    pods = tuple(
        bound_mig_pod(f"p{start}", "mig-1", (Grant(0, 10240, 28, "GPU-mig-1-0", MigInstance("2g.10gb", start, 2)),))
        for start in (0, 2, 4)
    )
    placer = placer_for(make_hami_cluster(make_mig_node(), pods=pods))
    judgement = placer.judge(HAMI.pod_demand(mig_pod("big", 10000)), placer.cache.nodes["mig-1"])
    assert judgement.verdict is Verdict.FAILED and judgement.cause is Cause.SLICES
    assert judgement.reason == "needs 10000 MiB on a MIG GPU; the free slices of GPU 0 allow 1g.5gb at most"


def test_a_pod_placed_on_a_mig_gpu_gets_an_instance_and_its_reservation() -> None:
    """The choice records the profile's memory and compute (nv/device.go:645-664) and the annotations carry the
    reservation beside the device entries, in the Binding (nv/device.go:505-518)."""
    cluster = make_hami_cluster(make_mig_node())
    placer = placer_for(cluster)
    pod = mig_pod("p", 9000)
    placed = placer.choose(HAMI.pod_demand(pod), cluster.nodes["mig-1"])
    assert placed is not None
    (grant,) = placed.containers[0]
    assert (grant.memory, grant.cores, grant.instance) == (10240, 28, MigInstance("2g.10gb", 0, 2))
    allocation = Allocation("uid-p", "default/p", "mig-1", placed.containers)
    written = HAMI.allocation_annotations(allocation, cluster.nodes["mig-1"].devices, 0.0)
    assert written[ALLOCATED] == "GPU-mig-1-0,NVIDIA,10240,28:;"
    assert orjson.loads(written[MIG_ALLOCATIONS]) == [
        {"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-mig-1-0", "profile": "2g.10gb",
         "placement": {"start": 0, "size": 2}}
    ]  # fmt: skip


def test_containers_of_one_pod_get_instances_that_do_not_overlap_and_name_their_entry() -> None:
    """Two GPU containers behind a sidecar and an init container on one MIG GPU: the app containers' instances
    overlap neither each other (HAMi adds each app container's instance to the GPU's before the next,
    nv/device.go:657) nor the init container's, but for the one the first takes from it (the same size: HAMi
    places both against the GPU without the init container, sch/score.go:226-286, and its plugin gives the second
    the instance made for the first, plug/migmgr.go:339-343); the reservations name the containers' entries 0, 1,
    2 (not their places in the pod, 0, 2, 3: the plugin would then find none for the second, plug/util.go:
    329-333)."""
    cluster = make_hami_cluster(make_mig_node())
    pod = make_hami_pod("p", mem=5000, **{"nvidia.com/vgpu-mode": "mig"})
    main = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{"name": "sidecar"}, main, {**main, "name": "second"}]
    pod["spec"]["initContainers"] = [{**main, "name": "prep"}]
    placed = placer_for(cluster).choose(HAMI.pod_demand(pod), cluster.nodes["mig-1"])
    assert placed is not None
    instances = [grant.instance for grants in placed.containers for grant in grants]
    written = orjson.loads(encode_instances(placed.containers, {}))
    assert [entry["containerIndex"] for entry in written] == [0, 1, 2]
    prep, main_, second = instances
    assert prep == main_ and prep is not None
    spans = sorted((instance.start, instance.size) for instance in (main_, second) if instance)
    assert all(start + size <= after for (start, size), (after, _) in itertools.pairwise(spans))


def test_a_plain_pod_on_a_mig_node_is_placed_by_instances_not_memory() -> None:
    """A pod asking memory alone is judged from the node summaries elsewhere; on a MIG node the general fit
    chooses, so it gets an instance too."""
    cluster = make_hami_cluster(make_mig_node())
    demand = HAMI.pod_demand(make_hami_pod("p", mem=4000))
    assert demand.plain
    placed = placer_for(cluster).choose(demand, cluster.nodes["mig-1"])
    assert placed is not None and placed.containers[0][0].instance == MigInstance("1g.5gb", 6, 1)


def test_a_mig_pod_is_kept_off_hami_core_gpus_by_its_mode() -> None:
    """`nvidia.com/vgpu-mode: mig` excludes GPUs whose mode it does not contain (nv/device.go:493-503)."""
    placer = placer_for(make_hami_cluster(make_hami_node("core-1")))
    judgement = placer.judge(HAMI.pod_demand(mig_pod("p", 1000)), placer.cache.nodes["core-1"])
    assert judgement.verdict is Verdict.UNRESOLVABLE and judgement.cause is Cause.NO_MATCH


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (  # a pod on a MIG GPU without a reservation (sch/scheduler.go:799-802)
            lambda: bound_mig_pod("old", "mig-1", (Grant(0, 5120, 14, "GPU-mig-1-0"),)),
            "without a MIG instance reserved",
        ),
        (  # a reservation naming a GPU the node does not have (sch/scheduler.go:832-838)
            lambda: bound_mig_pod("gone", "mig-1", (Grant(0, 5120, 14, "GPU-elsewhere", MigInstance("1g.5gb", 6, 1)),)),
            "not on this node",
        ),
    ],
)
def test_a_mig_gpu_whose_instances_cannot_be_known_takes_no_new_pod(pod: Any, why: str) -> None:
    """HAMi marks such a GPU unhealthy; here it takes no new pod, and the refusal says why."""
    cluster = make_hami_cluster(make_mig_node(), pods=(pod(),))
    state = cluster.nodes["mig-1"]
    assert state.free == [0] and why in state.blocked[0]
    judgement = placer_for(cluster).judge(HAMI.pod_demand(mig_pod("p", 1000)), state)
    assert judgement.cause is Cause.SLICES and why in judgement.reason


def test_an_instance_on_a_hami_core_gpu_keeps_new_pods_off_it() -> None:
    """sch/scheduler.go:788-792: a MIG reservation on a hami-core GPU marks it unhealthy."""
    pod = bound_mig_pod("odd", "core-1", (Grant(0, 5120, 14, "GPU-core-1-0", MigInstance("1g.5gb", 6, 1)),))
    state = make_hami_cluster(make_hami_node("core-1"), pods=(pod,)).nodes["core-1"]
    assert state.free[0] == 0 and "not in MIG mode" in state.blocked[0]
    assert state.free[1] == 40960


def test_the_ledger_never_holds_two_instances_in_one_place() -> None:
    """The last check before a decision (`Ledger._refusal`): an instance overlapping one held, one at a placement
    its profile does not have, or a grant on a MIG GPU without an instance (the plugin would fail its Allocate,
    plug/util.go:331-333) is refused."""
    held = bound_mig_pod("p", "mig-1", (Grant(0, 20480, 42, "GPU-mig-1-0", MigInstance("3g.20gb", 4, 4)),))
    cluster = make_hami_cluster(make_mig_node(), pods=(held,))
    ledger = make_ledger(cluster)

    def allocation(name: str, grant: Grant) -> Allocation:
        return Allocation(f"uid-{name}", f"default/{name}", "mig-1", ((grant,),))

    assert not ledger.assume(allocation("a", Grant(0, 5120, 14, "GPU-mig-1-0", MigInstance("1g.5gb", 6, 1))), 0)
    assert not ledger.assume(allocation("b", Grant(0, 5120, 14, "GPU-mig-1-0", MigInstance("1g.5gb", 1, 2))), 0)
    assert not ledger.assume(allocation("c", Grant(0, 5120, 14, "GPU-mig-1-0")), 0)
    assert ledger.assume(allocation("d", Grant(0, 5120, 14, "GPU-mig-1-0", MigInstance("1g.5gb", 3, 1))), 0)
    assert cluster.overcommitted() == []


def test_overlapping_instances_from_the_api_are_reported_as_overcommitted() -> None:
    """What another scheduler wrote is counted as written, and the invariant check names the GPU."""
    pods = tuple(
        bound_mig_pod(name, "mig-1", (Grant(0, 5120, 14, "GPU-mig-1-0", MigInstance("1g.5gb", 6, 1)),))
        for name in ("a", "b")
    )
    cluster = make_hami_cluster(make_mig_node(), pods=pods)
    assert cluster.overcommitted() == ["mig-1 GPU 0: MIG instances overlap at slice 6"]


def test_the_measure_sees_a_mig_gpus_free_slices_and_what_they_can_still_hold() -> None:
    """`measure.gpu_room` of a MIG GPU: its free slices are what is wasted if no pod can use them; the largest
    instance still placeable is what a pod can take (not the memory left, which three 2g.10gb leave at 10 GiB
    with room for a 1g.5gb only); compute is not its limit (-1)."""
    pods = tuple(
        bound_mig_pod(f"p{start}", "mig-1", (Grant(0, 10240, 28, "GPU-mig-1-0", MigInstance("2g.10gb", start, 2)),))
        for start in (0, 2, 4)
    )
    state = make_hami_cluster(make_mig_node(), pods=pods).nodes["mig-1"]
    assert gpu_room(state, 0) == (10240, 40960, -1, "NVIDIA-A100-SXM4-40GB", 5120)  # 2 of 8 slices free
    assert gpu_room(state, 0, 5000) == (5120, 40960, -1, "NVIDIA-A100-SXM4-40GB", 0)  # slice 7 alone: no profile


def test_the_policy_fills_the_slice_that_no_larger_profile_could_use() -> None:
    """A 1g pod, two MIG nodes: one empty, one whose last free slice only a 1g can use. The fragmentation
    policy (as shipped) passes the second alone: its slice is wasted otherwise, while the empty GPU keeps
    room for a 3g.20gb."""
    full = (
        bound_mig_pod("big", "mig-2", (Grant(0, 20480, 42, "GPU-mig-2-0", MigInstance("3g.20gb", 0, 4)),)),
        bound_mig_pod("mid", "mig-2", (Grant(0, 10240, 28, "GPU-mig-2-0", MigInstance("2g.10gb", 4, 2)),)),
    )
    cluster = make_hami_cluster(make_mig_node("mig-1"), make_mig_node("mig-2"), pods=full)
    placer = placer_for(cluster, PolicyConfig())
    demand = HAMI.pod_demand(mig_pod("small", 4000))
    outcome = placer.filter(
        demand, ["mig-1", "mig-2"], cluster.nodes, "default/small", ask_of(mig_pod("small", 4000), demand)
    )
    assert outcome.passed == ["mig-2"]
    placed = placer.choose(demand, cluster.nodes["mig-2"])
    assert placed is not None and placed.containers[0][0].instance == MigInstance("1g.5gb", 6, 1)


# --- HAMi's real profile cores, preemption, malformed profiles -------------------------------------------------

REAL_1G = {"name": "1g.5gb", "memoryMB": 4864, "core": 15, "sliceCount": 1,
           "placements": [{"start": start, "size": 1} for start in range(7)]}  # fmt: skip
"""A 1g.5gb as HAMi's device plugin registers it (pkg/device/devices_test.go:384-397: 4864 MiB, core 15: its
SMs x 100 / the largest profile's, rounded up, plugin/register.go:242-244), so seven of them count 105 %."""


def test_seven_instances_of_a_profile_whose_cores_sum_past_100_all_fit_and_reserve() -> None:
    """HAMi checks the compute a container asks (here none) against what the GPU has left (nv/device.go:794-810),
    and records each instance's profile cores (nv/device.go:651-652): with six 1g at 15 % held (90 %) a seventh
    asking none passes, and seven make 105 %; the GPU is full by its slices and its count. Filter and bind agree
    on every one (they once disagreed from the sixth)."""
    cluster = make_hami_cluster(make_mig_node(profiles=[REAL_1G]))
    placer, ledger = placer_for(cluster), make_ledger(cluster)
    for number in range(7):
        demand = HAMI.pod_demand(mig_pod(f"p{number}", 4000))
        assert placer.judge(demand, cluster.nodes["mig-1"]).verdict is Verdict.FITS, number
        placed = placer.choose(demand, cluster.nodes["mig-1"])
        assert placed is not None
        assert ledger.assume(Allocation(f"u{number}", f"default/p{number}", "mig-1", placed.containers), 0), number
    state = cluster.nodes["mig-1"]
    assert state.used_cores == [105] and state.free == [0] and cluster.overcommitted() == []


def test_evicting_the_pods_of_a_mig_gpu_frees_their_slices_for_a_larger_instance() -> None:
    """Preemption gives back the victims' instances too (`preemption._freed`): six 1g.5gb out, a 3g.20gb fits."""
    pods = tuple(
        bound_mig_pod(f"v{start}", "mig-1", (Grant(0, 5120, 14, "GPU-mig-1-0", MigInstance("1g.5gb", start, 1)),))
        for start in range(6)
    )
    cluster = make_hami_cluster(make_mig_node(), pods=pods)
    state = cluster.nodes["mig-1"]
    demand = HAMI.pod_demand(mig_pod("big", 20000))
    victims = [hold.allocation for hold in state.holds.values()]
    assert not fits_after_eviction(demand, state, victims[:2])
    assert fits_after_eviction(demand, state, victims)


@pytest.mark.parametrize(
    ("profiles", "why"),
    [
        ('[{"name":"","memoryMB":5120,"placements":[{"start":0,"size":1}]}]', "name is empty"),
        ('[{"name":"1g.5gb","memoryMB":5120,"placements":[{"start":6,"size":0}]}]', "not within the GPU's slices"),
        ('[{"name":"1g.5gb","memoryMB":5120,"placements":[{"start":64,"size":1}]}]', "not within the GPU's slices"),
    ],
)
def test_profiles_that_would_give_instances_hami_cannot_make_leave_the_node_unreadable(profiles: str, why: str) -> None:
    """A size-0 placement overlaps nothing: it would be given to every pod, and HAMi's decoder refuses it
    (nv/mig_allocations.go:89); a nameless profile cannot be named in a reservation (nv/mig_allocations.go:
    57, :89). A repeated name is read as HAMi reads it (test_hami_rules_v2100.py)."""
    register = REGISTERED.replace(REGISTERED[REGISTERED.index('[{"name"') : -2], profiles)
    found = HAMI.node_devices(node_with(register))
    assert found.devices == () and why in found.unreadable
