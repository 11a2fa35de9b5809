"""The arithmetic of `make bench-e2e`, kept pure so a test can check it in milliseconds: the workload's pod
sizes, the pace from bind timestamps, CPU time from /proc samples, and the end check over the API's pods and
nodes.

It must never talk to a process or the API: `bench/e2e_run.py` gathers the samples, this module only reads
them. Times are seconds on any one clock (the watch's arrival times, or the PodScheduled conditions' wall
clock); only differences are used.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devtools.harness import percentile
from extender.core.protocols.gpushare import Profile

PROFILE = Profile()
"""The gpushare device plugin's resource names and annotation keys: what `extender serve` writes by default."""

GPUS_PER_NODE = 8
GPU_MEMORY = 40
"""GiB per GPU: the issue's 8 x 40 GiB nodes."""
POD_MIX = ((2, 30), (4, 30), (8, 20), (16, 15), (40, 5))
"""(GiB, weight) of the pods, as `make loadtest`'s default `--mix`: each fits one GPU, about 10.5 GiB on average."""
MIX_SEED = 12
"""The sizes are drawn once from this seed, so every run of every wiring places the same pods in the same order."""

LOW, HIGH = 0.05, 0.95
"""The pace is timed from the 5th to the 95th percentile bind: the start-up (informers syncing, first
connections) and the tail (the last pods trickling) are left out."""


def pod_sizes(count: int, mix: Sequence[tuple[int, int]] = POD_MIX, seed: int = MIX_SEED) -> list[int]:
    """`count` pod sizes in GiB, drawn from `mix` with weights, the same list for the same arguments."""
    sizes, weights = zip(*mix, strict=True)
    return random.Random(seed).choices(sizes, weights=weights, k=count)


# ---- pace ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast pods were bound, from their bind times."""

    pods_per_second: float
    """Binds from the 5th to the 95th percentile one, over the time between them; 0.0 when undefined."""
    gap_p50_ms: float
    """Median gap between consecutive binds inside that window. Binds seen by a watch arrive in batches (the
    API server flushes a watch when its queue is empty), so this is small under load; see `gap_max_ms`."""
    gap_max_ms: float
    """Longest gap between consecutive binds inside the window: the longest stall."""
    bound: int
    first_to_last: float
    """Seconds from the first bind to the last."""


def _rank(fraction: float, count: int) -> int:
    """The nearest-rank index of a percentile, as `devtools.harness.percentile` takes it."""
    return min(count - 1, max(0, math.ceil(fraction * count) - 1))


def pace(bind_times: Iterable[float], low: float = LOW, high: float = HIGH) -> Pace:
    """Pods/s between the `low` and `high` percentile binds and the median gap between binds there.

    With bind times t sorted and i, j the nearest ranks of `low` and `high`, pods/s = (j - i) / (t[j] - t[i]):
    the binds after the i-th one up to the j-th, over the time they took.
    """
    times = sorted(bind_times)
    if len(times) < 2:
        return Pace(0.0, 0.0, 0.0, len(times), 0.0)
    first, last = _rank(low, len(times)), _rank(high, len(times))
    window = times[last] - times[first]
    rate = (last - first) / window if window > 0 else 0.0
    gaps = [later - earlier for earlier, later in zip(times[first:last], times[first + 1 : last + 1], strict=True)]
    return Pace(rate, percentile(gaps, 0.5) * 1000, max(gaps) * 1000, len(times), times[-1] - times[0])


