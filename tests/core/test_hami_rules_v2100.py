"""HAMi v2.10.0's rules where its device plugin or its users depend on them, each case built from HAMi's code.

HAMi paths at tag v2.10.0 (commit 4707fb02): `dev/` = pkg/device/, `nv/` = pkg/device/nvidia/, `sch/` =
pkg/scheduler/, `plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/. Where ours deliberately differs
(the MIG placement that cuts least, the node choice that sees NVLink links) `docs/protocols/hami.md` says why.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from extender.core.devices import Device, Strategy
from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance, MigProfile
from extender.core.placement.fit import Cause, Placement, Usage, Verdict, place
from extender.core.protocols.hami import ALLOCATED, GPU_POLICY, NUMA_BIND, REGISTER, encode
from extender.core.protocols.hami_mig import MIG_ALLOCATIONS, encode_instances
from tests.builders import (
    HAMI,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_ledger,
    make_mig_node,
    placer_for,
)


def bound(name: str, node: str, grants: tuple[Grant, ...], phase: str, bind_phase: str) -> dict[str, Any]:
    """A pod bound with its allocation (and MIG reservations) as our Binding writes them, then as the plugin and
    kubelet left it: `bind_phase` from Allocate, `phase` from kubelet."""
    pod = make_hami_pod(name, gpus=len(grants), mem=grants[0].memory)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = phase
    pod["metadata"]["annotations"] |= {
        "hami.io/vgpu-node": node,
        "hami.io/vgpu-time": "1800000000",
        ALLOCATED: encode((grants,), {}),
        "hami.io/bind-phase": bind_phase,
    }
    reservations = encode_instances((grants,), {})
    if reservations:
        pod["metadata"]["annotations"][MIG_ALLOCATIONS] = reservations
    return pod


def three_g(start: int) -> Grant:
    return Grant(0, 20480, 42, "GPU-mig-1-0", MigInstance("3g.20gb", start, 4))


# --- bind-phase failed: counted until the pod ends ---------------------------------------------------------------


def test_a_pod_whose_allocate_failed_keeps_its_mig_slices_until_it_ends() -> None:
    """The race: the plugin failed a pod's Allocate (`bind-phase: failed`, plug/util.go:407-414) while kubelet has
    not failed the pod yet. HAMi's scheduler never reads bind-phase and counts the pod until it is Succeeded or
    Failed (sch/scheduler.go:144-153, 185-190); its plugin keeps the pod's MIG instance live as long as it is not
    terminal (`activeMigAllocationKeys`, plug/server.go:358-378), so another instance on those slices would fail
    that pod's Allocate (`EnsureAllocation` creates the reserved placement or fails, plug/migmgr.go:332-383).
    The next pod asking those slices waits until kubelet fails the first, then takes them."""
    running = bound("running", "mig-1", (three_g(0),), "Running", "success")
    doomed = bound("doomed", "mig-1", (three_g(4),), "Pending", "allocating")
    cluster = make_hami_cluster(make_mig_node(), pods=(running, doomed))
    placer, ledger = placer_for(cluster), make_ledger(cluster)
    heir = HAMI.pod_demand(make_hami_pod("heir", mem=20000, **{"nvidia.com/vgpu-mode": "mig"}))

    doomed["metadata"]["annotations"]["hami.io/bind-phase"] = "failed"
    cluster.apply_pod(doomed)
    state = cluster.nodes["mig-1"]
    assert state.occupied == [((0, 4), (4, 4))], "the failed pod's instance is still counted"
    judgement = placer.judge(heir, state)
    assert judgement.verdict is Verdict.FAILED, "its slices (and the memory HAMi records for them) are taken"
    taken = Allocation("uid-heir", "default/heir", "mig-1", ((three_g(4),),))
    assert ledger.reserve(taken) is not None, "the bind refuses those slices too"

    ended = copy.deepcopy(doomed)
    ended["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
    cluster.apply_pod(ended)
    assert state.occupied == [((0, 4),)]
    placed = placer.choose(heir, state)
    assert placed is not None and placed.containers[0][0].instance == MigInstance("3g.20gb", 4, 4)
    assert ledger.reserve(Allocation("uid-heir", "default/heir", "mig-1", placed.containers)) is None
    assert cluster.overcommitted() == []


def test_a_whole_gpu_whose_allocate_failed_stays_taken_until_the_pod_ends() -> None:
    """The same rule on a hami-core GPU: a pod holding a GPU whole (100 % compute) keeps it while Pending."""
    grant = Grant(0, 40960, 100, "GPU-gpu-1-0")
    doomed = bound("doomed", "gpu-1", (grant,), "Pending", "failed")
    cluster = make_hami_cluster(make_hami_node("gpu-1", gpus=1), pods=(doomed,))
    placer = placer_for(cluster)
    heir = HAMI.pod_demand(make_hami_pod("heir", mem=1000))
    assert cluster.nodes["gpu-1"].used == [40960]
    assert placer.judge(heir, cluster.nodes["gpu-1"]).verdict is Verdict.FAILED
    cluster.apply_pod(bound("doomed", "gpu-1", (grant,), "Failed", "failed"))
    assert cluster.nodes["gpu-1"].used == [0]
    assert placer.judge(heir, cluster.nodes["gpu-1"]).verdict is Verdict.FITS


# --- a MIG profile listed twice ---------------------------------------------------------------------------------

TWICE = [
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
     "placements": [{"start": start, "size": 1} for start in range(7)]},
    {"name": "3g.20gb", "memoryMB": 20480, "core": 42, "sliceCount": 3,
     "placements": [{"start": start, "size": 4} for start in (0, 4)]},
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
     "placements": [{"start": start, "size": 1} for start in range(7)]},
]  # fmt: skip
"""What the plugin registers when `migProfileAllowlist` names 1g.5gb twice: `discoverMigProfiles` appends each
name it is given (plug/register.go:218-249)."""


def test_a_gpu_whose_registration_lists_a_profile_twice_is_used() -> None:
    """HAMi decodes the registration (dev/devices.go:445) and keeps the GPU: the repeat is one more candidate of
    the same size (`selectMigCandidate`, nv/device.go:621-639), which changes no choice. So the node is read and
    its GPU placed on, as HAMi places: a 1g.5gb at its highest free slice first (nv/mig_topology.go:26-39)."""
    found = HAMI.node_devices(make_mig_node(profiles=TWICE))
    assert found.unreadable == ""
    (device,) = found.devices
    assert [profile.name for profile in device.profiles] == ["1g.5gb", "3g.20gb"]
    cluster = make_hami_cluster(make_mig_node(profiles=TWICE))
    placed = placer_for(cluster).choose(HAMI.pod_demand(make_hami_pod("p", mem=4000)), cluster.nodes["mig-1"])
    assert placed is not None and placed.containers[0][0].instance == MigInstance("1g.5gb", 6, 1)


def test_a_repeated_profile_name_takes_the_placements_of_its_first_entry() -> None:
    """HAMi finds a candidate's placements by its name, so the first entry of that name's (`findMigProfile` in
    `selectMigPlacement`, nv/mig_topology.go:41-63), while the candidate's own memory and core are what it
    records (nv/device.go:645-656). A hand-written repeat with more memory and other placements: its memory, the
    first's placements."""
    repeat = {"name": "1g.5gb", "memoryMB": 9000, "core": 20, "sliceCount": 1, "placements": [{"start": 0, "size": 1}]}
    first = {**TWICE[0], "placements": [{"start": 6, "size": 1}]}
    (device,) = HAMI.node_devices(make_mig_node(profiles=[first, repeat])).devices
    assert device.profiles == (
        MigProfile("1g.5gb", 5120, 14, 1, ((6, 1),)),
        MigProfile("1g.5gb", 9000, 20, 1, ((6, 1),)),
    )
    cluster = make_hami_cluster(make_mig_node(profiles=[first, repeat]))
    placed = placer_for(cluster).choose(HAMI.pod_demand(make_hami_pod("p", mem=8000)), cluster.nodes["mig-1"])
    assert placed is not None
    (grant,) = placed.containers[0]
    assert (grant.memory, grant.cores, grant.instance) == (9000, 20, MigInstance("1g.5gb", 6, 1))


