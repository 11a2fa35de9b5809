"""Per-GPU and per-node metrics, and fragmentation: what `/inspect` shows, for Prometheus and Grafana.

Read at each scrape from the per-node summaries the cache keeps current (`NodeState.used`, `.free`, the
holds' count per device): one pass over nodes and devices, never over pods. The exposition text of these
families is written here directly rather than through `prometheus_client`'s metric objects: at 5,000 nodes
x 8 GPUs that is 200,000 samples, which the library's per-sample objects took seconds to build (measured in
`make bench`).

**What only some device plugins track** (HAMi: compute, 100 a card; pod slots, its split count; the GPU's
model; its node lock) has families of its own, written for the GPUs (and nodes) that have it and for no other:
`extender_gpu_cores_capacity`, `_cores_used`, `extender_gpu_slots`, `_slots_used`, and per node
`extender_node_locked` (for a protocol with a node lock). The `model` label is on those new per-GPU families
only, never on the memory families: a gpushare scrape stays byte for byte what it was (and costs what it did),
the memory series keep one identity whichever protocol serves them, and every HAMi GPU has the compute and
slot series, so `* on(node, gpu) group_left(model) extender_gpu_cores_capacity` adds the model to any other
per-GPU family. (An empty `model=""` on every family would be the same series to Prometheus, but 80,000 more
label pairs to write per scrape at 16,000 GPUs, for nothing.)

Cardinality: per-GPU series (`extender_gpu_*`) are exported while the cache holds at most `gpu_series_limit`
GPUs; beyond that only the per-node and cluster-wide families, so a large cluster cannot flood Prometheus by
surprise (`--gpu-metrics`: `auto`, `gpu`, `node`, `off`).

**Fragmentation**, which no other GPU scheduler exports: of the free GPU memory, the share that cannot hold a
demand of a given size, because it sits in pieces smaller than the demand on each GPU. The sizes are those
actually asked recently (the median and the 90th percentile of the last `RecentDemands.limit` filter
requests' memory per GPU): "stranded at p90 = 0.4" means 40 % of the free memory cannot take a typical large
pod.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Generator, Iterable

from extender.core.cache import Cache
from extender.core.nodes import NodeState
from extender.core.placement.learned import Learned
from extender.settings import GpuSeries

QUANTILES = (("0.5", 0.5), ("0.9", 0.9))


class RecentDemands:
    """The memory per GPU of the last `limit` filter requests that asked for GPU memory. Mutable, bounded."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._sizes: deque[int] = deque(maxlen=limit)

    def record(self, per_device: int) -> None:
        if per_device > 0:
            self._sizes.append(per_device)

    def quantile(self, fraction: float) -> int:
        """The demand size at `fraction` (nearest rank), 0 when none was seen."""
        if not self._sizes:
            return 0
        ordered = sorted(self._sizes)
        return ordered[min(len(ordered), max(1, math.ceil(fraction * len(ordered)))) - 1]

    def __len__(self) -> int:
        return len(self._sizes)


def stranded(free: Iterable[int], size: int) -> int:
    """The free memory that cannot hold `size` on one GPU: the sum of the pieces smaller than it."""
    return sum(amount for amount in free if 0 < amount < size)