def condition_time(pod: Mapping[str, Any]) -> float | None:
    """When the PodScheduled condition turned True (Unix seconds, whole seconds: the API's resolution), or None."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            if stamp:
                return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


# ---- CPU -----------------------------------------------------------------------------------------------


def cpu_seconds(stat: bytes, ticks_per_second: int) -> float:
    """utime + stime of a /proc/<pid>/stat line (every thread of the process, exited ones too), in seconds.

    The command name (field 2) is in parentheses and may hold spaces, so fields are counted after the last ")":
    state is the first there, utime (field 14) the 12th and stime (field 15) the 13th.
    """
    fields = stat.rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_second


def cpu_ms_per_pod(before: Mapping[str, float], after: Mapping[str, float], pods: int) -> dict[str, float]:
    """CPU milliseconds per pod of each process sampled `after`; one missing `before` started inside the window
    and counts from zero. Empty when no pod was bound."""
    if pods <= 0:
        return {}
    return {name: (seconds - before.get(name, 0.0)) * 1000 / pods for name, seconds in after.items()}


# ---- end check -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EndCheck:
    """What the API says after a run: the GPU pods bound and pending, and every broken invariant."""

    bound: int
    pending: int
    problems: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.problems


def demand(pod: Mapping[str, Any], profile: Profile = PROFILE) -> int:
    """The pod's GPU memory from its own spec (limits, as the device plugin counts), never from annotations."""
    return sum(
        int(((container.get("resources") or {}).get("limits") or {}).get(profile.memory_resource, 0))
        for container in pod["spec"]["containers"]
    )


def _gpus(node: Mapping[str, Any], profile: Profile) -> tuple[int, int]:
    """(GPU count, GiB per GPU) from the node's allocatable, as the device plugin reports them."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    count = int(allocatable.get(profile.count_resource, 0))
    total = int(allocatable.get(profile.memory_resource, 0))
    return count, total // count if count else 0


def end_check(
    pods: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    with_extender: bool,
    profile: Profile = PROFILE,
) -> EndCheck:
    """No node holds more GPU memory than it has (every run), and, with the extender, every bound GPU pod
    carries its allocation (device index and memory) and no GPU holds more than its capacity by those."""
    shape = {node["metadata"]["name"]: _gpus(node, profile) for node in nodes}
    per_node: dict[str, int] = {}
    per_gpu: dict[tuple[str, int], int] = {}
    problems: list[str] = []
    bound = pending = 0
    for pod in pods:
        memory = demand(pod, profile)
        if not memory:
            continue
        name = pod["metadata"]["name"]
        node = pod["spec"].get("nodeName")
        if not node:
            pending += 1
            continue
        bound += 1
        if node not in shape:
            problems.append(f"{name} bound to {node}, which is not a node")
            continue
        per_node[node] = per_node.get(node, 0) + memory
        if with_extender:
            problems.extend(_allocation_problems(pod, node, memory, shape[node], per_gpu, profile))
    for node, used in sorted(per_node.items()):
        count, size = shape[node]
        if used > count * size:
            problems.append(f"{node} holds {used} GiB of GPU memory, more than its {count * size}")
    for (node, index), used in sorted(per_gpu.items()):
        if used > shape[node][1]:
            problems.append(f"{node} GPU {index} holds {used} GiB, more than its {shape[node][1]}")
    return EndCheck(bound, pending, tuple(problems))


def _allocation_problems(
    pod: Mapping[str, Any],
    node: str,
    memory: int,
    gpus: tuple[int, int],
    per_gpu: dict[tuple[str, int], int],
    profile: Profile,
) -> list[str]:
    """What is wrong with one bound pod's allocation annotations; adds its memory to its GPU in `per_gpu`."""
    name = pod["metadata"]["name"]
    annotations = pod["metadata"].get("annotations") or {}
    index_text = annotations.get(profile.index_annotation)
    memory_text = annotations.get(profile.pod_memory_annotation)
    if index_text is None or memory_text is None:
        return [f"{name} bound to {node} without its allocation: {annotations}"]
    try:
        index, given = int(index_text), int(memory_text)
    except ValueError:
        return [f"{name} bound to {node} with an unreadable allocation: {annotations}"]
    problems = []
    if given != memory:
        problems.append(f"{name} asks {memory} GiB but was given {given}")
    if not 0 <= index < gpus[0]:
        problems.append(f"{name} on GPU {index}, which {node} does not have")
    per_gpu[node, index] = per_gpu.get((node, index), 0) + given
    return problems
