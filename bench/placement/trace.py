"""The workload of `make bench-placement`: a GPU-sharing trace's nodes and pods, the arrival sequence of the
ATC'23 paper's method, and the Kubernetes objects they become.

The trace is Alibaba's `cluster-trace-gpu-v2023` (repository alibaba/clusterdata, folder
`cluster-trace-gpu-v2023/csv/`; its terms allow research and study use, so it is read from a directory the user
names and never committed): `openb_node_list_gpu_node.csv` (`sn, cpu_milli, memory_mib, gpu, model`) and one
`openb_pod_list_<workload>.csv` per workload (`name, cpu_milli, memory_mib, num_gpu, gpu_milli` and, in most
files, `gpu_spec`: allowed GPU models separated by `|`, and `creation_time, deletion_time` in seconds, which give
each pod its lifetime for the churn mode: deletion minus creation, or "runs to the end" for a pod deleted at the
trace's last deletion time, which is when the trace was cut). `synthetic` builds a small workload of the same
shape for the test suite.

The arrival sequence (`arrivals`) follows the paper's simulator (hkust-adsl/kubernetes-scheduler-simulator,
`pkg/simulator/simulator.go` `SortClusterPods` and `tuneUpPods`, run with `--shuffle-pod=true -tune 1.3`):
the pods sorted by name and shuffled with the seed, then pods drawn from the trace with replacement appended
until the GPU demand that arrived would pass `ratio` x the cluster's GPU capacity. (Their loop compares the
demand per GPU of the drawn pod against the room left, and adds its total; we compare the total, which is what
"the demand that arrived" means. Python's generator is not Go's, so the same seed gives another shuffle: the
seeds name our sequences, not theirs.)

The objects (`node_object`, `pod_object`) speak the gpushare protocol with one GPU = 1000 units of
`aliyun.com/gpu-mem`, so a milli-GPU share is exact: a node of G GPUs advertises `aliyun.com/gpu-count: G` and
`aliyun.com/gpu-mem: G*1000`; a pod asks `aliyun.com/gpu-mem: num_gpu*gpu_milli` and, beyond one GPU,
`aliyun.com/gpu-count: num_gpu`. A GPU model is the node label `MODEL_LABEL`, and a pod's allowed models a
required node affinity on it. cpu and memory are requests (and limits); nodes allow 1001 pods, as the paper's
node objects do, so only cpu, memory and GPUs limit a node. `GPUSHARE` bundles them with the reading of an
allocation back from a bound pod; `hami.HAMI` is the same trace in HAMi's protocol.

Pure: it reads CSV files and builds values and dicts, never talks to a process.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from extender.core.protocols.gpushare import Profile
from extender.core.resources import parse_count

MILLI = 1000
"""Units of aliyun.com/gpu-mem per GPU: a milli-GPU share is one unit."""
FOREVER = -1
"""A pod's lifetime when it outlives the trace."""
MODEL_LABEL = "nvidia.com/gpu.product"
"""The node label that names a node's GPU model (NVIDIA GPU feature discovery's), as `extender serve` reads it
by default (`--model-label`)."""
NODE_PODS = 1001
"""Pods a node allows: the paper's node objects say 1001, so no node runs out of pod slots first."""
NAMESPACE = "default"
NODES_FILE = "openb_node_list_gpu_node.csv"
WORKLOADS = ("default", "gpushare100", "gpushare80", "gpushare60", "gpushare40", "gpushare20", "gpuspec33",
             "gpuspec25", "gpuspec20", "gpuspec10", "gpuspec05", "multigpu50", "multigpu40", "multigpu30",
             "multigpu20", "cpu250", "cpu200", "cpu100", "cpu050")  # fmt: skip
"""The pod lists the trace has (`openb_pod_list_<name>.csv`), for the error when one is missing."""


