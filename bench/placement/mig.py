"""The MIG workload of `make bench-placement` (issue 24): how much of a MIG cluster the extender gives out, against
hami-scheduler v2.10.0's own choice, on one arrival sequence of the trace.

    python -m bench.placement --trace DIR --mig [--seeds 42,43,44] [--workload default] [--nodes N]

- **The cluster**: the trace's nodes whose GPU model can do MIG, every GPU in MIG mode as HAMi's device plugin
  registers it (`hami.io/node-nvidia-register`, `"mode":"mig"`, `count` 7, `devmem` 81920, `devcore` 100) with
  NVML's profiles and placements of an A100-SXM4-80GB (`NVML_A100_80GB`). The trace names its models anonymously:
  its two 8-GPU high-end models G2 and G3 become A100-80GB and H100-80GB (`TRACE_MODELS`); were they under a
  quarter of its GPUs, every GPU node would be an A100-80GB.
- **The pods**: the trace's arrival sequence (`trace.arrivals`, 130 % of these GPUs), each asking
  `nvidia.com/gpumem` = the memory of the smallest profile that holds its share of an 80 GiB GPU (a whole GPU or
  more: the 7g's), `nvidia.com/gpu` its GPU count, its cpu and memory, all annotated `nvidia.com/vgpu-mode: mig`.
- **ours**: `extender serve --protocol hami` as shipped, in process behind the model of kube-scheduler
  (`fast.py`, `kube_model.py`): every pod through it (the second scheduler), its binds recorded as the Binding
  carried them. **HAMi's greedy** (`HamiGreedy`): hami-scheduler v2.10.0 re-implemented for these pods, each rule
  cited at tag v2.10.0; its kube-scheduler samples nodes as the chart configures it, and pods without GPUs go to
  the default scheduler (HAMi's webhook redirects GPU pods only: pkg/scheduler/webhook.go:104-111).
- A pod no node takes is dropped (the paper's method). The end check (`check`) fails the run when two instances
  overlap, a GPU holds more than 7, an instance is not one of its profile's placements, or a node's cpu or
  memory is over.

It only feeds the extender and reads what its binds wrote: it never decides anything for it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson
import yaml

from bench import record as recording
from bench.placement.fast import MIB, InProcessExtender, pod_uid
from bench.placement.hami import uuid_of
from bench.placement.kube_model import ExtenderAnswer, ModelNode, ModelPod, SchedulerModel
from bench.placement.outcome import Outcome
from bench.placement.report import reason_kind, typical_shapes
from bench.placement.trace import (
    MILLI,
    NAMESPACE,
    NODE_PODS,
    TraceError,
    TraceNode,
    TracePod,
    arrivals,
    load,
    synthetic,
)
from extender.core import mig
from extender.core.mig import MigProfile
from extender.settings import Settings
from extender.sources.file import FileBinder

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
TRACE_MODELS = {"G2": A100, "G3": H100}
"""The trace's anonymised 8-GPU high-end models (the rest are T4, P100, V100, A10: no MIG)."""
SLICES = 8
INSTANCES = 7
"""`count` of a MIG GPU: the largest InstanceCount of its profiles (plugin/register.go:196-201)."""
DEVMEM = 81920
DEVCORE = 100
SHARE_OF = 80 * 1024
"""MiB of the 80 GiB GPU a trace pod's share (gpu_milli / 1000) is a share of."""
NVML_A100_80GB = (
    # (name, MemorySizeMB, SMs, SliceCount, starts, size): memory, SMs and slice counts as NVIDIA's NVML mock of an
    # A100-SXM4-80GB gives them (github.com/NVIDIA/go-nvml pkg/nvml/mock/shared/gpus/a100.go); placements as
    # `nvidia-smi mig -lgipp` lists them (the 3g spans 4 slices, the 1g.20gb 2, the 7g all 8).
    ("1g.10gb", 9856, 14, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.20gb", 19968, 14, 1, (0, 2, 4, 6), 2),
    ("2g.20gb", 19968, 28, 2, (0, 2, 4), 2),
    ("3g.40gb", 40192, 42, 3, (0, 4), 4),
    ("4g.40gb", 40192, 56, 4, (0,), 4),
    ("7g.80gb", 80384, 98, 7, (0,), 8),
)


def hami_core(sms: int, largest: int) -> int:
    """A profile's `core` as HAMi's device plugin registers it: ceil(SMs x 100 / the largest profile's SMs)
    (pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go:242-244)."""
    return (sms * 100 + largest - 1) // largest


PROFILES = tuple(
    MigProfile(name, memory, hami_core(sms, 98), slices, tuple((start, size) for start in starts))
    for name, memory, sms, slices, starts, size in NVML_A100_80GB
)
"""H100-80GB GPUs get the same table: the same geometry, and one `nvidia.com/gpumem` then means one profile on
either model."""


# ---- the workload --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigWorkload:
    name: str
    nodes: tuple[TraceNode, ...]
    """The MIG nodes, `model` their GPUs' type as HAMi registers it."""
    pods: tuple[TracePod, ...]
    trace_pods: tuple[TracePod, ...]
    models: dict[str, str]
    """The trace's model -> the MIG GPU type it became."""

    @property
    def gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    def mapping(self) -> str:
        return ", ".join(f"{model} as {kind}" for model, kind in sorted(self.models.items()))


def mig_type(model: str) -> str | None:
    upper = model.upper()
    return A100 if "A100" in upper else H100 if "H100" in upper else TRACE_MODELS.get(model)


def mig_workload(
    name: str, nodes: Sequence[TraceNode], pods: Sequence[TracePod], seed: int, ratio: float, sample: int = 0
) -> MigWorkload:
    """The MIG cluster of the trace's nodes (the module docstring) and the arrival sequence of `pods` for its
    capacity; `sample`: that many of its nodes, drawn with the seed."""
    models = {node.model: kind for node in nodes if (kind := mig_type(node.model))}
    chosen = [node for node in nodes if node.model in models]
    if 4 * sum(node.gpus for node in chosen) < sum(node.gpus for node in nodes):
        models = {node.model: A100 for node in nodes}
        chosen = list(nodes)
    if sample and sample < len(chosen):
        chosen = sorted(random.Random(seed).sample(chosen, sample), key=lambda node: node.name)
    cluster = tuple(replace(node, model=models[node.model]) for node in chosen)
    return MigWorkload(name, cluster, arrivals(pods, cluster, seed, ratio), tuple(pods), models)


def load_mig(parsed: argparse.Namespace, seed: int) -> MigWorkload:
    if parsed.synthetic:
        return synthetic_mig(seed, parsed.ratio)
    loaded = load(parsed.trace, parsed.workload, seed, parsed.ratio)
    return mig_workload(loaded.name, loaded.nodes, loaded.trace_pods, seed, parsed.ratio, parsed.nodes)


def synthetic_mig(seed: int = 7, ratio: float = 1.3) -> MigWorkload:
    """Four A100 and one H100 nodes of 8 GPUs, and the synthetic trace's pods: for tests, in seconds."""
    _, pods = synthetic(seed)
    nodes = [TraceNode(f"mig-{number}", 96000, 393216, 8, "G2") for number in range(4)]
    nodes.append(TraceNode("mig-4", 128000, 786432, 8, "G3"))
    return mig_workload("synthetic", nodes, pods, seed, ratio)


def profile_for(gpu_milli: int) -> MigProfile:
    """The smallest profile that holds a share of an 80 GiB GPU; a whole GPU (or a share no profile holds): the
    largest."""
    need = math.ceil(gpu_milli * SHARE_OF / MILLI)
    ordered = mig.by_size(PROFILES)
    return next((profile for profile in ordered if profile.memory >= need), ordered[-1])


def gpu_memory(pod: TracePod) -> int:
    """`nvidia.com/gpumem` of a GPU pod: its share's profile's memory."""
    return profile_for(pod.gpu_milli).memory


def gpu_types(pod: TracePod, models: dict[str, str]) -> str:
    """`nvidia.com/use-gputype` for a pod restricted to models: the MIG types they became (or the models
    themselves, which no MIG GPU matches)."""
    kinds = sorted({models[model] for model in pod.models if model in models})
    return ",".join(kinds or pod.models)


# ---- the objects ---------------------------------------------------------------------------------------


def node_object(node: TraceNode) -> dict[str, Any]:
    """A Ready node whose GPUs HAMi's device plugin registered in MIG mode (tests/builders.py `make_mig_node`)."""
    profiles = [
        {"name": profile.name, "memoryMB": profile.memory, "core": profile.cores, "sliceCount": profile.slices,
         "placements": [{"start": start, "size": size} for start, size in profile.placements]}
        for profile in PROFILES
    ]  # fmt: skip
    register = [
        {"id": uuid_of(node.name, index), "index": index, "count": INSTANCES, "devmem": DEVMEM, "devcore": DEVCORE,
         "type": node.model, "mode": mig.MODE, "health": True, "migProfiles": profiles}
        for index in range(node.gpus)
    ]  # fmt: skip
    capacity = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(NODE_PODS),
        "nvidia.com/gpu": str(node.gpus * INSTANCES),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {"kubernetes.io/hostname": node.name},
            "annotations": {"hami.io/node-nvidia-register": orjson.dumps(register).decode()},
        },
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_object(pod: TracePod, models: dict[str, str], scheduler_name: str) -> dict[str, Any]:
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    limits = dict(requests)
    annotations = {"nvidia.com/vgpu-mode": mig.MODE}
    if pod.gpus:
        limits |= {"nvidia.com/gpu": str(pod.gpus), "nvidia.com/gpumem": str(gpu_memory(pod))}
        if pod.models:
            annotations["nvidia.com/use-gputype"] = gpu_types(pod, models)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name.lower(), "namespace": NAMESPACE, "uid": pod_uid(pod.name),
                     "annotations": annotations},
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [{"name": "main", "image": "registry.example/none:latest",
                            "resources": {"requests": requests, "limits": limits}}],
        },
    }  # fmt: skip


