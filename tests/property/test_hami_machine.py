"""The cache, the ledger and the placement under HAMi's protocol, driven at random (`machine.py`): HAMi-core GPUs
(memory, compute and a split count), MIG GPUs of two profile tables, and nodes with one of each; pods of one or two
GPU containers, by memory or by percent, some asking MIG mode.

Random reservations of two containers on one MIG GPU are where the ledger's last check must count the instances
of the allocation itself, not only those held before it.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance
from extender.core.placement.config import PolicyConfig
from tests.builders import A100_PROFILES, HAMI, make_hami_pod
from tests.property.fresh import property_settings
from tests.property.machine import CacheMachine

EXAMPLES = 120
STEPS = 60

A100_80GB_PROFILES = [
    {"name": name, "memoryMB": memory, "core": core, "sliceCount": slices,
     "placements": [{"start": start, "size": size} for start in starts]}
    for name, memory, core, slices, starts, size in (
        ("1g.10gb", 9856, 15, 1, range(7), 1),
        ("1g.20gb", 19968, 15, 1, (0, 2, 4, 6), 2),
        ("2g.20gb", 19968, 29, 2, (0, 2, 4), 2),
        ("3g.40gb", 40192, 43, 3, (0, 4), 4),
        ("4g.40gb", 40192, 58, 4, (0,), 4),
        ("7g.80gb", 80384, 100, 7, (0,), 8),
    )
]  # fmt: skip
"""Every profile NVML offers on an A100-SXM4-80GB (`bench/placement/mig.py`, `docs/benchmarks/placement.md`): two
pairs of profiles of equal memory."""
TABLES = ((40960, A100_PROFILES), (81920, A100_80GB_PROFILES))
"""(devmem, profiles) of the MIG GPUs drawn: HAMi's own A100-40GB table, and the A100-80GB's."""
HEALTH = st.sampled_from((True, True, True, False))
"""Whether a GPU is registered healthy (an unhealthy one keeps its pods and takes no new one)."""


def gpu(
    name: str, index: int, mode: str, mem: int, split: int, profiles: list[dict[str, Any]], health: bool
) -> dict[str, Any]:
    """One GPU as HAMi's device plugin registers it (`hami.io/node-nvidia-register`)."""
    entry = {"id": f"GPU-{name}-{index}", "index": index, "count": split, "devmem": mem, "devcore": 100,
             "type": "NVIDIA A100-SXM4-80GB" if mem == 81920 else "NVIDIA A100-SXM4-40GB", "mode": mode,
             "health": health}  # fmt: skip
    return entry | ({"migProfiles": profiles} if mode == "mig" else {})


class HamiMachine(CacheMachine):
    protocol = HAMI
    config = PolicyConfig(tolerance=0.25)

    def node(self, data: st.DataObject, name: str) -> dict[str, Any]:
        kind = data.draw(st.sampled_from(("core", "mig", "mixed")))
        gpus = data.draw(st.integers(min_value=1, max_value=3 if kind == "core" else 2))
        mem, profiles = data.draw(st.sampled_from(TABLES))
        split = data.draw(st.sampled_from((2, 2, 4, 10)))
        modes = {"core": ["hami-core"] * gpus, "mig": ["mig"] * gpus, "mixed": ["mig", "hami-core"][:gpus]}[kind]
        register = [
            gpu(name, index, mode, mem, 7 if mode == "mig" else split, profiles, data.draw(HEALTH))
            for index, mode in enumerate(modes)
        ]
        allocatable = {"nvidia.com/gpu": str(gpus * split)} | data.draw(st.sampled_from(({}, {"cpu": "8"})))
        annotations = {"hami.io/node-nvidia-register": orjson.dumps(register).decode()}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "annotations": annotations},
            "status": {
                "allocatable": allocatable,
                "capacity": dict(allocatable),
                "conditions": [{"type": "Ready", "status": data.draw(st.sampled_from(("True", "True", "False")))}],
            },
        }

    def pod(self, data: st.DataObject, name: str) -> dict[str, Any]:
        mig_mode = data.draw(st.booleans())
        pod = make_hami_pod(name)
        if mig_mode:
            pod["metadata"]["annotations"]["nvidia.com/vgpu-mode"] = "mig"
        containers = []
        for number in range(data.draw(st.integers(min_value=1, max_value=2))):
            limits = {"nvidia.com/gpu": str(1 if mig_mode else data.draw(st.sampled_from((1, 1, 2))))}
            if data.draw(st.booleans()):
                limits["nvidia.com/gpumem"] = str(data.draw(st.integers(min_value=1000, max_value=41000)))
            else:
                limits["nvidia.com/gpumem-percentage"] = str(data.draw(st.sampled_from((10, 25, 50, 100))))
            if not mig_mode and data.draw(st.booleans()):
                limits["nvidia.com/gpucores"] = str(data.draw(st.sampled_from((10, 30, 50, 100))))
            resources: dict[str, Any] = {"limits": limits}
            cpu = data.draw(st.sampled_from((None, "1", "4")))
            if cpu is not None:
                resources["requests"] = {"cpu": cpu}
            containers.append({"name": f"c{number}", "resources": resources})
        pod["spec"]["containers"] = containers
        return pod

    def random_allocation(self, data: st.DataObject, uid: str, key: str, node: str) -> Allocation:
        devices = self.cache.nodes[node].devices if node in self.cache.nodes else ()
        containers = []
        for _ in range(data.draw(st.integers(min_value=1, max_value=2))):
            state = self.cache.nodes.get(node)
            busy = [position for position, slots in enumerate(state.used_slots) if slots] if state is not None else []
            anywhere = st.integers(min_value=0, max_value=len(devices))  # len(devices): a GPU the node does not have
            position = data.draw(st.one_of(anywhere, st.sampled_from(busy)) if busy else anywhere)
            if position == len(devices):
                containers.append((Grant(position, 1000, 10, f"GPU-{node}-{position}"),))
                continue
            device = devices[position]
            if device.mig and data.draw(st.sampled_from((True, True, True, False))):
                profile = data.draw(st.sampled_from(device.profiles))
                start, size = data.draw(st.sampled_from(profile.placements))
                instance = MigInstance(profile.name, start, size)
                containers.append((Grant(device.index, profile.memory, profile.cores, device.uuid, instance),))
            else:  # at random, or exactly what is left, or 1 more (and small, to fill a split count)
                assert state is not None
                left, cores_left = device.capacity - state.used[position], device.cores - state.used_cores[position]
                memory = data.draw(st.one_of(st.integers(1, device.capacity + 1), st.sampled_from((1, left, left + 1))))
                cores = data.draw(
                    st.one_of(st.just(0), st.sampled_from((30, 60, 100)), st.sampled_from((cores_left, cores_left + 1)))
                )
                containers.append((Grant(device.index, max(memory, 1), max(cores, 0), device.uuid),))
        return Allocation(uid, key, node, tuple(containers))


HamiMachine.TestCase.settings = property_settings(EXAMPLES, STEPS)
test_hami_cache_equals_one_built_afresh = HamiMachine.TestCase
