"""What the cluster runs and receives, learned online: the kinds of GPU pods (`Shape`) and how common each is.

The fragmentation-aware policy (`fragmentation.py`, its measure `measure.py`) judges a placement by the GPU capacity it
leaves unusable *for the pods that come*; this module says which pods those are. Every pod the cache learns of is one
observation of its shape (cpu, memory, GPUs, memory and compute on each, allowed GPU models): the pods listed at
start-up (so a restart rebuilds the distribution from the API), then each pod the watch shows, or a filter asks about,
for the first time (`learned.Learned.asked`; pending pods included: that is the moment a pod arrives). Nothing comes
from the future: a shape is known once a pod of it exists.

Observations fade with age (`half_life`): an exponential decay, so the distribution follows a workload that
changes over hours while a burst of one kind cannot erase the rest. The typical shapes (`Classes`) are the
most common until `coverage` of the weight is covered, at most `max_classes`, renormalised (the ATC'23 FGD
paper's `GetTypicalPods`, which keeps 95 %; we keep 99 %, see `COVERAGE`). They are rebuilt when the pods
observed grew by `rebuild_share` since the last look, or an eighth of the half-life passed (so early, while
little is known, often; later rarely), and a rebuild is kept only when it moves the weights (`MOVED`); each
build has a new `version`: the policy's memos are keyed by it, so a kept rebuild is what invalidates them.

CPU-only pods are not shapes here: a pod asking no GPU adds the same share of every node's free GPU to the
fragment (the paper's rule), so it never changes which node is best, while counting it would push GPU shapes
out of the covered share in a cluster whose pods are mostly CPU-only.

Mutable (the observations); single-threaded like the cache it learns from (`learned.py` feeds it). No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from extender.core.devices import Demand, Selectors

HALF_LIFE = 6 * 3600.0
"""Seconds after which an observation weighs half: a day's pattern changes within a few hours."""
COVERAGE = 0.99
"""Share of the observed weight the typical shapes cover. The paper keeps 95 %; the rare shapes beyond matter
where they are large (an 8-GPU pod that fits only an empty node of the largest kind: the measure protects such
nodes only if it knows the shape), and cost little here (`GpuGroup`)."""
MAX_CLASSES = 64
"""At most this many typical shapes (the trace's `default` workload needs 48 for 95 %, 84 for 99 %). Each
costs a few comparisons per judgement, and each distinct GPU part (`GpuGroup`) a bisection of a node's GPUs:
the bound keeps a workload of a thousand different pods as cheap as one of a few dozen."""
REBUILD_SHARE = 0.2
"""Look at rebuilding when this share more pods were observed since the last look."""
MOVED = 0.05
"""A rebuild replaces the typical shapes when it moves this much of their weight (total variation distance):
early, while each pod changes the picture, every rebuild; once the workload is known, rarely."""
MAX_SHAPES = 4096
"""Distinct shapes remembered; the lightest go first beyond this (a cluster's pods come in far fewer)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod asks of a node: cpu and memory, and its GPUs."""

    cpu: int
    """Millicores."""
    memory: int
    """Bytes."""
    devices: int
    """GPUs, each with `per_device` memory (or `percent` of each GPU's), and `cores` compute."""
    per_device: int
    percent: int = 0
    cores: int = 0
    models: tuple[str, ...] = ()
    """GPU models it may use, exactly as the node label names them (empty: any)."""
    use_models: tuple[str, ...] = ()
    """Upper-cased substrings one of which the GPU's model must contain (HAMi's `use-gputype`; empty: any)."""
    avoid_models: tuple[str, ...] = ()

    def admits(self, model: str) -> bool:
        """Whether a GPU of this model may serve it."""
        if self.models and model not in self.models:
            return False
        if self.use_models or self.avoid_models:
            upper = model.upper()
            if self.use_models and not any(wanted in upper for wanted in self.use_models):
                return False
            if any(avoided in upper for avoided in self.avoid_models):
                return False
        return True

    def gpus_on(self, capacity: int) -> float:
        """GPUs it takes where each has `capacity` memory: a share counts as its part of one (the larger of its
        memory and compute parts)."""
        share = min(self.need(capacity) / capacity, 1.0) if capacity > 0 else 1.0
        if self.cores:
            share = max(share, min(self.cores, 100) / 100)
        return self.devices * share

    def need(self, capacity: int) -> int:
        """Memory it takes on a GPU of `capacity`."""
        return self.per_device if self.per_device or not self.percent else capacity * min(self.percent, 100) // 100


