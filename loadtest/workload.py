"""What the load test asks of the extender, as kube-scheduler would ask it: pure, so pytest can check it.

Why it exists: the Locust user (`locustfile.py`) must behave like kube-scheduler, and the parts of that
behaviour that are arithmetic deserve tests of their own: which node names a filter carries (the scheduler's
adaptive `percentageOfNodesToScore`, with its rotating start index), which pod sizes come in what proportion,
which node wins the scores, and how the request bodies are made from the pod kube-scheduler really sent
(`pod.json`, captured from kube-scheduler v1.32 calling the gpushare extender: `tests/fixtures/captured/gpushare`).

It never imports Locust or gevent (the test process must stay free of gevent's monkey-patching) and never
touches the network.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from devtools.harness import percentile

POD_FIXTURE = Path(__file__).resolve().parent / "pod.json"
NAMESPACE = "loadtest"
"""Namespace of every pod the load test schedules: the end checks tell them from the generated ones by it."""
MEMORY_RESOURCE = "aliyun.com/gpu-mem"
DEFAULT_MIX = "2:30,4:30,8:20,16:15,40:5"
"""GiB asked on one GPU : relative weight. Mostly small inference pods, a few that need a big GPU."""

MIN_FEASIBLE_NODES = 100
"""kube-scheduler's `minFeasibleNodesToFind`: below this many nodes, every node is considered."""
MIN_FEASIBLE_PERCENTAGE = 5
"""kube-scheduler's `minFeasibleNodesPercentageToFind`: the adaptive percentage never goes below it."""

_UID_MARK = b"00000000-load-test-uid0-000000000000"
_NAME_MARK = b"load-test-pod-name-mark"


def nodes_to_find(all_nodes: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops (`numFeasibleNodesToFind`), so how many
    names one filter call carries when every node passes the scheduler's own filters.

    With `percentage` 0 (the default `percentageOfNodesToScore`) the percentage adapts: 50% minus 1% per 125
    nodes, at least 5%. 1,000 nodes: 42% = 420 names; 5,000 nodes: 10% = 500 names; never fewer than 100.
    """
    if all_nodes < MIN_FEASIBLE_NODES or percentage >= 100:
        return all_nodes
    if percentage <= 0:
        percentage = max(MIN_FEASIBLE_PERCENTAGE, 50 - all_nodes // 125)
    return max(MIN_FEASIBLE_NODES, all_nodes * percentage // 100)


@dataclass(slots=True)
class NodeSample:
    """The node names of successive filter calls: a window of `size` names that starts where the previous one
    ended, wrapping around, as kube-scheduler's `nextStartNodeIndex` rotates over the node list. Mutable."""

    names: Sequence[str]
    size: int
    start: int = 0

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("no node names to sample from")
        self.size = max(1, min(self.size, len(self.names)))

    def next(self) -> list[str]:
        count, start = len(self.names), self.start
        end = start + self.size
        window = list(self.names[start:end]) if end <= count else [*self.names[start:], *self.names[: end - count]]
        self.start = end % count
        return window


@dataclass(frozen=True, slots=True)
class PodMix:
    """Pod sizes (GiB on one GPU) and their relative weights, parsed from "2:30,4:30,8:20"."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, text: str) -> PodMix:
        sizes, weights = [], []
        for part in text.split(","):
            if not part.strip():
                continue
            size, _, weight = part.partition(":")
            try:
                sizes.append(int(size))
                weights.append(float(weight) if weight.strip() else 1.0)
            except ValueError:
                raise ValueError(f"pod mix {text!r}: {part!r} is not GIB:WEIGHT") from None
        if not sizes or any(size < 1 for size in sizes) or any(weight < 0 for weight in weights) or not sum(weights):
            raise ValueError(f"pod mix {text!r}: need positive sizes and some positive weight")
        return cls(tuple(sizes), tuple(weights))

    def draw(self, rng: random.Random) -> int:
        return rng.choices(self.sizes, self.weights)[0]

    @property
    def mean(self) -> float:
        return sum(size * weight for size, weight in zip(self.sizes, self.weights, strict=True)) / sum(self.weights)


@dataclass(slots=True)
class PodBodies:
    """Encoded request bodies for pods of each size: the captured pod under a fresh name and UID, asking `size`
    GiB in every container (limits and requests, as the API server defaults them). Encoded once per size;
    per pod only the name and UID are swapped in."""

    sizes: Sequence[int]
    pod: dict[str, Any] = field(default_factory=lambda: orjson.loads(POD_FIXTURE.read_bytes()))
    _templates: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for size in self.sizes:
            pod = copy.deepcopy(self.pod)
            meta = pod["metadata"]
            meta["uid"], meta["name"], meta["namespace"] = _UID_MARK.decode(), _NAME_MARK.decode(), NAMESPACE
            for container in pod["spec"]["containers"]:
                resources = container.setdefault("resources", {})
                for table in ("limits", "requests"):
                    resources.setdefault(table, {})[MEMORY_RESOURCE] = str(size)
            self._templates[size] = orjson.dumps(pod)

    def render(self, size: int, name: str, uid: str) -> bytes:
        return self._templates[size].replace(_UID_MARK, uid.encode()).replace(_NAME_MARK, name.encode())


def args_body(pod: bytes, names: Sequence[str]) -> bytes:
    """`ExtenderArgs` with `nodeCacheCapable: true`: the pod, `Nodes` null, the names."""
    return b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + orjson.dumps(names) + b"}"


def binding_body(name: str, uid: str, node: str) -> bytes:
    return orjson.dumps({"PodName": name, "PodNamespace": NAMESPACE, "PodUID": uid, "Node": node})


def best_host(priorities: Sequence[dict[str, Any]], asked: Sequence[str], rng: random.Random) -> str:
    """The host with the highest score; among equals, one at random (kube-scheduler's `selectHost`). A host
    asked about that the reply leaves out scores 0, as kube-scheduler counts it (`prioritizeNodes`)."""
    scores = {entry["Host"]: int(entry["Score"]) for entry in priorities}
    top = max(scores.values(), default=0)
    if top > 0:
        return str(rng.choice([host for host, score in scores.items() if score == top]))
    return str(rng.choice([host for host in asked if scores.get(host, 0) == 0]))


_HOST_KEY = b'{"Host":"'


def best_host_encoded(body: bytes, asked: Sequence[str], rng: random.Random) -> str | None:
    """`best_host` read straight from the encoded `HostPriorityList`, when it is in the form our server writes
    (`{"Host":"n","Score":7}`, keys in that order, no spaces, no host at 0); else None, and the caller decodes it
    in full. An empty list leaves every host asked at 0: one of them at random.

    Why: decoding a thousand small dicts and scanning them costs the client ~0.7 ms per reply on a 2-core VM,
    which made Locust, not the server, the limit of the run; a few byte searches cost ~0.1 ms.
    """
    if body == b"[]":
        return str(rng.choice(asked))
    for score in range(10, 0, -1):
        marker = b'"Score":%d}' % score
        if marker in body:
            break
    else:
        return None
    before = body.split(marker, rng.randrange(body.count(marker)) + 1)[-2]  # up to the chosen tie's score
    start = before.rfind(_HOST_KEY)
    if start < 0 or not before.endswith(b'",'):
        return None
    return before[start + len(_HOST_KEY) : -2].decode()


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Count, p50, p95, p99, max and mean of latencies (in whatever unit they came)."""
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "p50": percentile(ordered, 0.50),
        "p95": percentile(ordered, 0.95),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] if ordered else 0.0,
        "mean": sum(ordered) / len(ordered) if ordered else 0.0,
    }
