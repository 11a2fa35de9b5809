"""The figures of `make bench-placement`, computed from a `ReplayResult`, and their printing.

- **The curve**: GPU allocation (milli-GPU bound over the cluster's) each time the GPU demand that arrived
  crosses 10 %, 20 %, ... 130 % of the capacity, as the paper plots it; the figure of record is the last point.
- **Fragmentation at the end**, measured with the trace's typical pods as the paper defines them
  (hkust-adsl/kubernetes-scheduler-simulator `pkg/utils/frag.go` `GetTypicalPods`: the pod shapes (cpu, GPUs,
  milli-GPU per GPU, models) most frequent in the trace until 95 % of its pods are covered; here counted once
  from the trace file, which is fine for a report and never used to place): *fragmented* is the paper's
  expected fragment (for each typical pod, with its frequency, the free GPU of a node it cannot use: all of it
  where it cannot run at all, the GPUs too small for it where it can); *stranded* is stricter, the free GPU
  that no typical pod can use at all (cpu, memory and model counted). Both are computed here, apart from the
  extender's own measure (`extender/core/placement/measure.py`), so the report does not grade the policy with the
  policy's code.
- **Refusals** by what stopped them, from the reasons given per node: the scheduler's own (cpu, memory,
  gpu-total: the node's `aliyun.com/gpu-mem` or `gpu-count` total, model: the node affinity) and the
  extender's (gpu-device: no GPU on the node has the room). A pod counts under the set of reasons its nodes gave.
- The end check (`ReplayResult.check`), and the pace.

Pure: computes and formats, never runs anything.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.placement.outcome import NodeUse, ReplayResult, peer_restarts
from bench.placement.trace import MILLI, TracePod, Workload

POINTS = tuple(range(10, 131, 10))
"""% of the capacity arrived at which the curve is read."""
TYPICAL_COVERAGE = 0.95


def curve(workload: Workload, bound: Sequence[bool]) -> dict[int, float]:
    """% of GPU allocated at each point of `POINTS` reached, from which pods (in arrival order) were bound."""
    capacity = workload.gpu_capacity
    points: dict[int, float] = {}
    arrived = allocated = 0
    remaining = list(POINTS)
    for pod, placed in zip(workload.pods, bound, strict=True):
        arrived += pod.gpu_demand
        if placed:
            allocated += pod.gpu_demand
        while remaining and arrived * 100 >= remaining[0] * capacity:
            points[remaining.pop(0)] = 100 * allocated / capacity
    for point in remaining:  # the last pods arrived a hair short of 130 %: the end is that point
        points[point] = 100 * allocated / capacity
    return points


# ---- fragmentation -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_milli: int
    models: tuple[str, ...]


def typical_shapes(pods: Iterable[TracePod], coverage: float = TYPICAL_COVERAGE) -> list[tuple[Shape, float]]:
    """The most frequent pod shapes covering `coverage` of the pods, with their renormalised frequencies."""
    counts = Counter(Shape(pod.cpu_milli, pod.memory_mib, pod.gpus, pod.gpu_milli, pod.models) for pod in pods)
    total = sum(counts.values())
    chosen, covered = [], 0
    for shape, count in sorted(counts.items(), key=lambda item: (-item[1], repr(item[0]))):
        if covered >= coverage * total:
            break
        chosen.append((shape, count))
        covered += count
    return [(shape, count / covered) for shape, count in chosen]


def _runs(use: NodeUse, shape: Shape) -> bool:
    node = use.node
    if shape.models and node.model not in shape.models:
        return False
    return node.cpu_milli - use.cpu_used >= shape.cpu_milli and node.memory_mib - use.memory_used >= shape.memory_mib


def _usable_gpus(use: NodeUse, shape: Shape) -> list[int] | None:
    """The GPUs `shape` could use on the node now, or None when it cannot run there."""
    if not shape.gpus or not _runs(use, shape):
        return None
    free = use.gpu_free
    large = [index for index, amount in enumerate(free) if amount >= shape.gpu_milli]
    return large if len(large) >= shape.gpus else None


def fragmentation(result: ReplayResult, shapes: Sequence[tuple[Shape, float]]) -> tuple[float, float, float]:
    """(free, fragmented, stranded) GPU at the end, each in % of the capacity (see the module docstring)."""
    return fragmentation_of(result.nodes.values(), result.workload.gpu_capacity, shapes)


def fragmentation_of(
    nodes: Iterable[NodeUse], capacity: int, shapes: Sequence[tuple[Shape, float]]
) -> tuple[float, float, float]:
    """(free, fragmented, stranded) GPU of these nodes as they are, each in % of `capacity` (milli-GPU)."""
    free_total = fragmented = stranded = 0.0
    for use in nodes:
        free = use.gpu_free
        node_free = sum(free)
        if not node_free:
            continue
        free_total += node_free
        usable: set[int] = set()
        for shape, share in shapes:
            gpus = _usable_gpus(use, shape)
            if gpus is None:
                fragmented += share * node_free
            else:
                usable.update(gpus)
                fragmented += share * sum(amount for amount in free if amount < shape.gpu_milli)
        stranded += sum(amount for index, amount in enumerate(free) if index not in usable)
    return 100 * free_total / capacity, 100 * fragmented / capacity, 100 * stranded / capacity


# ---- refusals ------------------------------------------------------------------------------------------


def reason_kind(reason: str) -> str:
    if "Insufficient cpu" in reason:
        return "cpu"
    if "Insufficient memory" in reason:
        return "memory"
    if "Insufficient aliyun.com/" in reason:
        return "gpu-total"
    if "affinity" in reason or "selector" in reason:
        return "model"
    if reason.startswith("bind"):
        return "bind"
    if "Too many pods" in reason:
        return "pods"
    return "gpu-device"


def refusals(result: ReplayResult) -> Counter[str]:
    """Refused pods by the set of reasons their nodes gave ("cpu+gpu-total", "gpu-device", ...)."""
    counted: Counter[str] = Counter()
    for outcome in result.outcomes:
        if outcome.node:
            continue
        kinds = sorted({reason_kind(reason) for reason in outcome.reasons}) or ["unknown"]
        counted["+".join(kinds)] += 1
    return counted


def refused_by_kind(result: ReplayResult) -> Counter[str]:
    return Counter(outcome.pod.kind for outcome in result.outcomes if not outcome.node)


# ---- printing ------------------------------------------------------------------------------------------


def placements(result: ReplayResult) -> str:
    """A digest of where every pod went, in arrival order (the first 12 hex digits of a SHA-256): two runs with
    the same digest placed every pod alike, so a change meant to keep the decisions (a faster measure, a move of
    code) is checked against the run before it by one word, not by the figures alone."""
    text = "".join(f"{outcome.pod.name} {outcome.node}\n" for outcome in result.outcomes)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def summary(result: ReplayResult) -> dict[str, object]:
    """The figures, for printing and for tests."""
    bound = [bool(outcome.node) for outcome in result.outcomes]
    points = curve(result.workload, bound)
    free, fragmented, stranded = fragmentation(result, typical_shapes(result.workload.trace_pods))
    return {
        "allocated": 100 * result.allocated / result.workload.gpu_capacity,
        "curve": points,
        "free": free,
        "fragmented": fragmented,
        "stranded": stranded,
        "refusals": refusals(result),
        "refused_kinds": refused_by_kind(result),
        "bound": sum(bound),
        "pods": len(result.outcomes),
        "problems": list(result.problems),
        "placements": placements(result),
    }


def render(result: ReplayResult, label: str = "") -> str:
    figures = summary(result)
    workload = result.workload
    gpus = workload.gpu_capacity // MILLI
    arriving = sum(pod.gpu_demand for pod in workload.pods) / workload.gpu_capacity
    lines = [
        f"== {label or result.mode}: workload {workload.name}, {len(workload.nodes):,} nodes, {gpus:,} GPUs, "
        f"{len(workload.pods):,} pods arriving ({arriving:.1%} of the GPU capacity)",
        f"GPU allocated at the end: {figures['allocated']:.1f} %   (bound {figures['bound']:,} of "
        f"{figures['pods']:,} pods; placements {figures['placements']})",
        "curve (arrived % : allocated %): "
        + " ".join(f"{point}:{value:.1f}" for point, value in figures["curve"].items()),  # type: ignore[attr-defined]
        f"GPU free at the end {figures['free']:.1f} %: fragmented {figures['fragmented']:.1f} % (the paper's expected "
        f"fragment), stranded {figures['stranded']:.1f} % (no typical pod can use it)",
    ]
    refused = figures["refusals"]
    if refused:
        kinds = figures["refused_kinds"]
        lines.append(
            "refused pods by reason: "
            + ", ".join(f"{reason} {count:,}" for reason, count in refused.most_common())  # type: ignore[attr-defined]
            + "; by kind: "
            + ", ".join(f"{kind} {count:,}" for kind, count in kinds.most_common())  # type: ignore[attr-defined]
        )
    pace = result.extra.get("pods_per_second")
    timing = f"{result.seconds:.1f} s to decide {len(result.outcomes):,} pods"
    if pace:
        timing += f" ({pace:.0f} pods/s while kube-scheduler ran)"
    if result.verb_seconds:
        per_call = ", ".join(f"{verb} {seconds:.1f} s" for verb, seconds in result.verb_seconds.items())
        timing += f"; in the extender's handlers: {per_call}"
    timing += peer_restarts(result.extra)
    lines.append(timing)
    problems = figures["problems"]
    lines.append("end check: ok" if not problems else f"end check FAILED: {'; '.join(problems[:10])}")  # type: ignore[index]
    return "\n".join(lines)