def model_node(node: TraceNode) -> ModelNode:
    allocatable = {"cpu": node.cpu_milli, "memory": node.memory_mib * MIB, "pods": NODE_PODS}
    return ModelNode(node.name, allocatable | {"nvidia.com/gpu": node.gpus * INSTANCES}, {})


def model_pod(pod: TracePod, body: dict[str, Any]) -> ModelPod:
    """What kube-scheduler's own filters count: cpu, memory and `nvidia.com/gpu` (one per instance, never the
    limit: a node allows 7 per GPU). `nvidia.com/gpumem` is ignored by both configurations (the rendered one's
    `ignoredResources`; HAMi's `ignoredByScheduler`, charts/hami/templates/_helpers.tpl:195-202)."""
    requests = {"cpu": pod.cpu_milli, "memory": pod.memory_mib * MIB} | (
        {"nvidia.com/gpu": pod.gpus} if pod.gpus else {}
    )
    return ModelPod(body["metadata"]["name"], requests, (), body)


# ---- the result and its check --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instance:
    profile: str
    start: int
    size: int
    memory: int
    cores: int


Placed = tuple[tuple[int, Instance], ...]
"""A bound GPU pod's instances, with the index of their GPU."""


@dataclass(slots=True)
class MigResult:
    policy: str
    workload: MigWorkload
    outcomes: list[Outcome]
    placed: dict[str, Placed]
    """By pod name (as the trace names it)."""
    seconds: float
    problems: list[str] = field(default_factory=list)

    def gpus(self) -> dict[tuple[str, int], list[Instance]]:
        """Every GPU of the cluster, with the instances it holds."""
        held: dict[tuple[str, int], list[Instance]] = {
            (node.name, index): [] for node in self.workload.nodes for index in range(node.gpus)
        }
        for outcome in self.outcomes:
            for index, instance in self.placed.get(outcome.pod.name, ()):
                held[(outcome.node, index)].append(instance)
        return held


