"""The alert rules (manifests/alerts/prometheusrule.yaml, and the chart's copy): run by Prometheus' own
`promtool test rules` over the cases of tests/promtool/gpu-extender.test.yaml, every metric they read one a real
/metrics carries, every alert with a firing case, a quiet case and a runbook in docs/operations/alerts.md.

promtool is built from Prometheus' source by tests/promtool/build.sh (`make test` runs it first; a test that finds
it missing runs it, tests/gotools.py): without a Go toolchain these tests skip; with Go, a failed build fails them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster.layout import cache_root
from extender.service.gpu_metrics import LOCK_FAMILY
from extender.settings import Settings
from tests.gotools import Tool, built
from tests.test_chart import CHART, run_helm
from tests.test_dashboard import exposed, parse

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "manifests" / "alerts" / "prometheusrule.yaml"
CHART_COPY = CHART / "alerts" / "prometheusrule.yaml"
CASES = ROOT / "tests" / "promtool" / "gpu-extender.test.yaml"
BUILD_SCRIPT = ROOT / "tests" / "promtool" / "build.sh"
RUNBOOKS = ROOT / "docs" / "operations" / "alerts.md"
RULE_FILE = "gpu-extender.rules.yaml"
"""The name the cases' `rule_files` give the rules' groups."""


def promtool_version() -> str:
    """The version build.sh pins (its `version=` line)."""
    found = re.search(r"^version=(v[0-9.]+)$", BUILD_SCRIPT.read_text(), re.MULTILINE)
    assert found, f"{BUILD_SCRIPT}: no version= line"
    return found.group(1)


def promtool() -> str:
    """The pinned promtool: built by build.sh where Go is installed and it is missing (a failed build fails the
    test); the tests skip only on a machine without Go."""
    binary = cache_root() / f"promtool-{promtool_version()}" / "promtool"
    return built(Tool(binary, BUILD_SCRIPT, "alert rule tests"))


def rule_object() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return body


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_object()["spec"]["groups"] for rule in group["rules"]]


def cases() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CASES.read_text())
    return loaded


def expected_alerts() -> list[tuple[str, list[dict[str, Any]]]]:
    """Every (alert name, expected alerts) the cases check."""
    return [
        (check["alertname"], check.get("exp_alerts") or [])
        for test in cases()["tests"]
        for check in test.get("alert_rule_test", [])
    ]


def with_plain_annotations(loaded: dict[str, Any]) -> dict[str, Any]:
    """The cases with each expected alert's `description` and `runbook` taken from its rule: plain text there,
    and promtool compares every annotation (the templated `summary` is written out in the cases)."""
    plain = {rule["alert"]: {key: rule["annotations"][key] for key in ("description", "runbook")} for rule in rules()}
    for test in loaded["tests"]:
        for check in test.get("alert_rule_test", []):
            for alert in check.get("exp_alerts") or []:
                alert["exp_annotations"] = {**alert.get("exp_annotations", {}), **plain[check["alertname"]]}
    return loaded


def run_promtool(folder: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *arguments], cwd=folder, capture_output=True, text=True, timeout=120, check=False
    )


def write_rules_and_cases(folder: Path, rule_groups: dict[str, Any]) -> None:
    (folder / RULE_FILE).write_text(yaml.safe_dump(rule_groups, sort_keys=False))
    (folder / CASES.name).write_text(yaml.safe_dump(with_plain_annotations(cases()), sort_keys=False))


# ---- promtool ------------------------------------------------------------------------------------------


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    (tmp_path / RULE_FILE).write_text(yaml.safe_dump(rule_object()["spec"]))
    result = run_promtool(tmp_path, "check", "rules", RULE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_rules_pass(tmp_path: Path) -> None:
    write_rules_and_cases(tmp_path, rule_object()["spec"])
    result = run_promtool(tmp_path, "test", "rules", CASES.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fail_on_a_wrong_threshold(tmp_path: Path) -> None:
    """The cases notice a rule that fires too late: no-leader's `for` doubled."""
    spec = rule_object()["spec"]
    (no_leader,) = (
        rule for group in spec["groups"] for rule in group["rules"] if rule["alert"] == "GpuExtenderNoLeader"
    )
    no_leader["for"] = "4m"
    write_rules_and_cases(tmp_path, spec)
    result = run_promtool(tmp_path, "test", "rules", CASES.name)
    assert result.returncode != 0
    assert "GpuExtenderNoLeader" in result.stdout + result.stderr


