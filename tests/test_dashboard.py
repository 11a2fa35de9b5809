"""dashboards/gpu-extender.json: a Grafana dashboard model whose every query reads metrics a real extender
exposes, with labels and label values those metrics have, scoped to the extender its variables choose.

The exposition is what Prometheus scrapes: `GET /metrics` on the health port of a service composed as
`extender serve` composes it (`app.kube_service`, `app.serving`), over a small cluster, with per-GPU series on.
Its API source is built but never started: it reports its figures (watch events, lists, API failures,
leadership, retries asked) from the start, so no API server is needed.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.harness import HOST, free_port
from extender.app import kube_service, serving
from extender.service.gpu_metrics import CORE_FAMILIES, GPU_FAMILIES, LOCK_FAMILY, NODE_FAMILIES, SLOT_FAMILIES
from extender.service.metrics import SOURCE_FAMILIES
from extender.settings import GpuSeries, Settings
from extender.sources.kube.client import KubeClient
from extender.sources.kube.config import KubeConfig
from tests.builders import bound_pod, make_node, make_quota

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_FILE = ROOT / "dashboards" / "gpu-extender.json"
CHART_COPY = ROOT / "charts" / "gpu-extender" / "dashboards" / "gpu-extender.json"
DASHBOARD_PAGE = ROOT / "docs" / "operations" / "dashboard.md"
METRICS_PAGE = ROOT / "docs" / "operations" / "metrics.md"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
"""How every panel and query names its datasource: the dashboard's variable, never a datasource of one Grafana."""

SCOPE = {"job": "$job", "instance": "$instance"}
"""The matchers (`=~`) every selector of a panel carries, so the panels show the extender the variables choose."""

TARGET_LABELS = frozenset(SCOPE)
"""Labels Prometheus adds to every series it scrapes; no /metrics carries them."""

SCHEMA_VERSION = 39
"""The dashboard schema Grafana 10.4 and 11 write; a later Grafana migrates it when it loads the dashboard."""

GRID_COLUMNS = 24


# ---- reading PromQL ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selector:
    """A series selector of a query: its metric name and its label matchers (label, operator, value)."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True, slots=True)
class Query:
    selectors: tuple[Selector, ...]
    grouping: frozenset[str]
    """Labels named by `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`."""


GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
RANGE = re.compile(r"\[[^\]]*\]")
"""A range or a subquery's range (`[5m]`, `[$__rate_interval]`, `[1h:5m]`): never a metric."""
TOKEN = re.compile(
    r"""(?P<matchers>\{[^}]*\})
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      | (?<![\w.$])(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<call>\s*\()?""",
    re.VERBOSE,
)
"""Label matchers, a string, or a name (a function or aggregation when a parenthesis follows). A name right
after a digit, a dot or `$` is part of a number, a duration or a Grafana variable."""
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
    | {"by", "without", "on", "ignoring", "group_left", "group_right"}
)
"""Names that are PromQL's own (`group_left` may come without a label list)."""
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<expr>.*),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")


def parse(expr: str) -> Query:
    """The selectors and grouping labels of a PromQL expression (enough of PromQL for a dashboard's queries)."""
    grouping = {label.strip() for _, labels in GROUPING.findall(expr) for label in labels.split(",")}
    text = GROUPING.sub(" ", RANGE.sub("", expr))
    tokens = list(TOKEN.finditer(text))
    selectors = []
    for position, token in enumerate(tokens):
        if token["matchers"] and (position == 0 or not _selector_name(tokens[position - 1], text, token)):
            selectors.append(Selector("", tuple(MATCHER.findall(token["matchers"]))))  # {__name__=...}: unreadable
        name = token["name"]
        if not name or token["call"] or name.lower() in KEYWORDS:
            continue
        after = tokens[position + 1] if position + 1 < len(tokens) else None
        block = after["matchers"] if after is not None and _selector_name(token, text, after) else ""
        selectors.append(Selector(name, tuple(MATCHER.findall(block or ""))))
    return Query(tuple(selectors), frozenset(label for label in grouping if label))


def _selector_name(name: re.Match[str], text: str, matchers: re.Match[str]) -> bool:
    """Whether `matchers` are those of the metric `name` (nothing but blanks between them)."""
    return (
        bool(name["name"])
        and not name["call"]
        and bool(matchers["matchers"])
        and not text[name.end() : matchers.start()].strip()
    )