def check(result: MigResult) -> list[str]:
    """No two instances overlap, no GPU holds more than 7 or more memory than it has, every instance is one of
    its profile's placements with its memory, every bound GPU pod has one instance per GPU asked, no node's cpu
    or memory is over."""
    found = []
    by_name = {profile.name: profile for profile in PROFILES}
    for (name, index), instances in result.gpus().items():
        where = f"{name} GPU {index}"
        clash = mig.clash([(instance.start, instance.size) for instance in instances])
        if clash is not None:
            found.append(f"{where}: instances overlap at slice {clash[0]}")
        if len(instances) > INSTANCES:
            found.append(f"{where}: {len(instances)} instances, more than {INSTANCES}")
        if sum(instance.memory for instance in instances) > DEVMEM:
            found.append(f"{where}: {sum(instance.memory for instance in instances)} MiB given of {DEVMEM}")
        for instance in instances:
            profile = by_name.get(instance.profile)
            if profile is None or (instance.start, instance.size) not in profile.placements:
                found.append(f"{where}: {instance.profile} at ({instance.start}, {instance.size}) is no placement")
            elif instance.memory != profile.memory:
                found.append(f"{where}: {instance.profile} recorded with {instance.memory} MiB")
    cpu: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for outcome in result.outcomes:
        if outcome.node:
            cpu[outcome.node] += outcome.pod.cpu_milli
            memory[outcome.node] += outcome.pod.memory_mib
            if len(result.placed.get(outcome.pod.name, ())) != outcome.pod.gpus:
                found.append(f"pod {outcome.pod.name}: bound with {len(result.placed.get(outcome.pod.name, ()))} "
                             f"instances for {outcome.pod.gpus} GPUs")  # fmt: skip
    for node in result.workload.nodes:
        if cpu[node.name] > node.cpu_milli or memory[node.name] > node.memory_mib:
            found.append(f"{node.name}: cpu {cpu[node.name]}m, memory {memory[node.name]}Mi requested, over")
    return found


