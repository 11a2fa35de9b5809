"""HAMi's GPU policies: the chain, the scoring weights, NUMA binding and topology-aware sets
(`protocols/hami_policy.py`, `placement/fit.py`).

HAMi paths at tag v2.10.0 (commit 4707fb02): `nv/` = pkg/device/nvidia/, `policy/` = pkg/scheduler/policy/,
`util/` = pkg/util/. Where a case is HAMi's own test, the test's file and line are given and the expected GPUs
are those it asserts.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.core.devices import Demand, Device, Selectors, Strategy
from extender.core.placement.config import PolicyConfig, ask_of
from extender.core.placement.fit import Placement, Usage, place
from extender.core.protocols.hami_policy import SCORES, GpuPolicy, gpu_policy, weights, with_links
from extender.core.resources import InvalidPod
from tests.builders import HAMI, make_hami_cluster, make_hami_node, make_hami_pod, placer_for

THREE = {
    "dev-0": {"dev-1": 100, "dev-2": 200},
    "dev-1": {"dev-0": 100, "dev-2": 150},
    "dev-2": {"dev-0": 200, "dev-1": 150},
}
"""The pair scores of nv/device_test.go:2708-2716 (`TestFit_TopologyWorstSingleCard`)."""


def gpus(scores: dict[str, dict[str, int]], numa: tuple[int, ...] = ()) -> tuple[Device, ...]:
    """Empty 8 GiB GPUs named as in HAMi's tests, linked by `scores` (read as the annotation is)."""
    devices = [
        Device(index, 8192, cores=100, slots=10, uuid=uuid, numa=numa[index] if numa else 0)
        for index, uuid in enumerate(sorted(scores))
    ]
    annotation = orjson.dumps([{"uuid": uuid, "score": peers} for uuid, peers in scores.items()]).decode()
    return with_links(devices, annotation)


def chosen(devices: tuple[Device, ...], count: int, selectors: Selectors, usage: Usage | None = None) -> set[str]:
    empty = Usage([0] * len(devices), [0] * len(devices), [0] * len(devices))
    demand = Demand(memory=100 * count, devices=count, cores=10, selectors=selectors)
    placed = place(demand, devices, usage or empty, Strategy.BINPACK, "MiB")
    assert isinstance(placed, Placement), placed
    return {grant.uuid for grant in placed.containers[0]}


TOPOLOGY = Selectors(topology=True)


def test_one_gpu_is_the_one_least_linked_to_the_others() -> None:
    """`TestFit_TopologyWorstSingleCard` (nv/device_test.go:2694-2726): sums 300, 250, 350: dev-1."""
    assert chosen(gpus(THREE), 1, TOPOLOGY) == {"dev-1"}


def test_several_gpus_are_the_best_linked_set() -> None:
    """`TestFit_TopologyBestCombination` (nv/device_test.go:2728-2765): {dev-0, dev-2}, linked 200."""
    assert chosen(gpus(THREE), 2, TOPOLOGY) == {"dev-0", "dev-2"}


def test_negative_scores_are_compared_as_numbers() -> None:
    """`TestFit_TopologyNegativeScores` (nv/device_test.go:2800-2855): dev-0 alone; {dev-1, dev-2} together."""
    scores = {
        "dev-0": {"dev-1": -5, "dev-2": -3},
        "dev-1": {"dev-0": -5, "dev-2": -1},
        "dev-2": {"dev-0": -3, "dev-1": -1},
    }
    assert chosen(gpus(scores), 1, TOPOLOGY) == {"dev-0"}
    assert chosen(gpus(scores), 2, TOPOLOGY) == {"dev-1", "dev-2"}


def test_without_scores_a_topology_aware_pod_gets_gpus_in_the_usual_order() -> None:
    """`TestFit_TopologyBestCombinationZeroScores` (nv/device_test.go:2767-2798): it fits; all sets tie, and the
    first in the strategy's order stands."""
    zero = {uuid: dict.fromkeys(peers, 0) for uuid, peers in THREE.items()}
    assert chosen(gpus(zero), 2, TOPOLOGY) == {"dev-0", "dev-1"}