# ---- the dashboard ----------------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", ())


def queries(model: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every query of every panel."""
    for panel in panels(model):
        for target in panel.get("targets", ()):
            yield f"panel {panel['title']!r} query {target['refId']}", target["expr"]


def variables(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in model["templating"]["list"]}


def variable_queries(model: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, PromQL, label) for every `label_values(expr, label)` variable."""
    for name, variable in variables(model).items():
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            found = LABEL_VALUES.match(text)
            assert found, f"variable {name}: {text!r} is not label_values(expr, label)"
            yield f"variable {name}", found["expr"], found["label"]


# ---- the exposition ---------------------------------------------------------------------------------------


CLUSTER_NODES = [make_node("n1", gpus=2, mem=16), make_node("n2", gpus=1, mem=24)]
CLUSTER_PODS = [bound_pod("a", "n1", (0,), 10), bound_pod("b", "n1", (1,), 12)]
CLUSTER_QUOTAS = [
    make_quota("team", "default", **{"limits.aliyun.com/gpu-mem": "40", "limits.aliyun.com/gpu-count.T4": "2"})
]


async def scrape() -> str:
    """`GET /metrics` on the health port of a service composed as `extender serve` composes it."""
    settings = Settings(
        host=HOST,
        port=0,
        health_port=free_port(),
        insecure_http=True,
        identity="dashboard-test",
        lease_namespace="gpu-extender",
        pod_name="gpu-extender-0",
        gpu_metrics=GpuSeries.GPU,
    ).check()
    never_contacted = KubeConfig(server="https://127.0.0.1:9", source="never contacted", namespace="gpu-extender")
    async with KubeClient(never_contacted) as client:
        service, _ = kube_service(settings, client)
        service.cache.replace(CLUSTER_NODES, CLUSTER_PODS)
        service.quotas.replace(service.quotas.read(quota) for quota in CLUSTER_QUOTAS)
        async with (
            serving(service, settings, None) as listeners,
            aiohttp.ClientSession() as session,
            session.get(f"http://{HOST}:{listeners.health_port}/metrics") as response,
        ):
            assert response.status == 200
            return await response.text()


@dataclass(frozen=True, slots=True)
class Exposed:
    """What Prometheus would store from one scrape: per series name, each label and the values seen."""

    labels: dict[str, dict[str, set[str]]]

    def __contains__(self, metric: object) -> bool:
        return metric in self.labels


SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}
"""The series names a family's samples carry, by type (a gauge's and an untyped family's: its own name)."""


@functools.cache
def exposed() -> Exposed:
    """The series of a real /metrics, by the names a query uses: a histogram's `_bucket`, a counter's `_total`.
    A family declared without samples yet (children made on first use) still counts as exposed."""
    found: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(asyncio.run(scrape())):
        for suffix in SERIES_SUFFIXES.get(family.type, ("",)):
            found.setdefault(family.name + suffix, {})
        for sample in family.samples:
            labels = found.setdefault(sample.name, {})
            for label, value in sample.labels.items():
                labels.setdefault(label, set()).add(value)
    return Exposed(found)


def missing_metrics(model: dict[str, Any], metrics: Exposed) -> list[str]:
    """Every query's metric that /metrics does not carry, named with its panel and query."""
    found = []
    for where, expr in queries(model):
        query = parse(expr)
        if not query.selectors:
            found.append(f"{where}: no metric in {expr!r}")
        found += [
            f"{where}: {s.metric or repr(s)} is not in /metrics" for s in query.selectors if s.metric not in metrics
        ]
    return found


# ---- the metrics each query reads -------------------------------------------------------------------------


def test_every_metric_a_panel_queries_is_in_the_real_metrics() -> None:
    missing = missing_metrics(dashboard(), exposed())
    assert not missing, "\n".join(missing)


def test_a_panel_querying_a_metric_that_does_not_exist_fails() -> None:
    model = dashboard()
    broken = copy.deepcopy(model)
    first = next(panel for panel in panels(broken) if panel.get("targets"))
    first["targets"][0]["expr"] = 'sum(rate(extender_gpu_memory_leaked_total{job=~"$job"}[5m]))'
    assert missing_metrics(broken, exposed()) == [
        f"panel {first['title']!r} query A: extender_gpu_memory_leaked_total is not in /metrics"
    ]