def _available(state: NodeState) -> list[int]:
    """The free memory of each GPU that can take a pod now (known and Ready node, healthy GPU)."""
    if not (state.known and state.ready):
        return []
    return [free for free, device in zip(state.free, state.devices, strict=True) if device.healthy]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _head(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


SLICE = 250
"""Nodes rendered between two yields to the event loop: about 1 ms of work at 8 GPUs a node (measured), so a
scrape of 5,000 nodes never holds the loop that answers kube-scheduler for more than that at a time."""

GPU_FAMILIES = (
    ("extender_gpu_memory_capacity", "GPU memory of each GPU, in the device plugin's unit."),
    ("extender_gpu_memory_used", "GPU memory held on each GPU (observed and reserved), in the plugin's unit."),
    ("extender_gpu_memory_free", "GPU memory free on each GPU, in the plugin's unit."),
    ("extender_gpu_pods", "Pods and reservations holding memory on each GPU."),
    ("extender_gpu_healthy", "1 when the GPU is healthy, 0 when the device plugin or an operator marked it not."),
)
CORE_FAMILIES = (
    ("extender_gpu_cores_capacity", "Compute of each GPU whose plugin tracks it (100: a whole card), by model."),
    ("extender_gpu_cores_used", "Compute held on each GPU (observed and reserved), in % of a card, by model."),
)
SLOT_FAMILIES = (
    ("extender_gpu_slots", "Most container uses each GPU may run at once (HAMi's split count), by model."),
    ("extender_gpu_slots_used", "Container uses held on each GPU (observed and reserved), by model."),
)
NODE_FAMILIES = (
    ("extender_node_gpu_largest_free", "The most free memory on one GPU of the node that can take a pod now."),
    ("extender_node_gpu_memory_free", "Free GPU memory on the node's GPUs that can take a pod now."),
    (
        "extender_node_gpu_memory_stranded",
        "Free GPU memory on the node in pieces smaller than the recent demand at the quantile (extender_demand_size).",
    ),
)
LOCK_FAMILY = (
    "extender_node_locked",
    "1 while the device plugin's node lock (HAMi's hami.io/mutex.lock) holds the node for a pod it has not "
    "allocated yet, 0 otherwise.",
)


def render(cache: Cache, learned: Learned, demands: RecentDemands, series: GpuSeries, gpu_series_limit: int) -> bytes:
    """The exposition text of the GPU families, read from the cache now, in one go (tests, benchmarks)."""
    steps = _render(cache, learned, demands, series, gpu_series_limit)
    while (text := _step(steps)) is None:
        pass
    return text


async def render_yielding(
    cache: Cache, learned: Learned, demands: RecentDemands, series: GpuSeries, gpu_series_limit: int
) -> bytes:
    """`render`, giving the event loop a turn after every `SLICE` nodes (what /metrics serves)."""
    steps = _render(cache, learned, demands, series, gpu_series_limit)
    while (text := _step(steps)) is None:
        await asyncio.sleep(0)
    return text


def _step(steps: Generator[None, None, bytes]) -> bytes | None:
    """Render one slice; the text once the last is done."""
    try:
        next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return None


def _render(
    cache: Cache, learned: Learned, demands: RecentDemands, series: GpuSeries, gpu_series_limit: int
) -> Generator[None, None, bytes]:
    """Yields after each slice of nodes; returns the text. Between slices the cache may change: each node's
    figures are read in one piece, the families as a whole are a scrape's worth of approximately now."""
    nodes = [cache.nodes[name] for name in sorted(cache.nodes) if cache.nodes[name].devices]
    gpus = sum(len(state.devices) for state in nodes)
    per_gpu = series is GpuSeries.GPU or (series is GpuSeries.AUTO and gpus <= gpu_series_limit)
    per_node = series is not GpuSeries.OFF
    locks = per_node and cache.protocol.node_lock is not None
    sizes = [(label, demands.quantile(fraction)) for label, fraction in QUANTILES]
    families = [*GPU_FAMILIES, *CORE_FAMILIES, *SLOT_FAMILIES, *NODE_FAMILIES, LOCK_FAMILY]
    chunks: list[list[bytes]] = [[] for _ in families]
    """Per family, its samples one slice of nodes at a time (joined per slice: the final join copies chunks)."""
    available: list[int] = []
    classes = learned.classes()
    fragmented = 0.0
    for start in range(0, len(nodes), SLICE):
        gpu_rows: list[list[str]] = [[] for _ in (*GPU_FAMILIES, *CORE_FAMILIES, *SLOT_FAMILIES)]
        node_rows: list[list[str]] = [[] for _ in NODE_FAMILIES]
        lock_rows: list[str] = []
        for state in nodes[start : start + SLICE]:
            free = _available(state)
            available += free
            fragmented += learned.measure(state, classes)
            if per_gpu:
                _gpu_rows(gpu_rows, state)
            if per_node:
                _node_rows(node_rows, state, free, sizes)
            if locks:
                lock_rows.append(f'extender_node_locked{{node="{_label(state.name)}"}} {int(state.lock is not None)}')
        for family, rows in zip(chunks, [*gpu_rows, *node_rows, lock_rows], strict=True):
            if rows:
                family.append(("\n".join(rows) + "\n").encode())
        yield
    lines: list[str] = []
    _cluster_families(lines, nodes, available, sizes, gpus, per_gpu)
    _head(
        lines,
        "extender_fragmentation_gpus",
        "gauge",
        "What the placement policy minimises, summed over nodes, in GPUs: the free GPU the typical pods cannot use "
        "(weighted by how common each is), plus half the free GPU the nodes' cpu and memory cannot feed.",
    )
    lines.append(f"extender_fragmentation_gpus {fragmented:.6g}")
    _head(lines, "extender_workload_shapes", "gauge", "Typical pod shapes the placement policy places for.")
    lines.append(f"extender_workload_shapes {len(classes.shapes)}")
    lines.append("")
    parts: list[bytes] = []
    for (name, help_text), family in zip(families, chunks, strict=True):
        if family:
            parts.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode())
            parts += family
    parts.append("\n".join(lines).encode())
    return b"".join(parts)


