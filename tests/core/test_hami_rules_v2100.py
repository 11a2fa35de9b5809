"""HAMi v2.10.0's rules where its device plugin or its users depend on them, each case built from HAMi's code.

HAMi paths at tag v2.10.0 (commit 4707fb02): `dev/` = pkg/device/, `nv/` = pkg/device/nvidia/, `sch/` =
pkg/scheduler/, `plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/. Where ours deliberately differs
(the MIG placement that cuts least, the node choice that sees NVLink links) `docs/protocols/hami.md` says why.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.core.devices import Device, Strategy
from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance, MigProfile
from extender.core.placement.fit import Placement, Usage, Verdict, place
from extender.core.protocols.hami import ALLOCATED, GPU_POLICY, NUMA_BIND, encode
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
