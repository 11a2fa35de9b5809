"""Device protocols: how a node-side device plugin describes GPUs and reads allocations (DESIGN §9).

What a node offers and how an allocation is written down belong to the device plugin on the node, not to us.
A protocol turns a node into `Device`s, a pod into a `Demand`, an `Allocation` into the pod annotations that
plugin reads (written in the Binding), and those annotations back into an allocation after a restart. The
cache, the ledger and the policy work on devices, demands and allocations and know no annotation key.

- `gpushare.py`: the gpushare device plugin (`aliyun.com/gpu-mem`), memory only, one GPU per pod for its plugin
  (a pod asking several is refused, unless a setting says the node side reads our annotation of every index).
- `hami.py`: HAMi's device plugin and HAMi-core (`nvidia.com/gpu`, `gpumem`, `gpucores`), which enforce memory
  and compute in the container and run multi-GPU and multi-container pods, with a node lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from extender.core.devices import Demand, Device, NodeDevices
from extender.core.holds import Allocation
from extender.core.objects import Raw


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a pod's annotations say was decided for it: where, what, and when."""

    node: str
    """The node it was decided for ("" when no decision is recorded)."""
    allocation: Allocation | None
    since: float
    """Unix seconds of the decision (0 when unknown): a reservation's TTL counts from here."""


NOTHING_RECORDED = Recorded("", None, 0.0)


@dataclass(frozen=True, slots=True)
class QuotaResources:
    """The resources whose `limits.<name>` keys in a ResourceQuota limit what this protocol's pods are given
    (`core/quota/`); "" for one the protocol does not track."""

    memory: str
    """GPU memory, in the quota as in the pods (HAMi: `nvidia.com/gpumem`)."""
    gpus: str
    """GPUs (HAMi: `nvidia.com/gpu`; gpushare: `aliyun.com/gpu-count`)."""
    cores: str = ""
    """Compute, in % of a GPU (HAMi: `nvidia.com/gpucores`)."""
    memory_factor: int = 1
    """What one unit of `memory` in a quota is worth in the protocol's memory unit (HAMi's memoryFactor)."""


class DeviceProtocol(Protocol):
    """A device plugin's formats. Pure: reading and writing objects, never I/O."""

    @property
    def name(self) -> str:
        """`gpushare`, `hami`: what `--protocol` selects."""

    @property
    def unit(self) -> str:
        """How messages name one unit of memory (`GiB`, `MiB`)."""

    @property
    def managed_resources(self) -> tuple[str, ...]:
        """The resources whose pods kube-scheduler must send us (`managedResources`)."""

    @property
    def advertised_resources(self) -> tuple[str, ...]:
        """The managed resources nodes advertise, which kube-scheduler keeps counting per node (the others exist
        only in pods, and the scheduler must ignore them)."""

    @property
    def node_lock(self) -> str | None:
        """The node annotation the device plugin's node lock lives in (None: the plugin has no lock)."""

    @property
    def model_label(self) -> str:
        """The node label naming a node's GPU model, which pods may require by node affinity ("" when models
        come from elsewhere: the devices themselves and the demand's selectors)."""

    @property
    def quota_resources(self) -> QuotaResources:
        """The resources a ResourceQuota's `limits.<name>` keys limit (`core/quota/`)."""

    def node_devices(self, node: Raw) -> NodeDevices:
        """The node's GPUs (and lock), or why none could be read. Never raises."""

    def pod_demand(self, pod: Raw) -> Demand:
        """What the pod asks; raises `InvalidPod` naming the container and value that cannot be read."""

    def refusal(self, demand: Demand) -> str | None:
        """Why the device plugin could run a pod of this demand on no node, in words for the pod's owner (None: it
        could). The filter refuses such a pod on every node as unresolvable, and the bind refuses it."""

    def allocation_annotations(self, allocation: Allocation, devices: Sequence[Device], since: float) -> dict[str, str]:
        """The annotations that record the allocation for the plugin and for our recovery; the same
        allocation and time always give the same annotations. `devices` are the node's."""

    @property
    def unhealthy_namespace(self) -> str | None:
        """Where the plugin's operators list unhealthy GPUs in ConfigMaps (gpushare: kube-system); None: nowhere."""

    def unhealthy_gpus(self, configmap: Raw) -> tuple[str, frozenset[int]] | None:
        """The node a ConfigMap of `unhealthy_namespace` names and the GPU indexes it lists; None for others."""

    def recorded(self, pod: Raw, demand: Demand | None) -> Recorded:
        """What the pod's annotations record (the inverse of `allocation_annotations`). Never raises: what a
        person or another tool wrote wrong is read as nothing recorded."""