def test_every_label_a_query_matches_or_groups_by_is_one_its_metrics_have() -> None:
    metrics, wrong = exposed(), []
    for where, expr in queries(dashboard()):
        query = parse(expr)
        known = set(TARGET_LABELS)
        for selector in query.selectors:
            have = metrics.labels.get(selector.metric, {}).keys() | TARGET_LABELS
            known |= have
            wrong += [
                f"{where}: {selector.metric} has no label {label}"
                for label, _, _ in selector.matchers
                if label not in have
            ]
        wrong += [f"{where}: grouped by {label}, which none of its metrics has" for label in query.grouping - known]
    assert not wrong, "\n".join(wrong)


def test_every_label_value_a_query_matches_exactly_is_one_its_metric_has() -> None:
    """`outcome="bonud"` would match nothing, `state!="obsreved"` everything: both only look like a panel."""
    metrics, wrong = exposed(), []
    for where, expr in queries(dashboard()):
        for selector in parse(expr).selectors:
            for label, operator, value in selector.matchers:
                if operator in {"=", "!="} and "$" not in value and label not in TARGET_LABELS:
                    seen = metrics.labels.get(selector.metric, {}).get(label, set())
                    if value not in seen:
                        wrong.append(f"{where}: {selector.metric} has no {label}={value!r} (has {sorted(seen)})")
    assert not wrong, "\n".join(wrong)


def test_every_query_is_scoped_to_the_job_and_replica_the_variables_choose() -> None:
    unscoped = []
    for where, expr in queries(dashboard()):
        for selector in parse(expr).selectors:
            matchers = {(label, operator, value) for label, operator, value in selector.matchers}
            lacking = [label for label, value in SCOPE.items() if (label, "=~", value) not in matchers]
            if lacking:
                unscoped.append(f"{where}: {selector.metric} lacks {lacking}")
    assert not unscoped, "\n".join(unscoped)


def test_every_variable_lists_the_values_of_a_real_metrics_label() -> None:
    metrics, wrong = exposed(), []
    for where, expr, label in variable_queries(dashboard()):
        for selector in parse(expr).selectors:
            if selector.metric not in metrics:
                wrong.append(f"{where}: {selector.metric} is not in /metrics")
            elif label not in metrics.labels[selector.metric].keys() | TARGET_LABELS:
                wrong.append(f"{where}: {selector.metric} has no label {label}")
    assert not wrong, "\n".join(wrong)


def test_the_metrics_read_are_every_family_the_extender_defines() -> None:
    """The scrape these tests read carries the source's and the listeners' families and the GPU families, so a
    panel on any of them is checked against what a live extender serves."""
    defined = {name for name, _, _ in SOURCE_FAMILIES.values()} | {name for name, _ in GPU_FAMILIES + NODE_FAMILIES}
    assert not [name for name in defined if name not in exposed()]
    assert exposed().labels["extender_http_connections"]["listener"] == {"verbs", "health"}