# ---- the cases cover every rule --------------------------------------------------------------------------


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    names = [rule["alert"] for rule in rules()]
    firing = {name for name, alerts in expected_alerts() if alerts}
    quiet = {name for name, alerts in expected_alerts() if not alerts}
    assert len(names) == len(set(names)) and len(names) >= 10
    assert not set(names) - firing, f"no case where these fire: {sorted(set(names) - firing)}"
    assert not set(names) - quiet, f"no case where these stay quiet: {sorted(set(names) - quiet)}"


def test_every_alert_has_a_severity_a_summary_and_plain_description() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert "{{" not in rule["annotations"]["description"], f"{rule['alert']}: keep templates in the summary"


# ---- what the rules read exists ----------------------------------------------------------------------------


def test_every_metric_a_rule_reads_is_in_the_real_metrics() -> None:
    """By a real /metrics (tests/test_dashboard.py's scrape, a gpushare cluster's): HAMi's node lock is named
    from its definition."""
    metrics, hami_only = exposed(), {LOCK_FAMILY[0]}
    missing = [
        f"{rule['alert']}: {selector.metric}"
        for rule in rules()
        for selector in parse(rule["expr"]).selectors
        if selector.metric not in metrics and selector.metric not in hami_only
    ]
    assert not missing, f"metrics no /metrics carries: {missing}"


def test_every_label_value_a_rule_matches_exactly_is_one_its_metric_has() -> None:
    metrics = exposed()
    wrong = []
    for rule in rules():
        for selector in parse(rule["expr"]).selectors:
            for label, operator, value in selector.matchers:
                seen = metrics.labels.get(selector.metric, {}).get(label)
                if operator == "=" and label != "le" and (seen is None or value not in seen):
                    wrong.append(f"{rule['alert']}: {selector.metric}{{{label}={value!r}}}, seen {seen}")
                if operator == "=~" and (seen is None or not all(part in seen for part in value.split("|"))):
                    wrong.append(f"{rule['alert']}: {selector.metric}{{{label}=~{value!r}}}, seen {seen}")
    assert not wrong, "\n".join(wrong)


def test_every_alert_has_its_runbook_in_the_docs() -> None:
    """Each rule's `runbook` is docs/operations/alerts.md with the anchor of a heading named for the alert."""
    headings = {
        line.lstrip("#").strip().lower() for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")
    }
    for rule in rules():
        assert rule["annotations"]["runbook"] == f"docs/operations/alerts.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in headings, f"{rule['alert']}: no `## {rule['alert']}` in {RUNBOOKS.name}"


def test_the_runbooks_quote_the_codes_defaults() -> None:
    """Each default a runbook names, as the page writes it, from `Settings`: a changed default fails here."""
    text = " ".join(RUNBOOKS.read_text().split())
    defaults = Settings()
    quoted = [
        f"`lease_duration` ({defaults.lease_duration:g} s)",
        f"`reservation_ttl` ({defaults.reservation_ttl:g} s)",
        f"`group_hold_ttl` ({defaults.group_hold_ttl:g} s)",
        f"`node_lock_timeout` ({defaults.node_lock_timeout:g} s)",
        f"`max_connections`, {defaults.max_connections}; `health_max_connections`, {defaults.health_max_connections},",
        f"did not finish within {defaults.handshake_timeout:g} s on port {defaults.port}",
    ]
    assert [quote for quote in quoted if quote not in text] == []


# ---- shipped in the chart ----------------------------------------------------------------------------------


def test_the_chart_holds_these_rules() -> None:
    """Helm reads files inside the chart only: its copy must be this file, byte for byte."""
    assert CHART_COPY.read_bytes() == RULES.read_bytes()


def rendered(*values: str) -> list[dict[str, Any]]:
    result = run_helm("template", "gpu-extender", str(CHART), "--namespace", "gpu-extender", *values)
    assert result.returncode == 0, result.stderr
    return [body for body in yaml.safe_load_all(result.stdout) if body and body["kind"] == "PrometheusRule"]


def test_the_chart_renders_no_rules_by_default() -> None:
    assert rendered() == []


def test_the_chart_renders_the_rules_when_asked_with_the_labels_given() -> None:
    (rule,) = rendered(
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.prometheusRule.labels.release=prometheus",
    )
    assert rule["spec"] == rule_object()["spec"]
    assert rule["metadata"]["namespace"] == "gpu-extender"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["metadata"]["labels"]["app.kubernetes.io/component"] == "alerts"