class TraceError(Exception):
    """The trace directory or one of its files cannot be read; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    """GPUs it spans (num_gpu); 0 for a CPU-only pod."""
    gpu_milli: int
    """Share of each GPU, in milli-GPU (1000: whole GPUs)."""
    models: tuple[str, ...] = ()
    """GPU models it may run on (gpu_spec); empty: any."""
    lifetime: int = FOREVER
    """Seconds it runs once started (the churn mode; the fill-up replay never deletes a pod); `FOREVER`: until the
    end of any run, as a pod still running when the trace was cut."""

    @property
    def gpu_demand(self) -> int:
        """Milli-GPU in all."""
        return self.gpus * self.gpu_milli

    @property
    def kind(self) -> str:
        """cpu, share, whole or multi: how the report groups pods."""
        if not self.gpus:
            return "cpu"
        if self.gpus > 1:
            return "multi"
        return "share" if self.gpu_milli < MILLI else "whole"


@dataclass(frozen=True, slots=True)
class Workload:
    """A cluster and the pods that arrive at it, in order."""

    name: str
    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]
    """The arrival sequence."""
    trace_pods: tuple[TracePod, ...]
    """The trace's own pods (before the shuffle and the appended draws): for the report's typical pods only,
    never for a placement decision."""

    @property
    def gpu_capacity(self) -> int:
        """Milli-GPU of all nodes."""
        return sum(node.gpus for node in self.nodes) * MILLI

    def arrived_ratio(self) -> list[float]:
        """After each pod, the GPU demand arrived so far over the capacity."""
        total, capacity, ratios = 0, self.gpu_capacity, []
        for pod in self.pods:
            total += pod.gpu_demand
            ratios.append(total / capacity)
        return ratios


# ---- reading the trace ---------------------------------------------------------------------------------


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as error:
        raise TraceError(f"{path}: {error.strerror or error}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [column for column in required if column not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: no column {', '.join(missing)} (has {', '.join(reader.fieldnames or ())})")
        yield from enumerate(reader, start=2)


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(float(text)) if text else 0
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} {text!r} is not a number") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: {column} {value} is negative")
    return value


def read_nodes(directory: Path) -> tuple[TraceNode, ...]:
    path = directory / NODES_FILE
    nodes = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        gpus = _int(path, line, row, "gpu")
        if not gpus:
            continue  # the GPU node list has none; a CPU node never holds a GPU pod
        nodes.append(
            TraceNode(
                row["sn"].strip(),
                _int(path, line, row, "cpu_milli"),
                _int(path, line, row, "memory_mib"),
                gpus,
                (row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no GPU nodes")
    return tuple(nodes)


def read_pods(directory: Path, workload: str) -> tuple[TracePod, ...]:
    path = directory / f"openb_pod_list_{workload}.csv"
    if not path.exists():
        raise TraceError(f"{path}: no such file (the trace's workloads: {', '.join(WORKLOADS)})")
    pods = []
    rows = list(_rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")))
    timed = bool(rows) and all(row.get("deletion_time") not in (None, "", "nan") for _, row in rows)
    cut = max((_int(path, line, row, "deletion_time") for line, row in rows), default=0) if timed else 0
    for line, row in rows:
        gpus = _int(path, line, row, "num_gpu")
        milli = min(_int(path, line, row, "gpu_milli"), MILLI) if gpus else 0
        if gpus and not milli:
            raise TraceError(f"{path}:{line}: num_gpu {gpus} with gpu_milli 0")
        if gpus > 1 and milli != MILLI:
            raise TraceError(f"{path}:{line}: {gpus} GPUs of {milli} milli each (multi-GPU pods take whole GPUs)")
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted(model for model in spec.split("|") if model and model != "nan")) if gpus else ()
        lifetime = FOREVER
        if timed:
            deleted = _int(path, line, row, "deletion_time")
            created = _int(path, line, row, "creation_time")
            if deleted < created:
                raise TraceError(f"{path}:{line}: deletion_time {deleted} before creation_time {created}")
            lifetime = FOREVER if deleted >= cut else deleted - created
        pods.append(
            TracePod(
                row["name"].strip(),
                _int(path, line, row, "cpu_milli"),
                _int(path, line, row, "memory_mib"),
                gpus,
                milli,
                models,
                lifetime,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)


def trace_folder(directory: str | Path) -> Path:
    """The trace's csv directory, given it or its parent (the repository's cluster-trace-gpu-v2023/)."""
    folder = Path(directory)
    if (folder / "csv" / NODES_FILE).exists():
        folder = folder / "csv"
    if not (folder / NODES_FILE).exists():
        raise TraceError(
            f"{folder}: no {NODES_FILE}: TRACE must be the trace's csv directory (cluster-trace-gpu-v2023/csv in the "
            "alibaba/clusterdata repository)"
        )
    return folder


def load(directory: str | Path, workload: str = "default", seed: int = 42, ratio: float = 1.3) -> Workload:
    """The trace's nodes and the arrival sequence of one of its workloads."""
    folder = trace_folder(directory)
    nodes = read_nodes(folder)
    pods = read_pods(folder, workload)
    return Workload(workload, nodes, arrivals(pods, nodes, seed, ratio), pods)