# --- numa-bind and the GPU order --------------------------------------------------------------------------------


def numa_gpus(*numa: int) -> tuple[Device, ...]:
    return tuple(
        Device(index, 8192, cores=100, slots=10, uuid=f"GPU-{index}", numa=node) for index, node in enumerate(numa)
    )


def given(devices: tuple[Device, ...], usage: Usage, count: int, strategy: Strategy, **annotations: str) -> list[int]:
    """The GPU indexes the general fit gives a pod asking `count` GPUs with these annotations."""
    demand = HAMI.pod_demand(make_hami_pod("p", gpus=count, mem=100, cores=10, **annotations))
    placed = place(demand, devices, usage, strategy, "MiB")
    assert isinstance(placed, Placement), placed
    return [grant.index for grant in placed.containers[0]]


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("binpack,spread", ("numa", "binpack", "spread")),  # policy/gpu_policy_test.go:364-372
        ("spread,numa", ("numa", "spread")),  # policy/gpu_policy_test.go:374-382
        ("numa,binpack", ("numa", "binpack")),
    ],
)
def test_numa_bind_makes_numa_the_first_key_of_a_chain(policy: str, order: tuple[str, ...]) -> None:
    """`lessByChain` puts numa first when the pod asks numa-bind, so that Fit's run of one NUMA node's GPUs is not
    broken (policy/gpu_policy.go:137-147); without numa-bind the chain is as written."""
    bound = HAMI.pod_demand(make_hami_pod("p", **{GPU_POLICY: policy, NUMA_BIND: "true"}))
    assert bound.selectors.order == order
    free = HAMI.pod_demand(make_hami_pod("p", **{GPU_POLICY: policy}))
    assert free.selectors.order[0] == policy.split(",")[0]