def test_an_8_gpu_nvlink_box_gives_a_4_gpu_pod_one_nvlink_island() -> None:
    """Two islands of four GPUs, NVLink (100 x 2 links) inside, PCIe across the CPUs (10), and GPU 2 full: a
    4-GPU pod gets the intact island, though binpack's order would start from the split one; a 1-GPU pod is
    kept off the intact island (its links to the other candidates sum lowest on the split one)."""
    islands = [(0, 1, 2, 3), (4, 5, 6, 7)]
    scores = {
        f"GPU-{a}": {
            f"GPU-{b}": 200 if any(a in group and b in group for group in islands) else 10 for b in range(8) if b != a
        }
        for a in range(8)
    }
    devices = gpus(scores)
    used = Usage([0, 0, 4096, 0, 0, 0, 0, 0], [0] * 8, [0, 0, 10, 0, 0, 0, 0, 0])  # GPU 2 runs its most pods
    assert chosen(devices, 4, TOPOLOGY, used) == {"GPU-4", "GPU-5", "GPU-6", "GPU-7"}
    assert chosen(devices, 1, TOPOLOGY, used) in ({"GPU-0"}, {"GPU-1"}, {"GPU-3"})


def test_numa_bind_keeps_a_containers_gpus_on_one_numa_node() -> None:
    """`TestFit_NumaSwitching` (nv/device_test.go:2587-2614): dev-0 and dev-1 on NUMA 1, dev-2 on NUMA 0, two
    GPUs asked with `nvidia.com/numa-bind`: dev-0 and dev-1."""
    devices = gpus({"dev-0": {}, "dev-1": {}, "dev-2": {}}, numa=(1, 1, 0))
    assert chosen(devices, 2, Selectors(numa_bind=True)) == {"dev-0", "dev-1"}


def test_numa_bind_is_honoured_under_the_default_policy_too() -> None:
    """Through the cache and the fragmentation policy (not a pod strategy of its own): 2 GPUs of 4, NUMA 0 and 1
    alternating, the GPU of NUMA 0 fullest: the pair comes from one NUMA node."""
    node = make_hami_node("gpu-1", gpus=4)
    register = orjson.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    for entry in register:
        entry["numa"] = entry["index"] % 2
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = orjson.dumps(register).decode()
    cluster = make_hami_cluster(node)
    demand = HAMI.pod_demand(make_hami_pod("p", gpus=2, mem=1000, **{"nvidia.com/numa-bind": "true"}))
    placed = placer_for(cluster).choose(demand, cluster.nodes["gpu-1"])
    assert placed is not None
    numas = {cluster.nodes["gpu-1"].devices[grant.index].numa for grant in placed.containers[0]}
    assert len(numas) == 1


# --- the policy chain and the weights -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        ("binpack", GpuPolicy(Strategy.BINPACK)),
        ("spread", GpuPolicy(Strategy.SPREAD)),
        ("numa", GpuPolicy(None, ("numa",))),  # alone, a chain (policy/gpu_policy.go:82-84)
        ("binpack,numa,topology-aware", GpuPolicy(Strategy.BINPACK, ("binpack", "numa"), topology=True)),
        ("numa, spread, numa", GpuPolicy(Strategy.SPREAD, ("numa", "spread"))),  # deduplicated (:58-75)
        ("mutex,topology-aware", GpuPolicy(None, (), exclusive=True, topology=True)),
        ("topology-aware", GpuPolicy(topology=True)),
    ],
)
def test_the_gpu_policy_chain_reads_as_hamis(value: str, policy: GpuPolicy) -> None:
    """`gpuSortKeyChain` (policy/gpu_policy.go:58-75) and `PolicyContains` (util/util.go:290-298)."""
    assert gpu_policy(value) == policy