# ---- the paper's arrival sequence ----------------------------------------------------------------------


def arrivals(pods: Sequence[TracePod], nodes: Sequence[TraceNode], seed: int, ratio: float) -> tuple[TracePod, ...]:
    """The pods shuffled with `seed`, then draws from them appended (or random ones dropped, when the trace alone
    is more) until the GPU demand is `ratio` x the nodes' GPU capacity (see the module's docstring)."""
    rng = random.Random(seed)
    ordered = sorted(pods, key=lambda pod: pod.name)
    rng.shuffle(ordered)
    target = ratio * sum(node.gpus for node in nodes) * MILLI
    total = sum(pod.gpu_demand for pod in ordered)
    while total > target and ordered:
        total -= ordered.pop(rng.randrange(len(ordered))).gpu_demand
    source = sorted(pods, key=lambda pod: pod.name)
    drawn = 0
    while source:
        pod = source[rng.randrange(len(source))]
        if total + pod.gpu_demand > target:
            break
        ordered.append(replace(pod, name=f"{pod.name}-tuned-{drawn}"))
        total += pod.gpu_demand
        drawn += 1
    return tuple(ordered)


# ---- a small workload of the same shape, for tests -----------------------------------------------------

SYNTHETIC_NODES = (
    # (count, cpu cores, memory GiB, GPUs, model): the trace's main kinds at a small scale
    (6, 96, 384, 8, "G2"),
    (5, 104, 512, 2, "T4"),
    (2, 16, 120, 2, "P100"),
    (1, 128, 768, 8, "G3"),
    (1, 32, 128, 4, "V100M16"),
)
SYNTHETIC_PODS = (
    # (weight, cpu milli, memory MiB, GPUs, milli per GPU, models)
    (20, 11300, 32768, 1, 1000, ()),
    (12, 3152, 12288, 1, 810, ()),
    (9, 11908, 24576, 1, 470, ()),
    (6, 8000, 16384, 1, 470, ()),
    (4, 4000, 8192, 1, 320, ()),
    (3, 11908, 24576, 1, 650, ()),
    (2, 4000, 8192, 1, 230, ()),
    (3, 16000, 65536, 1, 1000, ("V100M16", "G3")),
    (1, 44000, 163840, 4, 1000, ()),
    (1, 22000, 81920, 2, 1000, ()),
    (6, 12500, 24576, 0, 0, ()),
    (3, 32000, 65536, 0, 0, ()),
)