def test_a_numa_bound_chain_walks_the_highest_numa_node_first() -> None:
    """policy/gpu_policy_test.go:364-372 on a node: `binpack,spread` with numa-bind, a full GPU on NUMA 0 and an
    emptier one on NUMA 1. NUMA sorts first (ascending) and Fit walks from the end (nv/device.go:727): NUMA 1's
    GPU, though binpack alone would take the fuller one."""
    devices = numa_gpus(0, 1)
    usage = Usage([6000, 400], [90, 5], [5, 1])
    assert given(devices, usage, 1, Strategy.SPREAD, **{GPU_POLICY: "binpack,spread", NUMA_BIND: "true"}) == [1]
    assert given(devices, usage, 1, Strategy.SPREAD, **{GPU_POLICY: "binpack,spread"}) == [0]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (Strategy.BINPACK, [0]),  # policy/gpu_policy_test.go:216-224: NUMA 1 sorts first, so Fit takes NUMA 0's
        (Strategy.SPREAD, [1]),  # policy/gpu_policy_test.go:236-244: NUMA 0 sorts first, so Fit takes NUMA 1's
    ],
)
def test_numa_bind_walks_numa_nodes_lowest_first_under_binpack_and_highest_under_spread(
    strategy: Strategy, expected: list[int]
) -> None:
    """With numa-bind and one policy, HAMi sorts by NUMA node first (policy/gpu_policy.go:100-113) and Fit walks
    from the end (nv/device.go:727): binpack the lowest NUMA node first, spread the highest, whatever the fill.
    GPU 0 (NUMA 0) is empty, GPU 1 (NUMA 1) half full: without numa-bind binpack takes GPU 1 and spread GPU 0."""
    devices = numa_gpus(0, 1)
    usage = Usage([0, 4096], [0, 50], [0, 1])
    assert given(devices, usage, 1, strategy, **{NUMA_BIND: "true"}) == expected
    assert given(devices, usage, 1, strategy) == [1 - expected[0]]