@pytest.mark.parametrize(
    ("expr", "metrics", "grouping"),
    [
        ('extender_gpus{job=~"$job"}', {"extender_gpus"}, set()),
        (
            'histogram_quantile(0.99, sum by (verb, le) (rate(extender_request_duration_seconds_bucket{job=~"$job"}'
            "[$__rate_interval])))",
            {"extender_request_duration_seconds_bucket"},
            {"verb", "le"},
        ),
        ("max by (node, gpu) (a) / on (node) group_left (gpu) b offset 5m", {"a", "b"}, {"node", "gpu"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)") * 1e3', {"up"}, set()),
        ("bottomk(20, c) and d[1h:5m] unless e", {"c", "d", "e"}, set()),
        ('sum(x{cause="memory", instance=~"a|b"}) without (pod)', {"x"}, {"pod"}),
        ('count({__name__=~"extender_.+"})', {""}, set()),  # no name to check: reported as unreadable
    ],
    ids=[
        "selector",
        "histogram",
        "vector-matching",
        "strings-and-numbers",
        "subquery-and-keywords",
        "without",
        "bare-matchers",
    ],
)
def test_metric_names_and_grouping_labels_are_read_from_promql(
    expr: str, metrics: set[str], grouping: set[str]
) -> None:
    query = parse(expr)
    assert {selector.metric for selector in query.selectors} == metrics
    assert query.grouping == grouping


def test_label_matchers_are_read_with_their_metric() -> None:
    (selector,) = parse('rate(extender_binds_total{job=~"$job", outcome!="bound"}[5m])').selectors
    assert selector == Selector("extender_binds_total", (("job", "=~", "$job"), ("outcome", "!=", "bound")))


# ---- the dashboard model ----------------------------------------------------------------------------------


def test_the_dashboard_has_a_uid_a_title_and_the_schema_of_grafana_10_and_11() -> None:
    model = dashboard()
    assert model["uid"] == "gpu-extender" and model["title"]
    assert model["schemaVersion"] == SCHEMA_VERSION
    assert "id" not in model or model["id"] is None, "an id is one Grafana's database key: import would clash"


def test_the_datasource_is_a_prometheus_variable() -> None:
    datasource = variables(dashboard())["datasource"]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")


def test_every_panel_and_query_and_variable_reads_the_datasource_variable() -> None:
    model = dashboard()
    elsewhere = [
        f"panel {panel['title']!r}"
        for panel in panels(model)
        if panel["type"] != "row"
        and (panel.get("datasource") != DATASOURCE or any(t.get("datasource") != DATASOURCE for t in panel["targets"]))
    ]
    elsewhere += [
        f"variable {name}"
        for name, variable in variables(model).items()
        if variable["type"] == "query" and variable["datasource"] != DATASOURCE
    ]
    assert not elsewhere


def test_every_panel_but_a_row_has_queries_with_distinct_ref_ids() -> None:
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            continue
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(target["expr"].strip() for target in panel["targets"]), panel["title"]


def test_panel_ids_are_unique() -> None:
    ids = [panel["id"] for panel in panels(dashboard())]
    assert len(ids) == len(set(ids))


def test_panels_lie_on_the_grid_without_overlapping() -> None:
    cells: dict[tuple[int, int], str] = {}
    overlaps = []
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("x", "y", "w", "h")), panel["title"]
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] >= 0 and grid["x"] + grid["w"] <= GRID_COLUMNS
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                if (x, y) in cells:
                    overlaps.append(f"{panel['title']!r} overlaps {cells[x, y]!r} at {x},{y}")
                cells[x, y] = panel["title"]
    assert not overlaps, overlaps[:5]


def test_panel_titles_are_unique() -> None:
    titles = Counter(panel["title"] for panel in panels(dashboard()) if panel["type"] != "row")
    assert not [title for title, count in titles.items() if count > 1]


# ---- where it is described and shipped ---------------------------------------------------------------------


def page_text(page: Path) -> str:
    """A docs page, its lines joined as Markdown renders them."""
    return " ".join(page.read_text().split())


def test_the_dashboard_page_describes_every_panel() -> None:
    text = page_text(DASHBOARD_PAGE)
    undescribed = [panel["title"] for panel in panels(dashboard()) if panel["title"] not in text]
    assert not undescribed, f"panels docs/operations/dashboard.md does not name: {undescribed}"


def test_the_metrics_page_names_every_family_a_real_scrape_carries() -> None:
    """By the name a query uses (a counter's `_total`), in full: an operator searches the page for it. The
    scrape is a gpushare cluster's, so the families only HAMi's nodes have are named from their definitions."""
    text = page_text(METRICS_PAGE)
    names = [
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(asyncio.run(scrape()))
    ]
    names += [name for name, _ in CORE_FAMILIES + SLOT_FAMILIES + (LOCK_FAMILY,)]
    assert len(names) > 30
    unnamed = [name for name in names if f"`{name}`" not in text]
    assert not unnamed, f"metrics docs/operations/metrics.md does not name: {unnamed}"


def test_the_chart_ships_this_dashboard() -> None:
    """Helm reads files inside the chart only: its copy must be this file, byte for byte."""
    assert CHART_COPY.read_bytes() == DASHBOARD_FILE.read_bytes()
