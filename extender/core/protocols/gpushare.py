"""The gpushare device plugin's protocol (DESIGN §4): `aliyun.com/gpu-mem`, `aliyun.com/gpu-count` and the
`ALIYUN_COM_GPU_MEM_*` pod annotations.

Memory only, in the plugin's unit (GiB by default: the plugin advertises `aliyun.com/gpu-mem: 16` for 16 GiB).
A node's GPUs come from its capacity (`<gpu-count>` GPUs of `<gpu-mem> / <gpu-count>` each) unless it carries
our per-device annotation (heterogeneous or unhealthy GPUs). A pod's demand is its memory, summed over
containers as kubelet does (the largest init container when larger), over `aliyun.com/gpu-count` GPUs (1 when
absent). The annotations travel in the Binding, so the API server writes them and `spec.nodeName` in one
update: they are the durable record of every decision. The plugin reads the index only, so it runs pods on one
GPU: a pod asking several is refused (`refusal`) unless `several_gpus` says the node side reads our own annotation
of every index; our own annotations keep multi-GPU allocations and the node of a decision made before a restart.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from extender.core import objects
from extender.core.devices import NO_DEMAND, Demand, Device, NodeDevices, ceil_div
from extender.core.holds import Allocation
from extender.core.objects import Raw, as_object
from extender.core.protocols import NOTHING_RECORDED, QuotaResources, Recorded
from extender.core.resources import MAX_DEVICES, InvalidQuantity, check_pod_shape, parse_count, pod_amount

UNHEALTHY_NAMESPACE = "kube-system"
UNHEALTHY_PREFIX = "unhealthy-gpu-"
"""`kube-system/unhealthy-gpu-<node>` lists a node's unhealthy GPUs (the gpushare extender's drop-in)."""


class SeveralGpus(enum.StrEnum):
    """What becomes of a pod asking several GPUs (`count_resource` > 1 in its limits)."""

    REFUSE = "refuse"
    """Refused on every node, at filter (unresolvable) and at bind: the gpushare device plugin gives a pod one GPU
    at most (AliyunContainerService/gpushare-device-plugin at 45fb8b88, `nv/` = pkg/gpu/nvidia/). At Allocate it
    matches the pod by its total memory, reads `ALIYUN_COM_GPU_MEM_IDX` alone (absent: -1, nv/podutils.go:37-61)
    and answers `NVIDIA_VISIBLE_DEVICES=no-gpu-has-<N>GiB-to-run` (nv/allocate.go:24-39, :90-110): the container
    fails to start or runs without a GPU, and the pod, never assigned, stays the oldest candidate of its size, so
    every later pod of that size on the node is matched to it and gets no GPU (nv/podmanager.go:240-262).
    gpushare-scheduler-extender refuses these pods too."""
    BIND = "bind"
    """Placed and bound like any pod, its GPUs recorded in `indexes_annotation` alone: for a node side of one's
    own that reads it."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Which resource names and annotation keys the plugin uses: the gpushare plugin's by default, so a cluster
    can swap its extender for ours without touching the nodes; each is a setting."""

    memory_resource: str = "aliyun.com/gpu-mem"
    """Node total and pod demand of GPU memory, in the plugin's units."""
    count_resource: str = "aliyun.com/gpu-count"
    """Number of GPUs on a node; on a pod, how many GPUs its memory is split over (1 when absent)."""
    memory_unit: str = "GiB"
    """How messages name one unit of `memory_resource`."""
    index_annotation: str = "ALIYUN_COM_GPU_MEM_IDX"
    """Pod: the device index, for single-device allocations (what the gpushare plugin reads)."""
    pod_memory_annotation: str = "ALIYUN_COM_GPU_MEM_POD"
    """Pod: the memory the pod was given, in total."""
    device_memory_annotation: str = "ALIYUN_COM_GPU_MEM_DEV"
    """Pod: the capacity of the device it was given."""
    assigned_annotation: str = "ALIYUN_COM_GPU_MEM_ASSIGNED"
    """Pod: "false" when we write it; the plugin sets "true" once the container gets the device."""
    assume_time_annotation: str = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
    """Pod: when we decided, in Unix nanoseconds; the reservation's TTL counts from here after a restart."""
    indexes_annotation: str = "gpu-extender.io/device-indexes"
    """Pod: every device index, comma-separated; the only record of multi-device allocations."""
    node_annotation: str = "gpu-extender.io/node"
    """Pod: the node we reserved on, so a reservation made before a crash is found again before binding."""
    node_devices_annotation: str = "gpu-extender.io/devices"
    """Node: JSON list of devices, `[{"index": 0, "memory": 16, "healthy": true}, ...]`, overriding capacity."""
    model_label: str = "nvidia.com/gpu.product"
    """Node: the label naming its GPUs' model (NVIDIA GPU feature discovery's by default; ACK's is
    `aliyun.accelerator/nvidia_name`). Pods restricted to models by a node affinity or nodeSelector on it are
    told apart by the placement policy; empty: models unknown."""
    several_gpus: SeveralGpus = SeveralGpus.REFUSE
    """A pod asking several GPUs: refused (the gpushare plugin cannot run it) or bound (`SeveralGpus`)."""

    # -- the protocol

    @property
    def name(self) -> str:
        return "gpushare"

    @property
    def unit(self) -> str:
        return self.memory_unit

    @property
    def managed_resources(self) -> tuple[str, ...]:
        """The resources whose pods the scheduler must send us."""
        return (self.memory_resource,)

    @property
    def advertised_resources(self) -> tuple[str, ...]:
        return (self.memory_resource,)

    @property
    def node_lock(self) -> str | None:
        return None

    @property
    def quota_resources(self) -> QuotaResources:
        """`limits.<memory_resource>` (memory given, in the plugin's unit) and `limits.<count_resource>` (GPUs)."""
        return QuotaResources(memory=self.memory_resource, gpus=self.count_resource)

    @property
    def unhealthy_namespace(self) -> str | None:
        return UNHEALTHY_NAMESPACE

    def unhealthy_gpus(self, configmap: Raw) -> tuple[str, frozenset[int]] | None:
        """`kube-system/unhealthy-gpu-<node>`, key `gpus`: comma-separated GPU indexes, as the Go extender reads
        them (`pkg/cache/nodeinfo.go` getUnhealthyGPUs). Items are trimmed and unreadable ones skipped; the Go
        extender marks GPU 0 unhealthy for every item it cannot parse (`strconv.Atoi` fails, `id` stays 0)."""
        name = objects.name(configmap)
        if not name.startswith(UNHEALTHY_PREFIX) or len(name) == len(UNHEALTHY_PREFIX):
            return None
        listed = as_object(configmap.get("data")).get("gpus")
        indexes = set()
        for item in str(listed or "").split(",")[:MAX_DEVICES]:
            item = item.strip()
            if item.isascii() and item.isdigit() and len(item) <= 4:
                indexes.add(int(item))
        return name[len(UNHEALTHY_PREFIX) :], frozenset(indexes)

    def node_devices(self, node: Raw) -> NodeDevices:
        """Devices from the per-device annotation when present and valid, else from capacity; their model from
        the node's `model_label`."""
        found = self._node_devices(node)
        model = objects.labels_of(node).get(self.model_label) if self.model_label else None
        if not isinstance(model, str) or not model:
            return found
        return NodeDevices(
            tuple(replace(device, model=model) for device in found.devices), found.unreadable, found.lock
        )

    def _node_devices(self, node: Raw) -> NodeDevices:
        listed = objects.annotations_of(node).get(self.node_devices_annotation)
        unreadable = ""
        if listed is not None:
            try:
                return NodeDevices(_devices_from_annotation(listed))
            except ValueError as error:
                unreadable = f"annotation {self.node_devices_annotation} ignored: {error}; "
        capacity = as_object(as_object(node.get("status")).get("capacity"))
        if self.memory_resource not in capacity:
            return NodeDevices((), unreadable + f"no {self.memory_resource} in capacity")
        try:
            memory = parse_count(capacity[self.memory_resource])
            count = parse_count(capacity.get(self.count_resource, 0))
        except InvalidQuantity as error:
            return NodeDevices((), unreadable + f"capacity unreadable: {error}")
        if count == 0:
            return NodeDevices((), unreadable + f"{self.memory_resource} {memory} but no {self.count_resource}")
        if count > MAX_DEVICES:
            return NodeDevices(
                (), unreadable + f"{self.count_resource} {count} is more than {MAX_DEVICES} GPUs: ignored"
            )
        each = memory // count
        return NodeDevices(tuple(Device(index, each) for index in range(count)), unreadable.rstrip("; "))

    def pod_demand(self, pod: Raw) -> Demand:
        """The pod's GPU memory over its GPU count; raises InvalidPod naming what cannot be read."""
        check_pod_shape(pod)
        memory = pod_amount(pod, self.memory_resource)
        if memory == 0:
            return NO_DEMAND
        devices = pod_amount(pod, self.count_resource) or 1
        return Demand(memory=memory, devices=devices)

    def refusal(self, demand: Demand) -> str | None:
        """Why no node can take a pod asking several GPUs, unless `several_gpus` is `bind` (`SeveralGpus`)."""
        if demand.devices <= 1 or self.several_gpus is SeveralGpus.BIND:
            return None
        return (
            f"asks {demand.devices} GPUs ({self.count_resource}: {demand.devices}); gpushare's device plugin gives a "
            "pod one GPU at most: its container would start without a GPU"
        )

    def allocation_annotations(self, allocation: Allocation, devices: Sequence[Device], since: float) -> dict[str, str]:
        """The pod annotations that record an allocation durably (DESIGN §4)."""
        first = allocation.indexes[0] if allocation.indexes else -1
        capacity = next((device.capacity for device in devices if device.index == first), 0)
        annotations = {
            self.pod_memory_annotation: str(allocation.memory),
            self.device_memory_annotation: str(capacity),
            self.assigned_annotation: "false",
            self.assume_time_annotation: str(int(since * 1e9)),
            self.indexes_annotation: ",".join(str(index) for index in allocation.indexes),
            self.node_annotation: allocation.node,
        }
        if len(allocation.indexes) == 1:
            annotations[self.index_annotation] = str(allocation.indexes[0])
        return annotations

    def recorded(self, pod: Raw, demand: Demand | None) -> Recorded:
        annotations = objects.annotations_of(pod)
        node = str(as_object(pod.get("spec")).get("nodeName") or "") or str(annotations.get(self.node_annotation) or "")
        if not node:
            return NOTHING_RECORDED
        key = objects.key(objects.namespace(pod), objects.name(pod))
        allocation = self._read_allocation(objects.uid(pod), key, node, annotations, demand)
        return Recorded(node, allocation, self._assume_time(annotations))

    def _read_allocation(
        self, uid: str, key: str, node: str, annotations: dict[str, Any], demand: Demand | None
    ) -> Allocation | None:
        """The allocation the annotations record for this pod on `node`, or None when they record none (or
        nothing readable). Without the pod-memory annotation, the pod's demand is what it was given."""
        listed = annotations.get(self.indexes_annotation) or annotations.get(self.index_annotation)
        if not listed:
            return None
        try:
            indexes = tuple(int(part) for part in str(listed).split(","))
            memory = int(annotations[self.pod_memory_annotation]) if self.pod_memory_annotation in annotations else None
        except ValueError:
            return None
        if memory is None:
            memory = demand.memory if demand else 0
        if any(index < 0 for index in indexes) or memory < 0:
            return None
        return Allocation.uniform(uid, key, node, indexes, ceil_div(memory, len(indexes)))

    def _assume_time(self, annotations: dict[str, Any]) -> float:
        """When the decision was made (Unix seconds), 0 when unknown: a reservation's TTL counts from here."""
        try:
            return int(annotations.get(self.assume_time_annotation, 0)) / 1e9
        except (TypeError, ValueError):
            return 0.0


def _devices_from_annotation(text: str) -> tuple[Device, ...]:
    try:
        entries = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError("expected a non-empty list of devices")
    if len(entries) > MAX_DEVICES:
        raise ValueError(f"{len(entries)} devices is more than {MAX_DEVICES}")
    devices: list[Device] = []
    seen: set[int] = set()
    for entry in entries:
        if not isinstance(entry, dict) or "index" not in entry or "memory" not in entry:
            raise ValueError('each device needs "index" and "memory"')
        index = entry["index"]
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or index in seen:
            raise ValueError(f"bad or repeated device index {index!r}")
        seen.add(index)
        try:
            memory = parse_count(entry["memory"])
        except InvalidQuantity as error:
            raise ValueError(f"device {index} memory {error}") from None
        healthy = entry.get("healthy", True) is not False
        devices.append(Device(index, memory if healthy else 0, healthy))
    return tuple(sorted(devices, key=lambda device: device.index))
