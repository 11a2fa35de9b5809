"""Builders for the Kubernetes objects tests need: `make_node(gpus=2, mem=16)`, `make_pod(gpu_mem=4)`.

They build the same JSON shapes the API server (and the captured fixtures) carry, reduced to what matters.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from typing import Any

import orjson

from extender.core.binding import BindContext, BindRequest, RecentPods, bind
from extender.core.cache import Cache
from extender.core.devices import Device
from extender.core.holds import Allocation, Grant
from extender.core.ledger import Ledger
from extender.core.placement.config import PolicyConfig
from extender.core.placement.learned import Learned
from extender.core.placement.placer import Placer
from extender.core.pods import pod_record
from extender.core.protocols.gpushare import Profile
from extender.core.protocols.hami import Hami, encode
from extender.core.quota.book import Quotas

PROFILE = Profile()
_uids = itertools.count(1)


def make_node(
    name: str = "node-1",
    gpus: int = 2,
    mem: int = 16,
    ready: bool = True,
    devices: list[dict[str, Any]] | None = None,
    profile: Profile = PROFILE,
    cpu: str = "16",
    memory: str = "64Gi",
    model: str = "",
) -> dict[str, Any]:
    """A Node with `gpus` GPUs of `mem` each (capacity holds the total, as the gpushare plugin reports), `cpu`
    and `memory` allocatable, and the GPU model label when `model` is given."""
    annotations = {profile.node_devices_annotation: orjson.dumps(devices).decode()} if devices is not None else {}
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        capacity |= {profile.count_resource: str(gpus), profile.memory_resource: str(gpus * mem)}
    labels = {"kubernetes.io/hostname": name} | ({profile.model_label: model} if model else {})
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def make_pod(
    name: str = "pod-1",
    gpu_mem: int | str | None = 4,
    gpus: int | None = None,
    namespace: str = "default",
    uid: str | None = None,
    node: str = "",
    indexes: tuple[int, ...] | None = None,
    phase: str = "Pending",
    assume_time: float = 1_700_000_000.0,
    bound: bool = True,
    profile: Profile = PROFILE,
    cpu: str | None = None,
    memory: str | None = None,
    models: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A Pod asking `gpu_mem` (in limits) over `gpus` GPUs, and `cpu` and `memory` in its requests when given;
    with `indexes`, annotated as allocated on `node`, and bound to `node` (spec.nodeName) unless `bound=False`
    (annotated, binding never made); `models`: a required node affinity on the GPU model label."""
    uid = uid or f"uid-{name}-{next(_uids)}"
    limits: dict[str, Any] = {}
    if gpu_mem is not None:
        limits[profile.memory_resource] = gpu_mem
    if gpus is not None:
        limits[profile.count_resource] = str(gpus)
    annotations: dict[str, str] = {}
    if indexes is not None:
        per_device = -(-int(gpu_mem or 0) // len(indexes))
        allocation = Allocation.uniform(uid, f"{namespace}/{name}", node, indexes, per_device)
        annotations = profile.allocation_annotations(allocation, (Device(indexes[0], 16),), assume_time)
    requests = {name: value for name, value in (("cpu", cpu), ("memory", memory)) if value is not None}
    resources: dict[str, Any] = {"limits": limits} | ({"requests": requests} if requests else {})
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/none", "resources": resources}]}
    if models:
        term = {"matchExpressions": [{"key": profile.model_label, "operator": "In", "values": list(models)}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    if node and bound:
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
        "spec": spec,
        "status": {"phase": phase},
    }


def bound_pod(name: str, node: str, indexes: tuple[int, ...], gpu_mem: int, **kwargs: Any) -> dict[str, Any]:
    """A running pod bound to `node` that carries our allocation annotations."""
    return make_pod(name, gpu_mem=gpu_mem, node=node, indexes=indexes, phase="Running", **kwargs)


def filter_body(pod: dict[str, Any], names: list[str]) -> bytes:
    """A `/filter` request's body as kube-scheduler sends it with `nodeCacheCapable: true`: the pod and node names."""
    return orjson.dumps({"Pod": pod, "NodeNames": names})


def bind_body(pod: dict[str, Any], node: str) -> bytes:
    """A `/bind` request's body for the pod to the node."""
    meta = pod["metadata"]
    return orjson.dumps(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    )


def make_quota(name: str = "gpus", namespace: str = "default", **hard: str) -> dict[str, Any]:
    """A ResourceQuota whose spec.hard is `hard` (keys hold dots and slashes: `**{"limits.nvidia.com/gpu": "2"}`)."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-quota-{namespace}-{name}"},
        "spec": {"hard": dict(hard)},
    }


def make_cluster(*nodes: dict[str, Any], pods: tuple[dict[str, Any], ...] = (), profile: Profile = PROFILE) -> Cache:
    cluster = Cache(profile)
    cluster.replace(list(nodes), list(pods))
    return cluster


def random_cluster(rng: random.Random) -> Cache:
    """Twelve nodes of 1, 2 or 4 GPUs of 8 or 16, a tenth not Ready, and up to 30 pods bound where they fit."""
    nodes = [
        make_node(f"n{i}", gpus=rng.choice((1, 2, 4)), mem=rng.choice((8, 16)), ready=rng.random() > 0.1)
        for i in range(12)
    ]
    cluster = make_cluster(*nodes)
    for i in range(30):
        node = f"n{rng.randrange(12)}"
        state = cluster.nodes[node]
        index = rng.randrange(len(state.devices))
        amount = rng.randint(1, 8)
        if state.free[index] >= amount:
            cluster.apply_pod(bound_pod(f"p{i}", node, (index,), amount))
    return cluster


def two_gpus_with_12_and_4_used() -> tuple[dict[str, Any], ...]:
    """n1: GPU 0 has 16 - 12 = 4 free, GPU 1 has 16 - 4 = 12 free."""
    return (bound_pod("a", "n1", (0,), 12), bound_pod("b", "n1", (1,), 4))


class FakeClock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def quotas_of(cluster: Cache) -> Quotas:
    """The quota book following `cluster` (made the first time it is asked for, as `app.build_cache` makes it)."""
    for listener in cluster.listeners:
        if isinstance(listener, Quotas):
            return listener
    return Quotas.following(cluster)


def learned_of(cluster: Cache) -> Learned:
    """What the placement policy learns from `cluster` (made the first time it is asked for: it learns the pods
    already there first, as after a restart)."""
    for listener in cluster.listeners:
        if isinstance(listener, Learned):
            return listener
    return Learned(cluster)


def placer_for(cluster: Cache, config: PolicyConfig | None = None) -> Placer:
    """Placement over `cluster` by `config` (the default policy when None), with what it learned of it."""
    return Placer(cluster, config or PolicyConfig(), learned_of(cluster))


def make_ledger(cluster: Cache, ttl: float = 60.0, clock: FakeClock | None = None) -> Ledger:
    return Ledger(cluster, ttl, clock or FakeClock(), quotas_of(cluster))


def cache_differences(cluster: Cache, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """How the cache differs from the API's objects (from the double or a real apiserver), plus every device
    over capacity: empty when the cache equals the API's state and the invariant holds."""
    problems = list(cluster.overcommitted())
    listed_nodes = {node["metadata"]["name"] for node in nodes}
    known = {name for name, state in cluster.nodes.items() if state.known}
    if known != listed_nodes:
        problems.append(f"nodes: cache has {sorted(known)}, API has {sorted(listed_nodes)}")
    live = [pod for pod in pods if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    listed_pods = {pod["metadata"]["uid"] for pod in live}
    if set(cluster.pods) != listed_pods:
        problems.append(f"pods: cache has {sorted(cluster.pods)}, API has {sorted(listed_pods)}")
    for pod in live:
        record = pod_record(pod, cluster.protocol)
        hold = cluster.hold_of(record.uid)
        if record.node_name and record.allocation is not None:
            if hold is None or not hold.observed or hold.allocation != record.allocation:
                problems.append(f"pod {record.key}: API shows {record.allocation}, cache holds {hold}")
        elif hold is not None and hold.observed:
            problems.append(f"pod {record.key}: cache holds {hold}, API shows no bound allocation")
    return problems


async def bind_error(
    request: BindRequest, cluster: Cache, ledger: Ledger, policy: PolicyConfig, binder: Any, recent: RecentPods
) -> str:
    """`binding.bind`, answered as the reply's `Error` says it ("" on success)."""
    return (await bind(request, BindContext(cluster, ledger, placer_for(cluster, policy), binder, recent))).error


HAMI = Hami()


def make_hami_node(
    name: str = "gpu-1",
    gpus: int = 2,
    mem: int = 40960,
    cores: int = 100,
    split: int = 10,
    model: str = "NVIDIA A100-SXM4-40GB",
    **annotations: str,
) -> dict[str, Any]:
    """A Node as HAMi's device plugin registers it (hami.io/node-nvidia-register, allocatable nvidia.com/gpu)."""
    register = [
        {"id": f"GPU-{name}-{index}", "index": index, "count": split, "devmem": mem, "devcore": cores,
         "type": model, "mode": "hami-core", "health": True}
        for index in range(gpus)
    ]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-nvidia-register": orjson.dumps(register).decode(), **annotations},
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus * split)},
            "capacity": {"nvidia.com/gpu": str(gpus * split)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


A100_PROFILES = [
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1,
     "placements": [{"start": start, "size": 1} for start in range(7)]},
    {"name": "2g.10gb", "memoryMB": 10240, "core": 28, "sliceCount": 2,
     "placements": [{"start": start, "size": 2} for start in (0, 2, 4)]},
    {"name": "3g.20gb", "memoryMB": 20480, "core": 42, "sliceCount": 3,
     "placements": [{"start": start, "size": 4} for start in (0, 4)]},
]  # fmt: skip
"""An A100-40GB's profiles as HAMi's own tests give them (`a100MigProfiles`, pkg/device/nvidia/
mig_capability_test.go:27-33 at v2.10.0; 3g.20gb spans 4 slices in NVML's placement table)."""


def make_mig_node(name: str = "mig-1", gpus: int = 1, profiles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A node whose GPUs HAMi's device plugin registers in MIG mode (A100-40GB: 7 instances at most each; the
    registration of pkg/device/nvidia/device_test.go:2472 at v2.10.0, with `index` and `health`)."""
    node = make_hami_node(name, gpus=gpus, split=7)
    register = [
        {"id": f"GPU-{name}-{index}", "index": index, "count": 7, "devmem": 40960, "devcore": 100,
         "type": "NVIDIA-A100-SXM4-40GB", "mode": "mig", "migProfiles": profiles or A100_PROFILES, "health": True}
        for index in range(gpus)
    ]  # fmt: skip
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = orjson.dumps(register).decode()
    return node


def make_hami_pod(
    name: str = "pod-1",
    gpus: int = 1,
    mem: int | None = None,
    cores: int | None = None,
    namespace: str = "default",
    init: tuple[dict[str, Any], ...] = (),
    **annotations: str,
) -> dict[str, Any]:
    """A pending pod asking HAMi's resources for one container (`init` adds init containers as given)."""
    limits = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": dict(annotations)},
        "spec": {"initContainers": list(init), "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def make_hami_cluster(
    *nodes: dict[str, Any], pods: tuple[dict[str, Any], ...] = (), clock: Callable[[], float] = time.time
) -> Cache:
    cluster = Cache(HAMI, clock=clock)
    cluster.replace(list(nodes), list(pods))
    return cluster


def running_hami_pod(name: str, node: str, gpu: int, mem: int, cores: int) -> dict[str, Any]:
    """A pod HAMi's plugin has allocated `mem` MiB and `cores` % on GPU `gpu` of `node` (make_hami_node's UUIDs)."""
    pod = make_hami_pod(name, mem=mem, cores=cores)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    pod["metadata"]["annotations"] |= {
        "hami.io/vgpu-node": node,
        "hami.io/vgpu-time": "1800000000",
        "hami.io/vgpu-devices-allocated": encode(((Grant(gpu, mem, cores, f"GPU-{node}-{gpu}"),),), {}),
        "hami.io/bind-phase": "success",
    }
    return pod