def test_numa_bind_keeps_a_numa_nodes_gpus_together() -> None:
    """`TestNumaBindSortPreservesAffinity` (sch/numa_sort_test.go:61-90): A (NUMA 0, fill 5), B (NUMA 0, fill 1),
    C (NUMA 1, fill 3), spread, two GPUs with numa-bind: A and B."""
    devices = numa_gpus(0, 0, 1)
    usage = Usage([2000, 400, 1200], [0, 0, 0], [0, 0, 0])
    assert sorted(given(devices, usage, 2, Strategy.SPREAD, **{NUMA_BIND: "true"})) == [0, 1]


def test_a_chains_ties_go_to_the_highest_gpu_index() -> None:
    """policy/gpu_policy_test.go:355-362: with every chained key equal, `lessByChain` sorts by index ascending
    (policy/gpu_policy.go:165-166) and Fit walks from the end: the highest index first. Without a chain, ties go
    to the lowest index here (HAMi's go to the last in its registration order, which its plugin reorders)."""
    devices = numa_gpus(0, 0, 0)
    usage = Usage([0, 0, 0], [0, 0, 0], [0, 0, 0])
    assert given(devices, usage, 1, Strategy.BINPACK, **{GPU_POLICY: "binpack,numa"}) == [2]
    assert given(devices, usage, 2, Strategy.BINPACK, **{GPU_POLICY: "spread,numa"}) == [2, 1]
    assert given(devices, usage, 1, Strategy.BINPACK, **{GPU_POLICY: "binpack"}) == [0]


def test_topology_aware_with_numa_bind_takes_the_last_numa_node_walked() -> None:
    """nv/device.go:746-754 and 850-869: with topology-aware, Fit collects every candidate of a NUMA node, starts
    afresh at the next, and judges the last one walked. Under binpack it walks NUMA 0 then NUMA 1: two GPUs on
    NUMA 1."""
    devices = numa_gpus(0, 0, 1, 1)
    usage = Usage([0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0])
    asked = {NUMA_BIND: "true", GPU_POLICY: "topology-aware"}
    assert sorted(given(devices, usage, 2, Strategy.BINPACK, **asked)) == [2, 3]
    assert sorted(given(devices, usage, 2, Strategy.SPREAD, **asked)) == [0, 1]


def test_topology_aware_with_numa_bind_is_placed_where_hami_would_refuse_it() -> None:
    """Kept ours: when the last NUMA node walked has too few GPUs that serve, HAMi refuses the container
    (nv/device.go:850-875) though another NUMA node has enough; here it gets that one (the pod would otherwise
    wait for GPUs of the last NUMA node to free, which no user asks for)."""
    devices = numa_gpus(0, 0, 1, 1)
    usage = Usage([0, 0, 8192, 0], [0, 0, 100, 0], [0, 0, 1, 0])
    asked = {NUMA_BIND: "true", GPU_POLICY: "topology-aware"}
    assert sorted(given(devices, usage, 2, Strategy.BINPACK, **asked)) == [0, 1]


# --- MIG: HAMi's compute rules ----------------------------------------------------------------------------------


def mig_held(*grants: Grant) -> tuple[dict[str, Any], ...]:
    return tuple(
        bound(f"held-{number}", "mig-1", (grant,), "Running", "success") for number, grant in enumerate(grants)
    )


def one_g(start: int, cores: int = 14) -> Grant:
    return Grant(0, 5120, cores, "GPU-mig-1-0", MigInstance("1g.5gb", start, 1))