def synthetic(seed: int = 7, scale: int = 1, pods: int = 0) -> tuple[tuple[TraceNode, ...], tuple[TracePod, ...]]:
    """Nodes and trace pods shaped like the trace's `default` workload (share, whole, multi-GPU and CPU-only pods,
    some restricted to models), `scale` times the base cluster of 15 nodes and 58 GPUs; `pods` pods (default:
    about the GPU capacity's worth). The same arguments give the same values."""
    rng = random.Random(seed)
    nodes = []
    for count, cores, memory, gpus, model in SYNTHETIC_NODES:
        for _ in range(count * scale):
            nodes.append(TraceNode(f"node-{len(nodes):04d}", cores * 1000, memory * 1024, gpus, model))
    capacity = sum(node.gpus for node in nodes) * MILLI
    weights = [row[0] for row in SYNTHETIC_PODS]
    made: list[TracePod] = []
    demand = 0
    while (pods and len(made) < pods) or (not pods and demand < capacity):
        _, cpu, memory, gpus, milli, models = rng.choices(SYNTHETIC_PODS, weights=weights)[0]
        made.append(TracePod(f"pod-{len(made):05d}", cpu, memory, gpus, milli, models))
        demand += gpus * milli
    lives = random.Random(seed * 7919 + 1)  # its own stream: the shapes stay those of the seed
    made = [replace(pod, lifetime=synthetic_lifetime(lives)) for pod in made]
    return tuple(nodes), tuple(made)


def synthetic_lifetime(rng: random.Random) -> int:
    """A lifetime shaped like the trace's (median about 9 minutes, a tenth beyond 2 hours, 1 % outliving it)."""
    if rng.random() < 0.01:
        return FOREVER
    return max(10, int(rng.lognormvariate(6.3, 1.8)))


def synthetic_workload(seed: int = 7, scale: int = 1, ratio: float = 1.3) -> Workload:
    nodes, pods = synthetic(seed, scale)
    return Workload("synthetic", nodes, arrivals(pods, nodes, seed, ratio), pods)


# ---- Kubernetes objects --------------------------------------------------------------------------------

GPU_MEM = "aliyun.com/gpu-mem"
GPU_COUNT = "aliyun.com/gpu-count"
PROFILE = Profile()
"""gpushare's resource and annotation names, as the extender ships them."""


def node_object(node: TraceNode) -> dict[str, Any]:
    """A Ready Node with the trace node's cpu, memory and GPUs (gpushare's resources, 1000 units per GPU)."""
    capacity = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(NODE_PODS),
        GPU_COUNT: str(node.gpus),
        GPU_MEM: str(node.gpus * MILLI),
    }
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux"}
    if node.model:
        labels[MODEL_LABEL] = node.model
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench: no kubelet"}
            ],
        },
    }


def pod_object(pod: TracePod, scheduler_name: str = "default-scheduler") -> dict[str, Any]:
    """A pending Pod asking the trace pod's cpu, memory and GPU share; its allowed models as a required node
    affinity on `MODEL_LABEL`."""
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    limits = dict(requests)
    if pod.gpus:
        limits[GPU_MEM] = str(pod.gpu_demand)
        if pod.gpus > 1:
            limits[GPU_COUNT] = str(pod.gpus)
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/none:latest",
                "resources": {"requests": requests, "limits": limits},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if pod.models:
        term = {"matchExpressions": [{"key": MODEL_LABEL, "operator": "In", "values": list(pod.models)}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name.lower(), "namespace": NAMESPACE},
        "spec": spec,
    }


def gpushare_held(pod: Mapping[str, Any]) -> dict[int, int] | None:
    """Milli-GPU per GPU index that a bound pod's gpushare annotations give it (its memory split evenly over the
    indexes listed), or None when it has none."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    listed = annotations.get(PROFILE.indexes_annotation) or annotations.get(PROFILE.index_annotation)
    if not listed:
        return None
    indexes = [int(part) for part in str(listed).split(",")]
    limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    demand = int(annotations.get(PROFILE.pod_memory_annotation) or parse_count(limits.get(GPU_MEM, 0)))
    held: dict[int, int] = {}
    for index in indexes:
        held[index] = held.get(index, 0) + demand // len(indexes)
    return held


@dataclass(frozen=True, slots=True)
class Wire:
    """The trace in one device protocol: its nodes and pods as API objects, and what a bound pod's annotations
    say it holds (milli-GPU by GPU index; None: bound without an allocation)."""

    name: str
    node_object: Callable[[TraceNode], dict[str, Any]]
    pod_object: Callable[[TracePod, str], dict[str, Any]]
    held: Callable[[Mapping[str, Any]], dict[int, int] | None]


GPUSHARE = Wire("gpushare", node_object, pod_object, gpushare_held)