def test_the_chain_orders_gpus_key_by_key() -> None:
    """`binpack,numa` (policy/gpu_policy.go:131-166): the fullest first, then by NUMA node; `numa,binpack`: by NUMA
    node first, the highest (HAMi's Fit walks the list sorted ascending from its end, nv/device.go:727), the
    fullest of it first."""
    devices = gpus({"a": {}, "b": {}, "c": {}}, numa=(0, 1, 1))
    usage = Usage([4096, 2048, 0], [0, 0, 0], [1, 1, 0])
    assert chosen(devices, 1, Selectors(order=("binpack", "numa")), usage) == {"a"}
    assert chosen(devices, 1, Selectors(order=("numa", "binpack")), usage) == {"b"}


def test_scoring_weights_decide_which_gpu_binpack_finds_fullest() -> None:
    """`ComputeScore` (policy/gpu_policy.go:194-221): GPU a holds more memory, GPU b more pods; weighing memory
    3 makes a the fuller, slots 3 makes b."""
    devices = gpus({"a": {}, "b": {}})
    usage = Usage([6000, 1000], [0, 0], [1, 5])
    assert chosen(devices, 1, Selectors(order=("binpack",), weights=(1, 1, 3)), usage) == {"a"}
    assert chosen(devices, 1, Selectors(order=("binpack",), weights=(3, 1, 1)), usage) == {"b"}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("slot=1,core=1", "expected slot, core and memory"),  # util/device_scoring_weights.go:59-62
        ("slot=1,core=1,memory", "key=value"),
        ("slot=1,slot=1,memory=1", "duplicate 'slot'"),
        ("slot=1,core=-1,memory=1", "whole number of at least 0"),
        ("slot=1,core=x,memory=1", "whole number of at least 0"),
        ("slot=1,cores=1,memory=1", "unknown weight 'cores'"),
        ("slot=0,core=0,memory=0", "at least one weight"),
    ],
)
def test_scoring_weights_hami_refuses_are_refused_naming_the_annotation(value: str, error: str) -> None:
    """`ParseDeviceScoringWeights` (util/device_scoring_weights.go:43-102); HAMi fails the pod's filter."""
    with pytest.raises(ValueError, match=error):
        weights(value)
    with pytest.raises(InvalidPod, match=r"hami\.io/device-scoring-weights"):
        HAMI.pod_demand(make_hami_pod("p", mem=1000, **{"hami.io/device-scoring-weights": value}))


def test_scoring_weights_read() -> None:
    assert weights(" slot = 1 , core=0,memory=3") == (1, 0, 3)
    demand = HAMI.pod_demand(
        make_hami_pod("p", mem=1000, **{"hami.io/device-scoring-weights": "slot=2,core=1,memory=0"})
    )
    assert demand.selectors.weights == (2, 1, 0)


# --- the node's scores ------------------------------------------------------------------------------------------


def scored_node(scores: Any) -> dict[str, Any]:
    node = make_hami_node("gpu-1", gpus=2)
    node["metadata"]["annotations"][SCORES] = scores if isinstance(scores, str) else orjson.dumps(scores).decode()
    return node


def test_the_nodes_pair_scores_are_read_onto_its_gpus() -> None:
    """`DecodePairScores` (pkg/device/devices.go:383-389) onto each GPU by UUID (nv/device.go:328-341)."""
    scores = [
        {"uuid": "GPU-gpu-1-0", "score": {"GPU-gpu-1-1": 200}},
        {"uuid": "GPU-gpu-1-1", "score": {"GPU-gpu-1-0": 200}},
    ]
    first, second = HAMI.node_devices(scored_node(scores)).devices
    assert first.link(second) == 200 and second.link(first) == 200


