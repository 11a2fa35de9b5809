"""The trace in HAMi's NVIDIA protocol (v2.10.0), for the real replay of ours with `--protocol hami` and of
hami-scheduler (`--peer hami=DIR`) on the same nodes and pods.

- **Nodes**: each GPU registered by HAMi's device plugin in its default `hami-core` mode
  (`hami.io/node-nvidia-register`: `id` `uuid_of(node, index)`, `count` `SPLIT` (the chart's
  `deviceSplitCount`), `devmem` `DEVMEM` MiB, `devcore` 100, `type` `NVIDIA-<model>`, `health` true), and
  allocatable `nvidia.com/gpu` = GPUs x `SPLIT`, as the plugin advertises it. The model is also the node label
  `trace.MODEL_LABEL`, as for gpushare, so a pod's allowed models are the same node affinity for both.
- **Pods**: `nvidia.com/gpu: num_gpu`, and the trace's share as HAMi's relative resources:
  `nvidia.com/gpumem-percentage` and `nvidia.com/gpucores` both `gpu_milli / 10` (every share in the trace is a
  multiple of 10 milli-GPU, so this is exact; a whole GPU asks 100 of both, HAMi's exclusive use). HAMi gives a
  GPU `DEVMEM * percentage / 100` MiB, so `DEVMEM` is a multiple of 100 and a milli-GPU is `DEVMEM / 1000` MiB.
- **Allocation read back** (`held`): `hami.io/vgpu-devices-allocated` (`<uuid>,NVIDIA,<MiB>,<cores>:` per GPU,
  decoded by the extender's own HAMi decoder), the GPU's index from its UUID, its memory in milli-GPU. A pod
  whose plugin refused it (`hami.io/bind-phase: failed`) holds nothing and is reported by the replay.

What differs from the gpushare replay, on purpose: HAMi caps a GPU at `SPLIT` pods (the trace has shares of 50
milli-GPU, which 20 could share under gpushare); the comparison of ours and hami-scheduler is on these same nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from bench.placement.trace import MILLI, TraceNode, TracePod, Wire
from bench.placement.trace import node_object as gpushare_node
from bench.placement.trace import pod_object as gpushare_pod
from extender.core.protocols import hami

DEVMEM = 16000
"""MiB per GPU, as registered (a multiple of 100: HAMi's percentages are exact)."""
SPLIT = 10
"""Pods a GPU may hold (`count` in the registration: HAMi chart's `deviceSplitCount` default)."""
CORE_MODE = "hami-core"
GPUSHARE_RESOURCES = ("aliyun.com/gpu-mem", "aliyun.com/gpu-count")


def uuid_of(node: str, index: int) -> str:
    """The UUID a GPU of a bench node is registered with."""
    return f"GPU-{node}-{index}"


def index_of(uuid: str, node: str) -> int | None:
    prefix = f"GPU-{node}-"
    tail = uuid[len(prefix) :] if uuid.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def register(node: TraceNode) -> list[dict[str, Any]]:
    return [
        {"id": uuid_of(node.name, index), "index": index, "count": SPLIT, "devmem": DEVMEM, "devcore": 100,
         "type": f"NVIDIA-{node.model or 'GPU'}", "numa": 0, "mode": CORE_MODE, "health": True}
        for index in range(node.gpus)
    ]  # fmt: skip


def node_object(node: TraceNode) -> dict[str, Any]:
    """The trace node as a Ready Node whose GPUs HAMi's device plugin registered (hami-core mode)."""
    body = gpushare_node(node)
    for resources in (body["status"]["capacity"], body["status"]["allocatable"]):
        for name in GPUSHARE_RESOURCES:
            resources.pop(name, None)
        if node.gpus:
            resources[hami.GPU] = str(node.gpus * SPLIT)
    if node.gpus:
        body["metadata"]["annotations"] = {hami.REGISTER: orjson.dumps(register(node)).decode()}
    return body


def pod_object(pod: TracePod, scheduler_name: str) -> dict[str, Any]:
    """The trace pod asking HAMi's resources: `num_gpu` GPUs, each `gpu_milli / 10` % of memory and compute."""
    body = gpushare_pod(pod, scheduler_name)
    limits = body["spec"]["containers"][0]["resources"]["limits"]
    for name in GPUSHARE_RESOURCES:
        limits.pop(name, None)
    if pod.gpus:
        percent = str(pod.gpu_milli * 100 // MILLI)
        limits |= {hami.GPU: str(pod.gpus), hami.GPUMEM_PERCENTAGE: percent, hami.GPUCORES: percent}
    return body


def held(pod: Mapping[str, Any]) -> dict[int, int] | None:
    """Milli-GPU per GPU index that the pod's HAMi allocation gives it; None without one (or refused by the
    plugin, or naming a GPU the node did not register)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    node = (pod.get("spec") or {}).get("nodeName") or ""
    text = annotations.get(hami.ALLOCATED)
    if not text or annotations.get(hami.BIND_PHASE) == "failed":
        return None
    try:
        containers = hami.decode(str(text))
    except ValueError:
        return None
    found: dict[int, int] = {}
    for grants in containers:
        for grant in grants:
            index = index_of(grant.uuid, node)
            if index is None:
                return None
            found[index] = found.get(index, 0) + grant.memory * MILLI // DEVMEM
    return found or None


HAMI = Wire("hami", node_object, pod_object, held)