# ---- ours: the extender as shipped ---------------------------------------------------------------------


class RecordingBinder(FileBinder):
    """The file source's binder, keeping the annotations each Binding carried."""

    def __init__(self, binder: FileBinder) -> None:
        super().__init__(binder.cluster, [])
        self.annotations: dict[str, dict[str, str]] = {}

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        self.annotations[pod["metadata"]["uid"]] = dict(annotations)
        await super().bind(pod, node, annotations)


def instances_written(annotations: dict[str, str], node: str) -> Placed:
    """The instances a Binding's HAMi annotations give (`hami.io/vgpu-mig-allocations`, with the memory and
    compute `hami.io/vgpu-devices-allocated` records at the same container and position), read here apart from
    the extender's own decoders."""
    entries = annotations.get("hami.io/vgpu-devices-allocated", "").split(";")
    containers = [[device.split(",") for device in entry.split(":") if "," in device] for entry in entries]
    devices = [found for found in containers if found]  # a GPU container's entry each; ours have one container
    found = []
    for entry in orjson.loads(annotations.get("hami.io/vgpu-mig-allocations") or "[]"):
        uuid, _, memory, cores = devices[entry["containerIndex"]][entry["deviceIndex"]]
        prefix = f"GPU-{node}-"
        if uuid != entry["gpuUUID"] or not uuid.startswith(prefix):
            raise RuntimeError(f"bind to {node}: reservation {entry} does not match its device entry {uuid}")
        placement = entry["placement"]
        instance = Instance(entry["profile"], placement["start"], placement["size"], int(memory), int(cores))
        found.append((int(uuid[len(prefix) :]), instance))
    return tuple(found)


def ignored_resources(config_yaml: str, scheduler_name: str) -> frozenset[str]:
    for profile in (yaml.safe_load(config_yaml) or {}).get("profiles") or []:
        if profile.get("schedulerName") == scheduler_name:
            for entry in profile.get("pluginConfig") or []:
                if entry.get("name") == "NodeResourcesFit":
                    return frozenset((entry.get("args") or {}).get("ignoredResources") or ())
    return frozenset()


def replay_ours(workload: MigWorkload, settings: Settings, config_yaml: str, seed: int) -> MigResult:
    """Every pod through the extender's verbs in process, as `fast.replay` plays them (module docstring there)."""
    started = time.perf_counter()
    nodes = [model_node(node) for node in sorted(workload.nodes, key=lambda node: node.name)]
    by_name = {node.name: node for node in nodes}
    extender = InProcessExtender(settings, [node_object(node) for node in workload.nodes])
    binder = RecordingBinder(extender.source.binder)
    extender.source.binder = binder
    scheduler = SchedulerModel.parse(config_yaml, settings.scheduler_name, seed)
    ignored = ignored_resources(config_yaml, settings.scheduler_name)
    outcomes, placed = [], {}
    try:
        for trace_pod in workload.pods:
            body = pod_object(trace_pod, workload.models, settings.scheduler_name)
            pod = model_pod(trace_pod, body)
            pod = replace(pod, requests={name: value for name, value in pod.requests.items() if name not in ignored})
            extender.shown(body)
            decision = scheduler.schedule(pod, nodes, extender)
            reasons = decision.reasons
            if decision.node:
                scheduler.assume(pod, by_name[decision.node])
                error = extender.bind(pod, decision.node)  # every pod: the rendered managedResources are []
                if error:
                    scheduler.forget(pod, by_name[decision.node])
                    reasons = {f"bind: {error}": 1}
            if not decision.node or reasons:
                extender.shown(body, deleted=True)  # dropped, as the paper's method drops it
                outcomes.append(Outcome(trace_pod, "", reasons))
                continue
            outcomes.append(Outcome(trace_pod, decision.node))
            written = binder.annotations.get(body["metadata"]["uid"], {})
            placed[trace_pod.name] = instances_written(written, decision.node)
        result = MigResult("ours", workload, outcomes, placed, time.perf_counter() - started)
        result.problems = check(result) + [f"the extender's cache: {line}" for line in extender.cache.overcommitted()]
        return result
    finally:
        extender.close()