def shape_of(demand: Demand | None, cpu: int, memory: int, models: tuple[str, ...] = ()) -> Shape | None:
    """The shape of a pod, or None when it asks no GPU (or its GPU request is unreadable).

    A demand of several containers (HAMi) is summarised by its largest request: the shape says which nodes the
    pod could use, and the largest container is what decides that most often.
    """
    if demand is None or demand.is_zero:
        return None
    selectors: Selectors = demand.selectors
    requests = demand.requests
    largest = max(requests, key=lambda request: (request.devices, request.memory, request.percent, request.cores))
    if not largest.devices:
        return None
    return Shape(
        cpu,
        memory,
        largest.devices,
        largest.memory,
        largest.percent,
        largest.cores,
        models,
        selectors.use_models,
        selectors.avoid_models,
    )


@dataclass(frozen=True, slots=True)
class GpuGroup:
    """Typical shapes that ask the same of the GPUs (count, memory, compute, models), told apart only by cpu and
    memory: the measure judges their GPU part once for all of them."""

    shape: Shape
    """One of them: its GPU part is theirs."""
    members: tuple[tuple[int, int, float], ...]
    """(cpu, memory, weight) of each."""
    weight: float


@dataclass(frozen=True, slots=True)
class GpuKind:
    """What the typical shapes ask of GPUs of one memory size and model, arranged for the measure of nodes whose
    GPUs are all of that kind (`measure._uniform`): the groups allowed on it, by the memory they need free on one
    GPU (at least 1: a GPU with nothing free serves nothing), ascending."""

    thresholds: tuple[int, ...]
    members: tuple[int, ...]
    """Each threshold's group, as its position in `Classes.groups`."""
    devices: tuple[int, ...]
    """GPUs each asks."""
    weight: float
    """The weight of every group, allowed here or not, summed in the groups' order."""
    most_devices: int
    _prefixes: dict[tuple[int, int], tuple[tuple[float, ...], ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def prefixes(self, classes: Classes, cpu_rank: int, memory_rank: int) -> tuple[tuple[float, ...], ...]:
        """`[d][i]`: the weight the node's cpu and memory let run (`Classes.running`) of the first `i` groups by
        threshold that ask at most `d` GPUs, summed in that order; computed once per pair of ranks."""
        found = self._prefixes.get((cpu_rank, memory_rank))
        if found is None:
            running = classes.running(cpu_rank, memory_rank)
            rows = []
            for most in range(self.most_devices + 1):
                row = [0.0]
                total = 0.0
                for member, devices in zip(self.members, self.devices, strict=True):
                    if devices <= most:
                        total = total + running[member]
                    row.append(total)
                rows.append(tuple(row))
            found = self._prefixes[cpu_rank, memory_rank] = tuple(rows)
        return found


@dataclass(frozen=True, slots=True)
class Classes:
    """The typical shapes at one build, with their weights (summing to 1)."""

    version: int
    shapes: tuple[Shape, ...] = ()
    weights: tuple[float, ...] = ()
    groups: tuple[GpuGroup, ...] = ()
    cpu_steps: tuple[int, ...] = ()
    """The distinct cpu asks, ascending: a node's free cpu matters only by how many of them it covers."""
    memory_steps: tuple[int, ...] = ()
    _rates: dict[int, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)
    _running: dict[tuple[int, int], tuple[float, ...]] = field(default_factory=dict, compare=False, repr=False)
    _parts: dict[tuple[int, str], tuple[tuple[int, int, float], ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _kinds: dict[tuple[int, str], GpuKind] = field(default_factory=dict, compare=False, repr=False)

    def running(self, cpu_rank: int, memory_rank: int) -> tuple[float, ...]:
        """Per group, the weight of its shapes a node lets run when its free cpu covers the first `cpu_rank` of
        `cpu_steps` and its free memory the first `memory_rank` of `memory_steps` (what `fragmentation` keys
        nodes by): computed once per pair of ranks, not per node judged."""
        found = self._running.get((cpu_rank, memory_rank))
        if found is None:
            cpu = self.cpu_steps[cpu_rank - 1] if cpu_rank else -1
            memory = self.memory_steps[memory_rank - 1] if memory_rank else -1
            found = self._running[cpu_rank, memory_rank] = tuple(
                sum(
                    weight
                    for shape_cpu, shape_memory, weight in group.members
                    if shape_cpu <= cpu and shape_memory <= memory
                )
                for group in self.groups
            )
        return found

    def parts(self, capacity: int, model: str) -> tuple[tuple[int, int, float], ...]:
        """Per group, on GPUs of this capacity and model: (memory it needs on each, or -1 where the model is not
        allowed; GPUs it needs; its weight)."""
        found = self._parts.get((capacity, model))
        if found is None:
            found = self._parts[capacity, model] = tuple(
                (group.shape.need(capacity) if group.shape.admits(model) else -1, group.shape.devices, group.weight)
                for group in self.groups
            )
        return found

    def kind(self, capacity: int, model: str) -> GpuKind:
        """The groups as the measure reads them on GPUs of this capacity and model (`GpuKind`)."""
        found = self._kinds.get((capacity, model))
        if found is None:
            allowed = sorted(
                (need or 1, position, devices)
                for position, (need, devices, _) in enumerate(self.parts(capacity, model))
                if need >= 0
            )
            weight = 0.0
            for group in self.groups:
                weight = weight + group.weight
            found = self._kinds[capacity, model] = GpuKind(
                tuple(threshold for threshold, _, _ in allowed),
                tuple(position for _, position, _ in allowed),
                tuple(devices for _, _, devices in allowed),
                weight,
                max((devices for _, _, devices in allowed), default=0),
            )
        return found

    def rates(self, capacity: int) -> tuple[float, float]:
        """(millicores, bytes) the typical shapes bring per GPU they take where each GPU has `capacity` memory, on
        average, weighted by popularity (0.0 when they take none). Per capacity because a pod's share of a GPU
        in memory units depends on the GPU's size."""
        rates = self._rates.get(capacity)
        if rates is None:
            pairs = list(zip(self.shapes, self.weights, strict=True))
            gpus = sum(weight * shape.gpus_on(capacity) for shape, weight in pairs)
            cpu = sum(weight * shape.cpu for shape, weight in pairs)
            memory = sum(weight * shape.memory for shape, weight in pairs)
            rates = self._rates[capacity] = (cpu / gpus, memory / gpus) if gpus else (0.0, 0.0)
        return rates

    @property
    def empty(self) -> bool:
        return not self.shapes


NO_CLASSES = Classes(0)


@dataclass(slots=True)
class Workload:
    """The decayed observations, and the typical shapes built from them. Mutable."""

    half_life: float = HALF_LIFE
    coverage: float = COVERAGE
    max_classes: int = MAX_CLASSES
    rebuild_share: float = REBUILD_SHARE
    origin: float | None = None
    """Time of the first observation: weights are kept as e^((t - origin) / tau), so none has to be updated as
    time passes; all are scaled down together when they grow large (`_rescale`)."""
    weights: dict[Shape, float] = field(default_factory=dict)
    total: float = 0.0
    built_at: tuple[int, float] = (0, 0.0)
    """Pods observed, and the time, when the last build was looked at."""
    built: Classes = NO_CLASSES
    observed: int = 0
    """Pods observed in all (for /inspect and the tests)."""

    def observe(self, shape: Shape | None, now: float, count: int = 1) -> None:
        """One pod of `shape` (None: a pod asking no GPU, not counted) seen at `now` (Unix seconds)."""
        if shape is None:
            return
        if self.origin is None:
            self.origin = now
        exponent = (now - self.origin) * math.log(2) / self.half_life if self.half_life > 0 else 0.0
        if exponent > 500:  # e^500 nears a double's range: move the origin forward and scale everything down
            self._rescale(now)
            exponent = 0.0
        weight = count * math.exp(max(exponent, 0.0))
        self.weights[shape] = self.weights.get(shape, 0.0) + weight
        self.total += weight
        self.observed += count
        if len(self.weights) > MAX_SHAPES:
            lightest = min(self.weights, key=self.weights.__getitem__)
            self.total -= self.weights.pop(lightest)

    def observe_all(self, shapes: Iterable[Shape | None], now: float) -> None:
        for shape in shapes:
            self.observe(shape, now)

    def _rescale(self, now: float) -> None:
        assert self.origin is not None
        factor = math.exp(-(now - self.origin) * math.log(2) / self.half_life)
        self.weights = {shape: weight * factor for shape, weight in self.weights.items() if weight * factor > 1e-12}
        self.total *= factor
        self.origin = now

    def classes(self, now: float = 0.0) -> Classes:
        """The typical shapes, rebuilt first when `rebuild_share` more pods were observed since the last look, or
        an eighth of the half-life passed (so a workload that drifts is followed even when few new pods come),
        and kept when the new ones differ from them by no more than `MOVED` (every memo of the policy is keyed by
        the build, so a rebuild that changes nothing would only cost). Counted in pods, not in decayed weight, so
        the same pods give the same builds whatever the clock says."""
        count, when = self.built_at
        due = self.observed > count * (1 + self.rebuild_share) or now - when > self.half_life / 8
        if self.total and (self.built.empty or due):
            rebuilt = self._build(self.built.version + 1)
            self.built_at = (self.observed, now)
            if self.built.empty or moved(self.built, rebuilt) > MOVED:
                self.built = rebuilt
        return self.built

    def _build(self, version: int) -> Classes:
        ranked = sorted(self.weights.items(), key=lambda item: -item[1])
        chosen: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, weight in ranked:
            if covered >= self.coverage * self.total or len(chosen) >= self.max_classes:
                break
            chosen.append((shape, weight))
            covered += weight
        shapes = tuple(shape for shape, _ in chosen)
        weights = tuple(weight / covered for _, weight in chosen) if covered else ()
        grouped: dict[Shape, list[tuple[int, int, float]]] = {}
        for shape, weight in zip(shapes, weights, strict=True):
            grouped.setdefault(replace(shape, cpu=0, memory=0), []).append((shape.cpu, shape.memory, weight))
        groups = tuple(
            GpuGroup(shape, tuple(members), sum(weight for _, _, weight in members))
            for shape, members in grouped.items()
        )
        return Classes(
            version,
            shapes,
            weights,
            groups,
            tuple(sorted({shape.cpu for shape in shapes})),
            tuple(sorted({shape.memory for shape in shapes})),
        )


def moved(old: Classes, new: Classes) -> float:
    """The share of weight that differs between two builds (total variation distance, 0 to 1)."""
    before = dict(zip(old.shapes, old.weights, strict=True))
    after = dict(zip(new.shapes, new.weights, strict=True))
    return sum(abs(before.get(shape, 0.0) - after.get(shape, 0.0)) for shape in before.keys() | after.keys()) / 2