@pytest.mark.parametrize(
    "scores", ["{", '{"uuid":"GPU-gpu-1-0"}', '[{"uuid":"GPU-gpu-1-0","score":{"GPU-gpu-1-1":"200"}}]']
)
def test_scores_go_cannot_decode_leave_the_node_unreadable(scores: str) -> None:
    """nv/device.go:323-327: a present but undecodable `hami.io/node-nvidia-score` fails the node."""
    found = HAMI.node_devices(scored_node(scores))
    assert found.devices == () and SCORES in found.unreadable


def test_the_setting_gives_every_multi_gpu_pod_the_best_linked_set() -> None:
    """`--hami-topology-all`: pods asking several GPUs get the topology-aware choice without the annotation."""
    pod = make_hami_pod("p", gpus=2, mem=1000)
    assert not HAMI.pod_demand(pod).selectors.topology
    assert type(HAMI)(topology_multi_gpu=True).pod_demand(pod).selectors.topology
    assert not type(HAMI)(topology_multi_gpu=True).pod_demand(make_hami_pod("q", mem=1000)).selectors.topology


# --- the node choice sees the links (beyond HAMi, whose node score for topology is 0: nv/device.go:641-643) ------


def box(name: str, linked: bool) -> dict[str, Any]:
    """An empty 8-GPU node: two NVLink islands of four (200 inside, 10 across), or PCIe paths alone (20)."""
    node = make_hami_node(name, gpus=8)

    def score(a: int, b: int) -> int:
        return (200 if a // 4 == b // 4 else 10) if linked else 20

    scores = [
        {"uuid": f"GPU-{name}-{a}", "score": {f"GPU-{name}-{b}": score(a, b) for b in range(8) if b != a}}
        for a in range(8)
    ]
    node["metadata"]["annotations"][SCORES] = orjson.dumps(scores).decode()
    return node


@pytest.mark.parametrize(
    ("pod", "nvlink", "pcie", "node"),
    [
        (make_hami_pod("one", mem=1000), "a-nvlink", "b-pcie", "b-pcie"),
        (
            make_hami_pod("four", gpus=4, mem=1000, **{"hami.io/gpu-scheduler-policy": "topology-aware"}),
            "b-nvlink",
            "a-pcie",
            "b-nvlink",
        ),
    ],
    ids=["one-gpu", "four-gpus-topology-aware"],
)
def test_the_nvlink_box_is_kept_for_the_pod_that_needs_its_links(
    pod: dict[str, Any], nvlink: str, pcie: str, node: str
) -> None:
    """Two empty boxes that waste alike, the other one first by name (which wins a tie): a one-GPU pod goes to
    the box of PCIe paths, a topology-aware four-GPU pod to the NVLink box, on one island."""
    cluster = make_hami_cluster(box(nvlink, linked=True), box(pcie, linked=False))
    placer = placer_for(cluster, PolicyConfig())
    demand = HAMI.pod_demand(pod)
    key = f"default/{pod['metadata']['name']}"
    outcome = placer.filter(demand, sorted([nvlink, pcie]), cluster.nodes, key, ask_of(pod, demand))
    assert outcome.passed == [node]
    placed = placer.choose(demand, cluster.nodes[node], ask_of(pod, demand))
    assert placed is not None
    if node == nvlink:
        assert len({grant.index // 4 for grant in placed.containers[0]}) == 1


def test_eight_of_sixteen_gpus_are_grown_from_the_best_pair_and_stay_on_one_island() -> None:
    """C(16, 8) = 12,870 sets is more than `topology.COMBINATIONS`: the set is grown one best-linked GPU at a time
    from the best-linked pair (HAMi compares every set, in a quarter of a second here); two islands of eight."""
    scores = {
        f"GPU-{a:02d}": {f"GPU-{b:02d}": 300 if a // 8 == b // 8 else 10 for b in range(16) if b != a}
        for a in range(16)
    }
    devices = gpus(scores)
    assert chosen(devices, 8, TOPOLOGY) == {f"GPU-{index:02d}" for index in range(8)}