# ---- HAMi's greedy: hami-scheduler v2.10.0 -------------------------------------------------------------

F32 = np.float32
WEIGHT = F32(10)
"""util.Weight (pkg/util/types.go:99)."""
HAMI_MANAGED = frozenset({"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"})


@functools.cache
def hami_candidate(occupied: tuple[tuple[int, int], ...], memory: int) -> tuple[MigProfile, tuple[int, int]] | None:
    """`selectMigCandidate` (pkg/device/nvidia/device.go:623-639): the smallest profile by memory then slices that
    holds `memory` and has a placement free, at the first free placement in HAMi's order (mig_topology.go:26-80)."""
    profile = mig.placeable(PROFILES, occupied, memory)
    placement = mig.hami_placement(profile, occupied) if profile is not None else None
    return (profile, placement) if profile is not None and placement is not None else None


@dataclass(slots=True)
class HamiGpu:
    """One GPU as hami-scheduler's DeviceUsage counts it (getNodesUsage, pkg/scheduler/scheduler.go:776-790):
    each instance one `Used`, its profile's memory and core. Mutable."""

    type: str
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0
    instances: list[Instance] = field(default_factory=list)

    def occupied(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted((instance.start, instance.size) for instance in self.instances))

    def score(self) -> np.float32:
        """ComputeScore (pkg/scheduler/policy/gpu_policy.go:194-221) in float32, weights 1: the request's own part
        is skipped, its type "NVIDIA" never equal to the GPU's (lines 203-205)."""
        used = F32(self.used) / F32(INSTANCES) + F32(self.usedcores) / F32(DEVCORE)
        return WEIGHT * (used + F32(self.usedmem) / F32(DEVMEM))

    def refuses(self, memory: int, types: tuple[str, ...]) -> bool:
        """Fit's checks before the MIG rule, for a container asking `memory` MiB and no cores (device.go:730-813):
        its type, a slot, the memory, and the cores (HAMi's chart sets defaultCores 0)."""
        if types and not any(wanted in self.type.upper() for wanted in types):
            return True
        if self.used >= INSTANCES or DEVMEM - self.usedmem < memory or DEVCORE - self.usedcores < 0:
            return True
        return self.usedcores == DEVCORE  # "You can't allocate core=0 job to an already full GPU"


