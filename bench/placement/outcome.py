"""What one replay of `make bench-placement` produced: where each pod went (or why it went nowhere), and the
cluster at the end (what each GPU holds, the cpu and memory each node gives), with the end check.

Both modes fill the same `ReplayResult`: the fast mode from the in-process extender's cache, the real mode from
the API server's pods (their allocation annotations, as `extender inspect` would read them). Pure values; the
figures are computed from them by `report.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.placement.trace import GPUSHARE, MILLI, TraceNode, TracePod, Wire, Workload
from extender.core.cache import Cache


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: TracePod
    node: str
    """Where it was bound; "" when it was refused (then dropped, in the paper's method) or never bound."""
    reasons: Mapping[str, int] = field(default_factory=dict)
    """When refused: how many nodes were refused for each reason, in the scheduler's words."""


@dataclass(slots=True)
class NodeUse:
    """One node at the end: what each GPU holds (milli-GPU, by device index), and the cpu and memory requested."""

    node: TraceNode
    gpu_used: list[int]
    cpu_used: int = 0
    memory_used: int = 0
    """MiB."""

    @property
    def gpu_free(self) -> list[int]:
        return [max(0, MILLI - used) for used in self.gpu_used]


@dataclass(slots=True)
class ReplayResult:
    mode: str
    workload: Workload
    outcomes: list[Outcome]
    """In arrival order (the real burst mode: in the workload's order, bound or not)."""
    nodes: dict[str, NodeUse]
    seconds: float
    """Wall time of the scheduling (the real mode: from kube-scheduler's start to the last decision)."""
    verb_seconds: dict[str, float] = field(default_factory=dict)
    """Time in the extender's handlers per verb (fast mode; the real mode: from its metrics)."""
    problems: list[str] = field(default_factory=list)
    """The end check's findings: a GPU, cpu or memory over capacity, a bound GPU pod without its allocation."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What a mode adds (the real mode's scheduler pace, the burst's stop reason)."""

    @classmethod
    def from_cache(
        cls,
        mode: str,
        workload: Workload,
        outcomes: list[Outcome],
        cache: Cache,
        seconds: float,
        verb_seconds: dict[str, float],
    ) -> ReplayResult:
        """The end state as the extender's cache holds it (its holds are what the annotations record)."""
        result = cls(mode, workload, outcomes, gpu_uses(workload, cache), seconds, verb_seconds)
        result.count_requests()
        result.problems = result.check() + cache.overcommitted()
        return result

    @classmethod
    def from_api(
        cls,
        mode: str,
        workload: Workload,
        outcomes: list[Outcome],
        pods: Sequence[Mapping[str, Any]],
        seconds: float,
        wire: Wire = GPUSHARE,
    ) -> ReplayResult:
        """The end state as the API server's pods record it: each bound GPU pod's allocation annotations, read
        as the device plugin of `wire`'s protocol reads them."""
        nodes = {node.name: NodeUse(node, [0] * node.gpus) for node in workload.nodes}
        asking = {pod.name.lower(): pod for pod in workload.pods if pod.gpu_demand}
        result = cls(mode, workload, outcomes, nodes, seconds)
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            name = (pod.get("metadata") or {}).get("name", "")
            if not node or node not in nodes or name not in asking:
                continue
            held = wire.held(pod)
            if held is None:
                result.problems.append(f"pod {name} is bound to {node} without its GPU allocation")
                continue
            for index, milli in held.items():
                if not 0 <= index < len(nodes[node].gpu_used):
                    result.problems.append(f"pod {name} holds GPU {index} of {node}, which has no such GPU")
                    continue
                nodes[node].gpu_used[index] += milli
        result.count_requests()
        result.problems += result.check()
        return result

    def count_requests(self) -> None:
        for outcome in self.outcomes:
            if outcome.node:
                use = self.nodes[outcome.node]
                use.cpu_used += outcome.pod.cpu_milli
                use.memory_used += outcome.pod.memory_mib

    def check(self) -> list[str]:
        """Every GPU, and every node's cpu and memory, within capacity; the GPU allocated equal to the demand of
        the pods bound."""
        found = []
        for name, use in self.nodes.items():
            for index, used in enumerate(use.gpu_used):
                if used > MILLI:
                    found.append(f"{name} GPU {index}: {used} of {MILLI} milli-GPU allocated")
            if use.cpu_used > use.node.cpu_milli:
                found.append(f"{name}: cpu {use.cpu_used}m requested of {use.node.cpu_milli}m")
            if use.memory_used > use.node.memory_mib:
                found.append(f"{name}: memory {use.memory_used}Mi requested of {use.node.memory_mib}Mi")
        allocated = sum(sum(use.gpu_used) for use in self.nodes.values())
        bound = sum(outcome.pod.gpu_demand for outcome in self.outcomes if outcome.node)
        if allocated != bound:
            found.append(f"GPUs hold {allocated} milli-GPU, but the pods bound asked {bound}")
        return found

    @property
    def allocated(self) -> int:
        return sum(sum(use.gpu_used) for use in self.nodes.values())


def gpu_uses(workload: Workload, cache: Cache) -> dict[str, NodeUse]:
    """Each node of the workload with what its GPUs hold in the extender's cache (cpu and memory not counted)."""
    nodes = {node.name: NodeUse(node, [0] * node.gpus) for node in workload.nodes}
    for name, state in cache.nodes.items():
        use = nodes.get(name)
        if use is None:
            continue
        for position, device in enumerate(state.devices):
            if device.index < len(use.gpu_used):
                use.gpu_used[device.index] = state.used[position]
    return nodes


def peer_restarts(extra: dict[str, Any], speed: float | None = None) -> str:
    """The report's words for a peer that exited during the run (`peers.PeerProcess.revive`), or "": how often,
    when each exit was found (seconds into the run, and in a churn run, whose trace clock runs `speed` times the
    run's, the trace hour, the unit of its curve; an exit while the peer settled, before the pods, as such), and
    why the first time."""
    crashes = extra.get("peer_crashes")
    if not isinstance(crashes, list) or not crashes:
        return ""
    exited_at = extra.get("peer_exited_at")
    when = []
    if isinstance(exited_at, list) and exited_at:
        before = sum(1 for at in exited_at if at < 0)
        during = [at for at in exited_at if at >= 0]
        if before:
            when.append(f"{before} before the pods came")
        if during:
            when.append(f"at {', '.join(f'{at:,.0f}' for at in during)} s of the run")
            if speed:
                when.append(f"trace hour {', '.join(f'{at * speed / 3600:.1f}' for at in during)}")
    said = f" ({'; '.join(when)})" if when else ""
    return f"; the peer exited {len(crashes)} times{said} and was started again (as kubelet would): {crashes[0]}"
