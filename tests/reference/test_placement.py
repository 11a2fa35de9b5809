"""The filter's choice under the fragmentation policy with a tolerance above 0, against the brute-force reference.

A gpushare cluster of 16 to 22 nodes (16 of one kind at least: the product judges them in arrays, `batch.py`), each
with GPUs partly taken; a learned workload of typical pods; one pod to place. The reference tries the pod on every
GPU of every node with room for it (`fgd.py`): what it adds to a node is the least increase of the node's measure;
the nodes within the tolerance of the least pass (`ties`), and with `best` the one whose GPUs are fullest, then the
first by name. The product's filter must pass exactly those, and its bind choose a GPU where the pod adds least.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from extender.core.cache import Cache
from extender.core.placement.config import Narrowing, PolicyConfig, ask_of
from extender.core.placement.learned import Learned
from extender.core.placement.placer import Placer
from tests.builders import PROFILE, FakeClock, make_node, make_pod
from tests.property.fresh import property_settings
from tests.reference import fgd
from tests.reference.test_fragmentation import learned_workload, typical_pods

EXAMPLES = 80
KINDS = ((4, 16, ""), (4, 16, ""), (4, 16, ""), (2, 8, "T4"))
AMBIGUOUS = 1e-7
"""A node this close to the tolerance's edge could fall either side by the rounding of sums: such draws are left
out (the product rounds what a pod adds to 1e-9 GPU)."""


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, fgd.Node]]:
    nodes, pods, seen = [], [], {}
    for number in range(draw(st.integers(16, 22))):
        name = f"node-{number:02d}"
        gpus, size, model = KINDS[0] if number < 16 else draw(st.sampled_from(KINDS))
        cpu = draw(st.sampled_from((4000, 8000, 16000)))
        node = make_node(name, gpus=gpus, mem=size, cpu=f"{cpu}m", memory="64Gi", model=model)
        nodes.append(node)
        requested = 0
        devices = []
        for index in range(gpus):
            used = draw(st.sampled_from((0, 0, size // 4, size // 2, size - 1, size)))
            if used:
                request = draw(st.sampled_from((0, 1000, 2000)))
                requested += request
                pod = make_pod(f"{name}-{index}", gpu_mem=used, node=name, indexes=(index,), phase="Running")
                pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": f"{request}m"}
                pods.append(pod)
            devices.append(fgd.shared_gpu(size, used, None, 0, 0, model))
        seen[name] = fgd.Node(cpu - requested, 64 * 1024**3, tuple(devices))
    return nodes, pods, seen


def added(node: fgd.Node, pod: fgd.TypicalPod, workload: list[tuple[fgd.TypicalPod, float]]) -> tuple[float, int]:
    """The least the pod adds to the node's measure on any one GPU with room for it, and the GPU (inf, -1: none)."""
    before = fgd.measure(node, workload)
    best = (float("inf"), -1)
    for position, gpu in enumerate(node.gpus):
        if gpu.free < pod.mib:
            continue
        taken = fgd.Gpu(gpu.capacity, gpu.free - pod.mib, gpu.free - pod.mib, None, gpu.model)
        gpus = (*node.gpus[:position], taken, *node.gpus[position + 1 :])
        after = fgd.Node(node.cpu - pod.cpu, node.memory - pod.memory, gpus)
        best = min(best, (round(fgd.measure(after, workload) - before, 9), position), key=lambda pair: pair[0])
    return best


@property_settings(EXAMPLES)
@given(
    clusters(),
    st.data(),
    st.integers(1, 16).map(lambda steps: steps / 8),
    st.sampled_from((Narrowing.BEST, Narrowing.TIES)),
)
def test_the_filter_passes_the_reference_choice_within_the_tolerance(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, fgd.Node]],
    data: st.DataObject,
    tolerance: float,
    narrowing: Narrowing,
) -> None:
    nodes, pods, seen = cluster
    typical = typical_pods(data.draw, hami=False)
    workload = [(pod, float(count)) for pod, count in typical]
    asked = fgd.TypicalPod(data.draw(st.sampled_from((0, 1000, 4000))), 0, 1, data.draw(st.integers(1, 16)))
    values = {name: added(node, asked, workload) for name, node in seen.items()}
    fitting = [value for value, _ in values.values() if value != float("inf")]
    assume(len(fitting) > 1)
    edge = min(fitting) + tolerance
    assume(all(abs(value - edge) > AMBIGUOUS for value in fitting))
    near = sorted(name for name, (value, _) in values.items() if value <= edge)
    free = {name: sum(gpu.free / gpu.capacity for gpu in node.gpus) for name, node in seen.items()}
    expected = near if narrowing is Narrowing.TIES else [min(near, key=lambda name: (free[name], name))]

    cache = Cache(PROFILE, clock=FakeClock(0.0))
    cache.replace(nodes, pods)
    learned = Learned(cache)
    learned.workload = learned_workload(PROFILE, typical, hami=False)
    placer = Placer(cache, PolicyConfig(narrowing=narrowing, tolerance=tolerance), learned)
    pod = make_pod("asked", gpu_mem=asked.mib, cpu=f"{asked.cpu}m")
    demand = PROFILE.pod_demand(pod)
    ask = ask_of(pod, demand)
    outcome = placer.filter(demand, sorted(seen), cache.nodes, "default/asked", ask)
    assert sorted(outcome.passed) == expected

    chosen = expected[0]
    placement = placer.choose(demand, cache.nodes[chosen], ask)
    assert placement is not None
    (grant,) = placement.containers[0]
    gpus = seen[chosen].gpus
    left = gpus[grant.index].free - asked.mib
    taken = fgd.Gpu(gpus[grant.index].capacity, left, left, None, gpus[grant.index].model)
    after = fgd.Node(
        seen[chosen].cpu - asked.cpu,
        seen[chosen].memory,
        (*gpus[: grant.index], taken, *gpus[grant.index + 1 :]),
    )
    assert round(fgd.measure(after, workload) - fgd.measure(seen[chosen], workload), 9) == values[chosen][0]