class HamiGreedy:
    """hami-scheduler's filter as an extender of the kube-scheduler model: of the nodes kube-scheduler passes, the
    one its node policy (binpack, charts/hami/values.yaml:76-78) scores highest among those where Fit places the
    pod, with the GPUs and instances Fit and AddResourceUsage choose. Mutable: the usage of every GPU."""

    def __init__(self, nodes: Sequence[TraceNode], seed: int) -> None:
        self.gpus = {node.name: [HamiGpu(node.model) for _ in range(node.gpus)] for node in nodes}
        self.version = dict.fromkeys(self.gpus, 0)
        self.rng = random.Random(seed)
        self.fits: dict[tuple[str, int, int, tuple[str, ...]], tuple[int, tuple[int, ...] | None]] = {}
        self.chosen: dict[str, tuple[str, tuple[int, ...], int]] = {}

    def __call__(self, verb: str, pod: ModelPod, names: list[str]) -> ExtenderAnswer:
        """Filter (scheduler.go:1067-1153): every node scored (score.go:356-407), the best one returned alone."""
        limits = pod.body["spec"]["containers"][0]["resources"]["limits"]
        count, memory = int(limits["nvidia.com/gpu"]), int(limits["nvidia.com/gpumem"])
        listed = pod.body["metadata"]["annotations"].get("nvidia.com/use-gputype", "")
        types = tuple(part.strip().upper() for part in listed.split(",") if part.strip())
        fitting, failed = {}, {}
        for name in names:
            chosen = self.fit(name, count, memory, types)
            if chosen is None:
                failed[name] = "HAMi: no GPU here fits (CardMigTopologyInfeasible or exhausted)"
            else:
                fitting[name] = chosen
        if not fitting:
            return ExtenderAnswer([], failed)
        scores = {name: self.node_score(name) for name in fitting}
        best = max(scores.values())
        top = [name for name in fitting if scores[name] == best]
        # binpack: the highest score (node_policy.go:48-54, scheduler.go:1117-1118); equal scores come in the order
        # the scoring goroutines finished, then an unstable sort: at random here.
        node = top[self.rng.randrange(len(top))]
        self.chosen[pod.name] = (node, fitting[node], memory)
        return ExtenderAnswer([node], failed)

    def fit(self, node: str, count: int, memory: int, types: tuple[str, ...]) -> tuple[int, ...] | None:
        """The GPUs (by index) Fit gives a container of `count` GPUs of `memory` MiB, or None; memoised per state
        of the node."""
        key = (node, count, memory, types)
        cached = self.fits.get(key)
        if cached is not None and cached[0] == self.version[node]:
            return cached[1]
        gpus = self.gpus[node]
        # The GPU policy spread (values.yaml:78): sort.Sort by score, highest first (gpu_policy.go:122-126; an
        # insertion sort, stable, for up to 12 GPUs), and Fit walks the list from its end (device.go:727).
        order = sorted(range(len(gpus)), key=lambda index: -gpus[index].score())
        chosen: list[int] = []
        position = len(order) - 1
        while position >= 0 and len(chosen) < count:
            index = order[position]
            gpu = gpus[index]
            if gpu.refuses(memory, types) or not self._room(gpu, chosen.count(index), memory):
                position -= 1
                continue
            chosen.append(index)  # a MIG GPU is tried again for the same container (device.go:846-848)
        result = tuple(chosen) if len(chosen) == count else None
        self.fits[key] = (self.version[node], result)
        return result

    @staticmethod
    def _room(gpu: HamiGpu, taken: int, memory: int) -> bool:
        """CustomFilterRule (device.go:602-621): the container's instances already picked on this GPU placed
        first, then one more."""
        occupied = gpu.occupied()
        for _ in range(taken):
            picked = hami_candidate(occupied, memory)
            if picked is None:
                return False
            occupied = tuple(sorted((*occupied, picked[1])))
        return hami_candidate(occupied, memory) is not None

    def node_score(self, node: str) -> np.float32:
        """ComputeDefaultScore over the node's GPUs before the pod (node_policy.go:106-130, score.go:327); the
        device part NVIDIA's ScoreNode adds is 0 (device.go:641-643)."""
        gpus = self.gpus[node]
        used = sum(gpu.used for gpu in gpus) / F32(INSTANCES * len(gpus))
        cores = sum(gpu.usedcores for gpu in gpus) / F32(DEVCORE * len(gpus))
        return WEIGHT * (used + cores + sum(gpu.usedmem for gpu in gpus) / F32(DEVMEM * len(gpus)))

    def bind(self, pod: str) -> tuple[str, Placed]:
        """AddResourceUsage for each GPU the filter chose (device.go:645-664): the instance selected again against
        the GPU as it now is, its profile's memory and core recorded."""
        node, indexes, memory = self.chosen.pop(pod)
        placed = []
        for index in indexes:
            gpu = self.gpus[node][index]
            candidate = hami_candidate(gpu.occupied(), memory)
            if candidate is None:
                raise RuntimeError(f"HAMi's greedy: {pod} on {node} GPU {index} has no instance at bind")
            profile, (start, size) = candidate
            instance = Instance(profile.name, start, size, profile.memory, profile.cores)
            gpu.instances.append(instance)
            gpu.used, gpu.usedmem, gpu.usedcores = (
                gpu.used + 1,
                gpu.usedmem + profile.memory,
                gpu.usedcores + profile.cores,
            )
            placed.append((index, instance))
        self.version[node] += 1
        return node, tuple(placed)


def replay_hami(workload: MigWorkload, seed: int) -> MigResult:
    """GPU pods through hami-scheduler: a kube-scheduler profile with default plugins and the adaptive share of
    nodes, HAMi's filter its extender (charts/hami/templates/scheduler/configmap.yaml:25-43); other pods
    through the default scheduler. Both see the same nodes."""
    started = time.perf_counter()
    nodes = [model_node(node) for node in sorted(workload.nodes, key=lambda node: node.name)]
    by_name = {node.name: node for node in nodes}
    hami = HamiGreedy(workload.nodes, seed)
    gpu_scheduler = SchedulerModel(has_extender=True, extender_filter=True, managed=HAMI_MANAGED, seed=seed)
    cpu_scheduler = SchedulerModel(seed=seed)
    outcomes, placed = [], {}
    for trace_pod in workload.pods:
        pod = model_pod(trace_pod, pod_object(trace_pod, workload.models, "hami-scheduler"))
        if trace_pod.gpus:
            decision = gpu_scheduler.schedule(pod, nodes, hami)
        else:
            decision = cpu_scheduler.schedule(pod, nodes, None)
        outcomes.append(Outcome(trace_pod, decision.node, decision.reasons))
        if decision.node:
            gpu_scheduler.assume(pod, by_name[decision.node])  # one cache: either scheduler's assume counts
            if trace_pod.gpus:
                _, placed[trace_pod.name] = hami.bind(pod.name)
    result = MigResult("HAMi's greedy", workload, outcomes, placed, time.perf_counter() - started)
    result.problems = check(result)
    return result