def test_a_mig_container_asking_compute_is_refused_beyond_what_the_gpu_has_left() -> None:
    """Fit checks the compute a container asks against the GPU's left (nv/device.go:794-798) before the MIG rule
    (:811-827): five 1g.5gb instances at 14 % hold 70 %, so a pod asking 30 % fits; six hold 84 %, so it does not,
    though a 1g slice is free."""
    asking = HAMI.pod_demand(make_hami_pod("p", mem=4000, cores=30, **{"nvidia.com/vgpu-mode": "mig"}))
    five = make_hami_cluster(make_mig_node(), pods=mig_held(*(one_g(start) for start in range(5))))
    assert placer_for(five).judge(asking, five.nodes["mig-1"]).verdict is Verdict.FITS
    six = make_hami_cluster(make_mig_node(), pods=mig_held(*(one_g(start) for start in range(6))))
    judgement = placer_for(six).judge(asking, six.nodes["mig-1"])
    assert (judgement.verdict, judgement.cause) == (Verdict.FAILED, Cause.COMPUTE)
    assert judgement.reason == "needs 30 % of a GPU's compute; the most free is 16 % (GPU 0 of 1)"


def test_a_mig_container_asking_a_whole_gpus_compute_needs_one_no_pod_uses() -> None:
    """nv/device.go:794-804: 100 % asked on a MIG GPU that holds an instance is refused (its compute left is
    short, and the GPU is not its own); on an idle one it fits, and records its instance's profile compute
    (nv/device.go:651-652), as HAMi does."""
    asking = HAMI.pod_demand(make_hami_pod("p", mem=4000, cores=100, **{"nvidia.com/vgpu-mode": "mig"}))
    used = make_hami_cluster(make_mig_node(), pods=mig_held(one_g(0)))
    assert placer_for(used).judge(asking, used.nodes["mig-1"]).cause is Cause.COMPUTE
    idle = make_hami_cluster(make_mig_node())
    placed = placer_for(idle).choose(asking, idle.nodes["mig-1"])
    assert placed is not None and (placed.containers[0][0].cores, placed.containers[0][0].memory) == (14, 5120)


def test_a_mig_container_asking_no_compute_is_refused_where_all_of_it_is_taken() -> None:
    """nv/device.go:805-810: a container asking no compute takes no GPU whose compute is all used, MIG or not.
    With profiles of 50 % compute (the plugin's rounding of SMs, plug/register.go:242-244), two instances take
    all of it, and a third is refused though slices are free."""
    half = [{"name": "1g.5gb", "memoryMB": 5120, "core": 50, "sliceCount": 1,
             "placements": [{"start": start, "size": 1} for start in range(7)]}]  # fmt: skip
    pods = mig_held(one_g(0, 50), one_g(1, 50))
    cluster = make_hami_cluster(make_mig_node(profiles=half), pods=pods)
    asking = HAMI.pod_demand(make_hami_pod("p", mem=4000, **{"nvidia.com/vgpu-mode": "mig"}))
    assert cluster.nodes["mig-1"].used_cores == [100]
    judgement = placer_for(cluster).judge(asking, cluster.nodes["mig-1"])
    assert (judgement.verdict, judgement.cause) == (Verdict.FAILED, Cause.COMPUTE)


# --- MIG: an init container's instance, taken again ---------------------------------------------------------------