def _gpu_rows(rows: list[list[str]], state: NodeState) -> None:
    holders = [0] * len(state.devices)
    positions = {device.index: position for position, device in enumerate(state.devices)}
    for hold in state.holds.values():
        for index in hold.allocation.indexes:
            position = positions.get(index)
            if position is not None:
                holders[position] += 1
    node = _label(state.name)
    memory_rows, (cores, cores_used, slots, slots_used) = rows[: len(GPU_FAMILIES)], rows[len(GPU_FAMILIES) :]
    for position, device in enumerate(state.devices):
        labels = f'{{node="{node}",gpu="{device.index}"}} '
        values = (device.capacity, state.used[position], state.free[position], holders[position], int(device.healthy))
        for (name, _), row, value in zip(GPU_FAMILIES, memory_rows, values, strict=True):
            row.append(f"{name}{labels}{value}")
        if not (device.cores or device.slots):
            continue
        labels = f'{{node="{node}",gpu="{device.index}",model="{_label(device.model)}"}} '
        if device.cores:
            cores.append(f"extender_gpu_cores_capacity{labels}{device.cores}")
            cores_used.append(f"extender_gpu_cores_used{labels}{state.used_cores[position]}")
        if device.slots:
            slots.append(f"extender_gpu_slots{labels}{device.slots}")
            slots_used.append(f"extender_gpu_slots_used{labels}{state.used_slots[position]}")


def _node_rows(rows: list[list[str]], state: NodeState, free: list[int], sizes: list[tuple[str, int]]) -> None:
    node = _label(state.name)
    largest, total, by_size = rows
    largest.append(f'extender_node_gpu_largest_free{{node="{node}"}} {max(free, default=0)}')
    total.append(f'extender_node_gpu_memory_free{{node="{node}"}} {sum(free)}')
    for label, size in sizes:
        by_size.append(f'extender_node_gpu_memory_stranded{{node="{node}",quantile="{label}"}} {stranded(free, size)}')


def _cluster_families(
    lines: list[str],
    nodes: list[NodeState],
    available: list[int],
    sizes: list[tuple[str, int]],
    gpus: int,
    per_gpu: bool,
) -> None:
    total_free = sum(available)
    _head(lines, "extender_gpus", "gauge", "GPUs in the cache.")
    lines.append(f"extender_gpus {gpus}")
    _head(lines, "extender_gpu_series", "gauge", "1 while per-GPU series are exported (see --gpu-metrics).")
    lines.append(f"extender_gpu_series {int(per_gpu)}")
    _head(lines, "extender_gpu_memory_capacity_total", "gauge", "GPU memory of every GPU in the cache.")
    lines.append(f"extender_gpu_memory_capacity_total {sum(state.capacity_total for state in nodes)}")
    _head(lines, "extender_gpu_memory_used_total", "gauge", "GPU memory held (observed and reserved) in the cache.")
    lines.append(f"extender_gpu_memory_used_total {sum(state.used_total for state in nodes)}")
    _head(lines, "extender_gpu_memory_free_total", "gauge", "Free GPU memory on GPUs that can take a pod now.")
    lines.append(f"extender_gpu_memory_free_total {total_free}")
    _head(
        lines,
        "extender_demand_size",
        "gauge",
        "Memory per GPU asked by recent filter requests, at the quantile (0: none seen).",
    )
    lines.extend(f'extender_demand_size{{quantile="{label}"}} {size}' for label, size in sizes)
    amounts = [(label, stranded(available, size)) for label, size in sizes]
    _head(
        lines,
        "extender_gpu_memory_stranded",
        "gauge",
        "Free GPU memory in pieces smaller than the demand at the quantile.",
    )
    lines.extend(f'extender_gpu_memory_stranded{{quantile="{label}"}} {amount}' for label, amount in amounts)
    _head(
        lines,
        "extender_gpu_memory_stranded_ratio",
        "gauge",
        "Share of the free GPU memory that cannot hold the recent demand at the quantile (0 when nothing is free).",
    )
    for label, amount in amounts:
        ratio = amount / total_free if total_free else 0.0
        lines.append(f'extender_gpu_memory_stranded_ratio{{quantile="{label}"}} {ratio:.6g}')