# ---- the figures ---------------------------------------------------------------------------------------


def typical_profiles(workload: MigWorkload) -> list[tuple[MigProfile, float, int, int]]:
    """The typical GPU pods of the trace (`report.typical_shapes`): the profile each asks, its share of those
    pods, its cpu and memory."""
    shapes = [(shape, share) for shape, share in typical_shapes(workload.trace_pods) if shape.gpus]
    total = sum(share for _, share in shapes)
    return [(profile_for(shape.gpu_milli), share / total, shape.cpu_milli, shape.memory_mib) for shape, share in shapes]


def figures(result: MigResult) -> dict[str, Any]:
    """Allocated (profile memory, slices, the pods' own demand), pods placed, and the free slices at the end:
    *fragmented* as the paper weighs it (`report.fragmentation`: for each typical GPU pod, with its share, the free
    slices of a node it cannot run on for its cpu or memory, else of the GPUs there where its profile has no
    placement free), *cut* the part of it the slices alone make (cpu and memory left out), *stranded* on the GPUs
    where no typical profile has a placement free (or that hold their 7)."""
    gpus = result.gpus()
    instances = [instance for held in gpus.values() for instance in held]
    typical = typical_profiles(result.workload)
    bound = [outcome for outcome in result.outcomes if outcome.node]
    cpu, memory = Counter[str](), Counter[str]()
    for outcome in bound:
        cpu[outcome.node] += outcome.pod.cpu_milli
        memory[outcome.node] += outcome.pod.memory_mib
    nodes = {node.name: node for node in result.workload.nodes}
    free = fragmented = cut = stranded = 0.0
    for (name, _), held in gpus.items():
        occupied = [(instance.start, instance.size) for instance in held]
        left = SLICES - sum(size for _, size in occupied)
        cpu_left, memory_left = nodes[name].cpu_milli - cpu[name], nodes[name].memory_mib - memory[name]
        usable = 0  # typical profiles with a placement free on this GPU
        for profile, share, cores, mib in typical:
            placeable = len(held) < INSTANCES and bool(mig.free_placements(profile, occupied))
            usable += placeable
            cut += 0 if placeable else share * left
            if not placeable or cores > cpu_left or mib > memory_left:
                fragmented += share * left
        free += left
        stranded += 0 if usable else left
    slices = len(gpus) * SLICES
    refused = Counter(
        "+".join(sorted({reason_kind(reason) for reason in outcome.reasons}) or ["unknown"])
        for outcome in result.outcomes
        if not outcome.node
    )
    text = "".join(f"{outcome.pod.name} {outcome.node} {result.placed.get(outcome.pod.name)}\n" for outcome in bound)
    names: dict[str, float] = {}
    for profile, share, _, _ in typical:
        names[profile.name] = names.get(profile.name, 0.0) + share
    return {
        "memory": 100 * sum(instance.memory for instance in instances) / (len(gpus) * DEVMEM),
        "slices": 100 * sum(instance.size for instance in instances) / slices,
        "demand": 100 * sum(outcome.pod.gpu_demand for outcome in bound) / (len(gpus) * MILLI),
        "free": 100 * free / slices,
        "fragmented": 100 * fragmented / slices,
        "cut": 100 * cut / slices,
        "stranded": 100 * stranded / slices,
        "typical": ", ".join(f"{name} {share:.0%}" for name, share in names.items()),
        "placed": len(bound),
        "pods": len(result.outcomes),
        "placed_kinds": Counter(outcome.pod.kind for outcome in bound),
        "kinds": Counter(outcome.pod.kind for outcome in result.outcomes),
        "refused": refused,
        "profiles": Counter(instance.profile for instance in instances),
        "placements": hashlib.sha256(text.encode()).hexdigest()[:12],
    }


