"""The pods as the cache keeps them: the few fields of a Pod object the extender uses (`PodRecord`).

A whole pod is kilobytes of volumes, probes and managed fields; a cluster has a hundred thousand of them. The
cache keeps this record instead, built once per watch event by the device protocol that reads its GPU demand
and what its annotations say it was given. Building one never raises: a GPU request that cannot be read is kept
as `unreadable`, so the pod is still counted and reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.core import jobplan, objects
from extender.core.devices import Demand
from extender.core.groups import Said, WrittenHold, read
from extender.core.holds import Allocation
from extender.core.objects import Raw, as_object, pod_priority
from extender.core.protocols import DeviceProtocol
from extender.core.resources import InvalidPod, pod_request, required_values

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The fields of a pod the extender uses; the cache keeps only these."""

    uid: str
    namespace: str
    name: str
    node_name: str
    demand: Demand | None
    """None when the pod's GPU request is unreadable (`unreadable` says why)."""
    allocation: Allocation | None
    """What its annotations say it was given, if anything."""
    assume_time: float
    unreadable: str = ""
    finished: bool = False
    """Succeeded or Failed: it holds nothing any more."""
    priority: int = 0
    """`spec.priority` (set by admission from its PriorityClass): who may be preempted for whom."""
    cpu: int = 0
    """Millicores requested, as kube-scheduler counts them on the node."""
    memory: int = 0
    """Bytes requested."""
    models: tuple[str, ...] = ()
    """GPU models it requires by node affinity on the protocol's model label (empty: any)."""
    group: Said = None
    """The job it starts with, as it declares it, read from the pod alone (`groups.read`; None: it declares none).
    A PodGroup's minimum is read when it is needed (`groups.resolve` with `Cache.podgroups`): the PodGroup may come
    after the pod, or change."""
    gated: bool = False
    """It has scheduling gates: kube-scheduler does not place it yet."""
    written: WrittenHold | None = None
    """The hold of its job its bind wrote on it (`jobplan.py`), if any."""

    @property
    def key(self) -> str:
        return objects.key(self.namespace, self.name)


def pod_record(pod: Raw, protocol: DeviceProtocol) -> PodRecord:
    """Reduce a pod object to a PodRecord; an unreadable GPU request becomes `unreadable`, never an exception."""
    uid, namespace, name = objects.uid(pod), objects.namespace(pod), objects.name(pod)
    node = str(as_object(pod.get("spec")).get("nodeName") or "")
    unreadable = ""
    demand: Demand | None
    try:
        demand = protocol.pod_demand(pod)
    except InvalidPod as error:
        demand, unreadable = None, str(error)
    recorded = protocol.recorded(pod, demand)
    finished = as_object(pod.get("status")).get("phase") in TERMINAL_PHASES
    label = protocol.model_label
    spec = as_object(pod.get("spec"))
    return PodRecord(
        uid,
        namespace,
        name,
        node,
        demand,
        recorded.allocation,
        recorded.since,
        unreadable,
        finished,
        pod_priority(pod),
        pod_request(pod, "cpu", scale=3),
        pod_request(pod, "memory"),
        required_values(pod, label) if label else (),
        read(pod),
        bool(spec.get("schedulingGates")),
        jobplan.written(objects.annotations_of(pod)),
    )
