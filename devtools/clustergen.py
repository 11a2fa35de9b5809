"""Synthetic clusters: GPU Nodes and the Running Pods already sharing their GPUs, as Kubernetes objects.

The benchmark and load tests need clusters of thousands of nodes that look like what the API server lists:
Nodes advertising GPUs the way the gpushare device plugin does (`count` GPUs and `count * per-GPU` memory in
`status.capacity`), and Pods bound to them whose allocation annotations are written by the gpushare
protocol (`Profile.allocation_annotations`), so the cache counts them exactly as it counts pods we placed.
The same seed always gives the same objects, byte for byte.

It never overcommits a device (the cache's invariant holds on every generated cluster), and it never talks
to a cluster or a server: it only builds dicts and writes files.
"""

from __future__ import annotations

import argparse
import random
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import orjson
import yaml

from extender.core.devices import Device
from extender.core.holds import Allocation
from extender.core.objects import Raw
from extender.core.protocols.gpushare import Profile

ASSUME_TIME = 1_700_000_000.0
"""Unix seconds written as every generated pod's assume time: fixed, so output depends on the seed alone."""

NAMESPACES = ("ml-training", "ml-inference", "research", "default")
DEFAULT_PROFILE = Profile()
MAX_PODS_PER_GPU = 3
FILL_JITTER = 0.2
"""How far one GPU's fill may stray from the requested average (bounded so it stays within 0..1)."""


def _node(name: str, gpus: int, memory_per_gpu: int, profile: Profile) -> Raw:
    capacity = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        profile.count_resource: str(gpus),
        profile.memory_resource: str(gpus * memory_per_gpu),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _pod(name: str, namespace: str, uid: str, allocation: Allocation, device_capacity: int, profile: Profile) -> Raw:
    device = Device(allocation.indexes[0], device_capacity)
    annotations = profile.allocation_annotations(allocation, (device,), ASSUME_TIME)
    annotations[profile.assigned_annotation] = "true"  # running: the device plugin has handed the GPU over
    limits = {profile.memory_resource: str(allocation.memory)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": allocation.node,
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/gpu-job:latest",
                    "resources": {"limits": limits, "requests": dict(limits)},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def _split(total: int, rng: random.Random) -> list[int]:
    """`total` units as 1..MAX_PODS_PER_GPU positive pod sizes."""
    if total <= 0:
        return []
    parts = min(total, rng.randint(1, MAX_PODS_PER_GPU))
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return [high - low for low, high in zip([0, *cuts], [*cuts, total], strict=True)]


def generate(
    nodes: int,
    gpus_per_node: Sequence[int] = (8,),
    memory_per_gpu: Sequence[int] = (16, 24, 40, 80),
    fill: float = 0.3,
    seed: int = 1,
    profile: Profile = DEFAULT_PROFILE,
) -> list[Raw]:
    """`nodes` Nodes, each with a GPU count and per-GPU memory drawn from the choices, then Running Pods on
    them filling each GPU to about `fill` of its memory (never more than the whole GPU).

    Deterministic for a seed: names, sizes and pod UIDs all come from one seeded generator.
    """
    if nodes < 0:
        raise ValueError(f"nodes must be >= 0, not {nodes}")
    if not gpus_per_node or any(count < 1 for count in gpus_per_node):
        raise ValueError(f"GPUs per node must be positive, not {list(gpus_per_node)}")
    if not memory_per_gpu or any(memory < 1 for memory in memory_per_gpu):
        raise ValueError(f"memory per GPU must be positive, not {list(memory_per_gpu)}")
    if not 0.0 <= fill <= 1.0:
        raise ValueError(f"fill must be within 0..1, not {fill}")
    rng = random.Random(seed)
    jitter = min(fill, 1.0 - fill, FILL_JITTER)
    width = max(4, len(str(nodes)))
    node_objects: list[Raw] = []
    pod_objects: list[Raw] = []
    for number in range(1, nodes + 1):
        name = f"gpu-node-{number:0{width}d}"
        gpus, memory = rng.choice(gpus_per_node), rng.choice(memory_per_gpu)
        node_objects.append(_node(name, gpus, memory, profile))
        for index in range(gpus):
            target = round(memory * (fill + rng.uniform(-jitter, jitter)))
            for size in _split(min(target, memory), rng):
                namespace = rng.choice(NAMESPACES)
                uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                pod_name = f"job-{len(pod_objects) + 1:07d}"
                allocation = Allocation.uniform(uid, f"{namespace}/{pod_name}", name, (index,), size)
                pod_objects.append(_pod(pod_name, namespace, uid, allocation, memory, profile))
    return node_objects + pod_objects


def write(objects: Sequence[Raw], path: str | Path) -> None:
    """Write the objects as one `List`: compact JSON for `.json` (fast to load), YAML for `.yaml`/`.yml`."""
    path = Path(path)
    document: Raw = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": list(objects)}
    if path.suffix == ".json":
        path.write_bytes(orjson.dumps(document))
    elif path.suffix in {".yaml", ".yml"}:
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        path.write_text(yaml.dump(document, Dumper=dumper, sort_keys=False))
    else:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r}; use .json or .yaml")


def _numbers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.clustergen",
        description="Write a synthetic GPU cluster (Nodes and Running Pods) as a Kubernetes List.",
    )
    parser.add_argument("--nodes", type=int, required=True, help="How many nodes.")
    parser.add_argument("--out", required=True, help="Output file: .json (fast to load) or .yaml.")
    parser.add_argument("--gpus", type=_numbers, default=[8], help="GPUs per node, one of these per node (8).")
    parser.add_argument(
        "--memory", type=_numbers, default=[16, 24, 40, 80], help="Memory per GPU, one of these per node (16,24,40,80)."
    )
    parser.add_argument("--fill", type=float, default=0.3, help="Average fraction of each GPU's memory in use (0.3).")
    parser.add_argument("--seed", type=int, default=1, help="Seed: the same seed gives the same cluster (1).")
    arguments = parser.parse_args(argv)
    try:
        objects = generate(arguments.nodes, arguments.gpus, arguments.memory, arguments.fill, arguments.seed)
        write(objects, arguments.out)
    except (ValueError, OSError) as error:
        print(f"clustergen: {error}", file=sys.stderr)
        return 2
    pods = sum(1 for item in objects if item["kind"] == "Pod")
    print(f"wrote {arguments.out}: {len(objects) - pods} nodes, {pods} pods", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