def test_an_init_and_an_app_container_share_the_last_free_slice_as_hamis_plugin_shares_it() -> None:
    """An init container and an app container asking a 1g each, on a GPU with one slice free. HAMi places each
    against the GPU without the other (init containers on a fresh copy, app containers on theirs, sch/score.go:
    226-286), so both get the 1g at slice 6; its plugin makes it for the first and gives the second the same
    (`EnsureAllocation` keyed by GPU, profile and placement, plug/migmgr.go:332-343). The pod is placed, the slice
    held once, the reservation written for both containers."""
    cluster = make_hami_cluster(make_mig_node(), pods=mig_held(*(one_g(start) for start in range(6))))
    init = {"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}
    pod = make_hami_pod("p", mem=4000, init=(init,), **{"nvidia.com/vgpu-mode": "mig"})
    demand = HAMI.pod_demand(pod)
    placed = placer_for(cluster).choose(demand, cluster.nodes["mig-1"])
    assert placed is not None
    ((prep,), (main,)) = placed.containers
    assert prep.instance == main.instance == MigInstance("1g.5gb", 6, 1)
    allocation = Allocation("uid-p", "default/p", "mig-1", placed.containers, placed.init_containers)
    assert make_ledger(cluster).reserve(allocation) is None
    assert cluster.nodes["mig-1"].occupied == [tuple((start, 1) for start in range(7))]
    assert cluster.overcommitted() == []
    written = HAMI.allocation_annotations(allocation, cluster.nodes["mig-1"].devices, 0.0)
    assert [
        (entry["containerIndex"], entry["placement"]["start"]) for entry in orjson.loads(written[MIG_ALLOCATIONS])
    ] == [
        (0, 6),
        (1, 6),
    ]


def test_two_app_containers_never_share_an_instance() -> None:
    """App containers run together: HAMi places each beside the ones before it (sch/score.go:256-286), so two
    asking a 1g on one free slice do not fit, there or here."""
    cluster = make_hami_cluster(make_mig_node(), pods=mig_held(*(one_g(start) for start in range(6))))
    pod = make_hami_pod("p", mem=4000, **{"nvidia.com/vgpu-mode": "mig"})
    pod["spec"]["containers"].append({**pod["spec"]["containers"][0], "name": "second"})
    judgement = placer_for(cluster).judge(HAMI.pod_demand(pod), cluster.nodes["mig-1"])
    assert judgement.verdict is Verdict.FAILED


def test_an_allocation_read_back_holds_a_shared_instance_once() -> None:
    """A pod bound so (by hami-scheduler before a move, or by us), read back after a restart: one instance on the
    GPU, not two that overlap (sch/scheduler.go:788-797 counts HAMi's two reservations; its plugin made one)."""
    init = {"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}
    pod = make_hami_pod("p", mem=4000, init=(init,), **{"nvidia.com/vgpu-mode": "mig"})
    grant = one_g(6)
    pod["spec"]["nodeName"] = "mig-1"
    pod["status"]["phase"] = "Running"
    pod["metadata"]["annotations"] |= {
        "hami.io/vgpu-node": "mig-1",
        ALLOCATED: encode(((grant,), (grant,)), {}),
        MIG_ALLOCATIONS: encode_instances(((grant,), (grant,)), {}),
    }
    cluster = make_hami_cluster(make_mig_node(), pods=(pod,))
    state = cluster.nodes["mig-1"]
    assert state.occupied == [((6, 1),)] and state.used == [5120] and state.used_slots == [1]
    assert cluster.overcommitted() == []


# --- nvidia.com/vgpu-mode ---------------------------------------------------------------------------------------


def test_an_empty_vgpu_mode_admits_only_gpus_registered_without_a_mode() -> None:
    """`strings.Contains("", mode)` (nv/device.go:495-498) is false for every mode but "": an empty
    `nvidia.com/vgpu-mode` keeps the pod off every GPU registered `hami-core` or `mig`, and admits one the plugin
    registered without a mode (it writes none when it cannot read its config, plug/server.go:131-133)."""
    demand = HAMI.pod_demand(make_hami_pod("p", mem=1000, **{"nvidia.com/vgpu-mode": ""}))
    core = make_hami_cluster(make_hami_node("gpu-1"))
    judgement = placer_for(core).judge(demand, core.nodes["gpu-1"])
    assert (judgement.verdict, judgement.cause) == (Verdict.UNRESOLVABLE, Cause.NO_MATCH)
    node = make_hami_node("bare-1")
    listed = orjson.loads(node["metadata"]["annotations"][REGISTER])
    node["metadata"]["annotations"][REGISTER] = orjson.dumps([{**gpu, "mode": ""} for gpu in listed]).decode()
    bare = make_hami_cluster(node)
    assert placer_for(bare).judge(demand, bare.nodes["bare-1"]).verdict is Verdict.FITS
    absent = HAMI.pod_demand(make_hami_pod("p", mem=1000))
    assert placer_for(core).judge(absent, core.nodes["gpu-1"]).verdict is Verdict.FITS