def render(result: MigResult, seed: int) -> str:
    shown = figures(result)
    workload = result.workload
    kinds = ", ".join(f"{kind} {shown['placed_kinds'][kind]:,}/{total:,}" for kind, total in shown["kinds"].items())
    profiles = ", ".join(f"{name} {count:,}" for name, count in sorted(shown["profiles"].items()))
    problems = result.problems
    return "\n".join(
        [
            f"== {result.policy}, seed {seed}: workload {workload.name}, {len(workload.nodes):,} MIG nodes, "
            f"{workload.gpus:,} GPUs ({workload.mapping()}), {len(workload.pods):,} pods arriving",
            f"GPU memory allocated: {shown['memory']:.1f} % (the instances' profile memory over {DEVMEM:,} MiB a GPU); "
            f"slices in use: {shown['slices']:.1f} %; the pods' own demand placed: {shown['demand']:.1f} %",
            f"pods placed {shown['placed']:,} of {shown['pods']:,} ({kinds}); instances: {profiles}",
            f"slices free at the end {shown['free']:.1f} %: fragmented {shown['fragmented']:.1f} % (the paper's "
            f"expected fragment, typical GPU pods asking {shown['typical']}; by the slices alone "
            f"{shown['cut']:.1f} %), stranded {shown['stranded']:.1f} % (no typical profile has a placement there)",
            "refused pods by reason: "
            + ", ".join(f"{kind} {count:,}" for kind, count in shown["refused"].most_common()),
            f"{result.seconds:.1f} s; placements {shown['placements']}",
            "end check: ok" if not problems else f"end check FAILED: {'; '.join(problems[:10])}",
        ]
    )


SUMMARY = (("memory", "GPU memory allocated %"), ("slices", "slices in use %"), ("placed", "pods placed"),
           ("free", "slices free %"), ("fragmented", "fragmented %"), ("cut", "by the slices alone %"),
           ("stranded", "stranded %"))  # fmt: skip


def summary(runs: list[tuple[int, MigResult, MigResult]]) -> str:
    lines = ["", f"== summary, MIG: {', '.join(label for _, label in SUMMARY)}"]
    for policy in ("ours", "HAMi's greedy"):
        shown = [(seed, figures(ours if policy == "ours" else hami)) for seed, ours, hami in runs]
        for seed, one in shown:
            lines.append(f"{policy}, seed {seed}: {_row([float(one[key]) for key, _ in SUMMARY])}")
        if len(shown) > 1:
            means = [statistics.mean(float(one[key]) for _, one in shown) for key, _ in SUMMARY]
            lines.append(f"{policy}, mean: {_row(means)}")
    return "\n".join(lines)


def _row(values: list[float]) -> str:
    return ", ".join(
        f"{value:,.0f}" if key == "placed" else f"{value:.1f}" for (key, _), value in zip(SUMMARY, values, strict=True)
    )


RECORDED = ("memory", "slices", "demand", "free", "fragmented", "cut", "stranded")
"""The figures of `figures` a run record keeps, in %."""


def entry(result: MigResult, seed: int) -> dict[str, Any]:
    """A run as its record keeps it (the placement page's MIG table, `bench/figures_placement.mig_table`)."""
    shown = figures(result)
    return {
        "scheduler": result.policy,
        "seed": seed,
        "workload": result.workload.name,
        "nodes": len(result.workload.nodes),
        "gpus": result.workload.gpus,
        **{key: round(float(shown[key]), 3) for key in RECORDED},
        "placed": shown["placed"],
        "pods": shown["pods"],
        "placements": shown["placements"],
        "seconds": round(result.seconds, 1),
        "problems": result.problems[:10],
    }


def main(parsed: argparse.Namespace, settings: Settings, config_yaml: str) -> int:
    """Both policies on each seed's sequence; non-zero when a run fails or an end check finds a problem. With
    `--record`, each seed's two runs join the record as the seed ends."""
    failed = False
    runs = []
    kept: list[dict[str, Any]] = []
    for seed in parsed.seed_list:
        try:
            workload = load_mig(parsed, seed)
        except TraceError as error:
            print(f"bench-placement --mig: seed {seed}: {error}", flush=True)
            failed = True
            continue
        ours = replay_ours(workload, settings, config_yaml, seed)
        print(render(ours, seed), flush=True)
        hami = replay_hami(workload, seed)
        print(render(hami, seed), flush=True)
        failed |= bool(ours.problems or hami.problems)
        runs.append((seed, ours, hami))
        kept += [entry(ours, seed), entry(hami, seed)]
        recording.result("mig", kept)
    print(summary(runs))
    return 1 if failed else 0
