"""Prometheus metric definitions, in a registry of their own per service instance (tests build many).

Counters and histograms are updated where things happen; the gauges of state (cache sizes, allocations by
state) are read from the cache when /metrics is scraped, so nothing on the hot path keeps them current.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from extender.core.binding import Outcome
from extender.core.cache import Cache
from extender.core.holds import HoldState
from extender.core.placement.fit import Cause
from extender.core.placement.learned import Learned
from extender.core.quota.book import Quotas
from extender.service import gpu_metrics
from extender.service.gpu_metrics import RecentDemands
from extender.settings import GpuSeries

disable_created_metrics()  # type: ignore[no-untyped-call]  # `*_created` series double the exposition and nobody alerts on them

VERBS = ("filter", "filter-cpu", "prioritize", "bind", "preempt")
OUTCOMES = ("ok", "error", "bad_request")
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


SOURCE_FAMILIES: dict[str, tuple[str, str, Literal["counter", "gauge"]]] = {
    "watch_events": ("extender_watch_events_total", "Watch events applied to the cache.", "counter"),
    "lists": ("extender_lists_total", "Full lists applied (the first, then each relist).", "counter"),
    "api_failures": ("extender_api_failures_total", "List or watch failures, each retried after a backoff.", "counter"),
    "cache_synced": ("extender_cache_synced", "1 once the first list is in the cache.", "gauge"),
    "leader": ("extender_leader", "1 while this replica holds the lease.", "gauge"),
    "requeue_requests": (
        "extender_requeue_requests_total",
        "Annotations written on this replica's pod for kube-scheduler to retry the pods it rejected.",
        "counter",
    ),
    "connections_accepted": (
        "extender_http_connections_accepted_total",
        "Connections accepted, each a TLS handshake on HTTPS: growing with the requests, the client is not keeping "
        "its connections open.",
        "counter",
    ),
    "connections_refused": (
        "extender_http_connections_refused_total",
        "Connections closed at once because the listener had its most open (--max-connections).",
        "counter",
    ),
    "handshake_failures": (
        "extender_http_handshake_failures_total",
        "TLS handshakes that failed (a client without the scheduler's certificate) or did not finish in time.",
        "counter",
    ),
    "deadlines_missed": (
        "extender_http_deadlines_missed_total",
        "Connections closed because a request head, a body or a reader of replies missed its deadline.",
        "counter",
    ),
    "connections": ("extender_http_connections", "Open connections of the listener.", "gauge"),
    "bind_failure_events": (
        "extender_bind_failure_events_total",
        "Warning Events recorded for failed binds.",
        "counter",
    ),
}
"""The figures a source reports (`Source.counts`): its key, then the metric's name, help and type. Defined here,
with every other metric, so /metrics has one home; the source only counts."""

Count = tuple[str, dict[str, str], float]


class Listener(Protocol):
    """What a listener counts (`transport.HttpServer`)."""

    @property
    def accepted(self) -> int: ...
    @property
    def refused_connections(self) -> int: ...
    @property
    def handshake_failures(self) -> int: ...
    @property
    def timed_out(self) -> int: ...
    @property
    def connections(self) -> Sized: ...


class _SourceCollector:
    def __init__(self, counts: Callable[[], Iterable[Count]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, labels, value in self.counts():
            family = families.get(key)
            if family is None:
                name, help_text, kind = SOURCE_FAMILIES[key]
                build = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = families[key] = build(name, help_text, labels=sorted(labels))
            family.add_metric([labels[label] for label in sorted(labels)], value)
        yield from families.values()


class Metrics:
    def __init__(
        self, gpu_series: GpuSeries = GpuSeries.AUTO, gpu_series_limit: int = 10_000, quota_series_limit: int = 1000
    ) -> None:
        self.gpu_series = gpu_series
        self.gpu_series_limit = gpu_series_limit
        """Per-GPU series only while the cache holds at most this many GPUs (`gpu_metrics.py`)."""
        self.quota_series_limit = quota_series_limit
        """Per-limit quota series only while the quotas hold at most this many GPU limits."""
        self.demands = RecentDemands()
        """Memory per GPU of recent filter requests: the sizes fragmentation is measured against."""
        self.registry = CollectorRegistry()
        self.listeners: dict[str, Listener] = {}
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
        self.rejections = Counter(
            "extender_filter_rejections",
            "Nodes refused by filter, by cause (placement/fit.py Cause): not_in_cache, not_ready, locked, no_gpus, "
            "too_small, too_few, no_match (unresolvable: no GPU here could ever serve the pod), memory, compute, "
            "slots, exclusive, numa (failed: not now), quota (the namespace's ResourceQuota has no room left).",
            ["cause"],
            registry=self.registry,
        )
        self.rejected_by: dict[Cause, Any] = {
            cause: self.rejections.labels(cause.value) for cause in Cause if cause is not Cause.NONE
        }
        self.expiries = Counter(
            "extender_reservation_expiries",
            "Reservations freed because the API never showed their pod bound.",
            registry=self.registry,
        )
        self.group_expiries = Counter(
            "extender_group_hold_expiries",
            "Holds of jobs placed whole let go before all their members bound (their members did not come to "
            "bind within group_hold_ttl, or one was deleted): the job is planned again at its next filter.",
            registry=self.registry,
        )
        self.rechecks = Counter(
            "extender_filter_rechecks",
            "Filters of a preemptor that read possible victims from the API before refusing a node, by result: "
            "freed (some were gone: the watch was behind), unchanged, unanswered (the API did not answer in time).",
            ["result"],
            registry=self.registry,
        )
        for result in ("freed", "unchanged", "unanswered"):
            self.rechecks.labels(result)
        self.allocations = Gauge(
            "extender_allocations",
            "Pods holding GPU memory, by state (core/holds.py): assumed (their filter passed one node, no bind yet), "
            "grouped (held for a member of a job placed whole, no bind yet), reserved, bound (awaiting the watch), "
            "uncertain (a binding that failed but may have landed), observed.",
            ["state"],
            registry=self.registry,
        )
        self.binds = Counter(
            "extender_binds",
            "Binds by outcome (core/binding.py): bound, already_bound, refused (nothing written: not the leader, "
            "unknown pod or node, no longer fits), failed (the write failed; released), uncertain (it may have "
            "landed; kept until the watch or the TTL decides).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in Outcome:
            self.binds.labels(outcome.value)
        quota_labels = ["namespace", "quota", "resource", "model"]
        self.quota_limit = Gauge(
            "extender_quota_limit",
            "A GPU limit of a ResourceQuota (core/quota/), in its resource's unit: memory in the device plugin's, "
            "compute in % of a GPU, GPUs; model empty for every GPU.",
            quota_labels,
            registry=self.registry,
        )
        self.quota_used = Gauge(
            "extender_quota_used",
            "What the namespace's pods are given (observed and reserved) of what the quota's limit counts.",
            quota_labels,
            registry=self.registry,
        )
        self.quota_limits = Gauge(
            "extender_quota_limits", "GPU limits read from ResourceQuotas, in all.", registry=self.registry
        )
        self.quota_series = Gauge(
            "extender_quota_series",
            "1 while each quota limit has series of its own (see --quota-metrics-limit).",
            registry=self.registry,
        )
        self.loop_lag_seconds = Histogram(
            "extender_event_loop_lag",
            "How late the event loop ran a probe due every 20 ms: how long one handler or chore held it "
            "(service/lag.py).",
            unit="seconds",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.loop_lag_max = Gauge(
            "extender_event_loop_lag_max_seconds",
            "The longest the event loop was held since the previous scrape of /metrics, as the probe saw it.",
            registry=self.registry,
        )
        self.loop_lag_worst = 0.0
        """The longest lateness since the previous scrape (`_render_own` starts it over)."""
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

    def observe(self, seconds: float) -> None:
        """One probe of the event loop's lateness (`service/lag.py`)."""
        self.loop_lag_seconds.observe(seconds)
        self.loop_lag_worst = max(self.loop_lag_worst, seconds)

    def add_listener(self, name: str, server: Listener) -> None:
        """Report a listener's accepted and refused connections, failed handshakes, missed deadlines and open
        connections (every listener's in one collector: a family's HELP and TYPE lines come once per exposition)."""
        if not self.listeners:
            self.registry.register(_SourceCollector(self._listener_counts))
        self.listeners[name] = server

    def _listener_counts(self) -> Iterator[Count]:
        for name, server in self.listeners.items():
            labels = {"listener": name}
            yield "connections_accepted", labels, server.accepted
            yield "connections_refused", labels, server.refused_connections
            yield "handshake_failures", labels, server.handshake_failures
            yield "deadlines_missed", labels, server.timed_out
            yield "connections", labels, len(server.connections)

    def add_source(self, counts: Callable[[], Iterable[Count]]) -> None:
        """Report what a source counts (watch events, lists, API failures, leadership) at every scrape."""
        self.registry.register(_SourceCollector(counts))

    def render(self, cluster: Cache, quotas: Quotas, learned: Learned) -> bytes:
        """The exposition text, with the state gauges read from the cache now, in one go."""
        return self._render_own(cluster, quotas) + gpu_metrics.render(
            cluster, learned, self.demands, self.gpu_series, self.gpu_series_limit
        )

    async def render_yielding(self, cluster: Cache, quotas: Quotas, learned: Learned) -> bytes:
        """`render`, giving the event loop a turn between slices of nodes (what /metrics serves)."""
        own = self._render_own(cluster, quotas)
        return own + await gpu_metrics.render_yielding(
            cluster, learned, self.demands, self.gpu_series, self.gpu_series_limit
        )

    def _render_own(self, cluster: Cache, quotas: Quotas) -> bytes:
        self.loop_lag_max.set(self.loop_lag_worst)
        self.loop_lag_worst = 0.0  # the next scrape reports the longest since this one
        counts = dict.fromkeys(HoldState, 0)
        for hold in cluster.reserved.values():
            counts[hold.state] += 1
        counts[HoldState.OBSERVED] = sum(len(state.holds) for state in cluster.nodes.values()) - len(cluster.reserved)
        for state, count in counts.items():
            self.allocations.labels(state.value).set(count)
        self.cache_nodes.set(sum(1 for state in cluster.nodes.values() if state.known))
        self.cache_pods.set(len(cluster.pods))
        self._quotas(quotas)
        return generate_latest(self.registry)

    def _quotas(self, quotas: Quotas) -> None:
        """The quota families, read from the quotas now: per limit while there are at most `quota_series_limit`
        (a namespace's quotas come and go, so the series are written afresh)."""
        series = quotas.series()
        each = len(series) <= self.quota_series_limit
        self.quota_limit.clear()
        self.quota_used.clear()
        if each:
            for namespace, quota, limit, used in series:
                labels = (namespace, quota, limit.resource.value, limit.model)
                self.quota_limit.labels(*labels).set(limit.amount)
                self.quota_used.labels(*labels).set(used)
        self.quota_limits.set(len(series))
        self.quota_series.set(int(each))
