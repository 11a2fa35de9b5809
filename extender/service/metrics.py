"""Prometheus metric definitions, in a registry of their own per service instance (tests build many).

Counters and histograms are updated where things happen; the gauges of state (cache sizes, allocations by
state) are read from the cache when /metrics is scraped, so nothing on the hot path keeps them current.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from extender.core.cache import Cache

disable_created_metrics()  # type: ignore[no-untyped-call]  # `*_created` series double the exposition and nobody alerts on them

VERBS = ("filter", "prioritize", "bind", "preempt")
OUTCOMES = ("ok", "error", "bad_request")
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class Sample:
    """One value a source reports when /metrics is scraped (its own counters, read, not copied)."""

    name: str
    help: str
    kind: Literal["counter", "gauge"]
    value: float
    labels: dict[str, str] = field(default_factory=dict)


class _SourceCollector:
    def __init__(self, samples: Callable[[], Iterable[Sample]]) -> None:
        self.samples = samples

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for sample in self.samples():
            family = families.get(sample.name)
            if family is None:
                kind = CounterMetricFamily if sample.kind == "counter" else GaugeMetricFamily
                family = families[sample.name] = kind(sample.name, sample.help, labels=sorted(sample.labels))
            family.add_metric([sample.labels[key] for key in sorted(sample.labels)], sample.value)
        yield from families.values()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "extender_requests",
            "Extender verb calls by outcome (ok, error, bad_request).",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "extender_request_duration_seconds",
            "Time to answer an extender verb, by outcome.",
            ["verb", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.nodes = Counter(
            "extender_filter_nodes",
            "Node names judged by filter: accepted, failed, unresolvable.",
            ["result"],
            registry=self.registry,
        )
        self.expiries = Counter(
            "extender_reservation_expiries",
            "Reservations freed because the API never showed their pod bound.",
            registry=self.registry,
        )
        self.rechecks = Counter(
            "extender_filter_rechecks",
            "Filters of a preemptor that read possible victims from the API before refusing a node, by result: "
            "freed (some were gone: the watch was behind), unchanged, unanswered (the API did not answer in time).",
            ["result"],
            registry=self.registry,
        )
        self.allocations = Gauge(
            "extender_allocations",
            "Pods holding GPU memory, by state: reserved, bound (awaiting watch), observed.",
            ["state"],
            registry=self.registry,
        )
        self.cache_nodes = Gauge("extender_cache_nodes", "Nodes in the cache.", registry=self.registry)
        self.cache_pods = Gauge("extender_cache_pods", "Pods in the cache.", registry=self.registry)
        # The labelled children, bound once: `labels()` on every request costs more than the increment.
        self.verbs: dict[tuple[str, str], tuple[Any, Any]] = {
            (verb, outcome): (self.requests.labels(verb, outcome), self.latency.labels(verb, outcome))
            for verb in VERBS
            for outcome in OUTCOMES
        }
        self.nodes_accepted = self.nodes.labels("accepted")
        self.nodes_failed = self.nodes.labels("failed")
        self.nodes_unresolvable = self.nodes.labels("unresolvable")

    def add_source(self, samples: Callable[[], Iterable[Sample]]) -> None:
        """Report what a source counts (watch events, lists, API failures, leadership) at every scrape."""
        self.registry.register(_SourceCollector(samples))

    def render(self, cluster: Cache) -> bytes:
        """The exposition text, with the state gauges read from the cache now."""
        reserved = sum(1 for hold in cluster.reserved.values() if not hold.bound)
        bound = len(cluster.reserved) - reserved
        observed = sum(len(state.holds) for state in cluster.nodes.values()) - len(cluster.reserved)
        self.allocations.labels("reserved").set(reserved)
        self.allocations.labels("bound").set(bound)
        self.allocations.labels("observed").set(observed)
        self.cache_nodes.set(sum(1 for state in cluster.nodes.values() if state.known))
        self.cache_pods.set(len(cluster.pods))
        return generate_latest(self.registry)
