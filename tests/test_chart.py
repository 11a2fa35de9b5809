"""charts/gpu-extender/: linted and rendered by a real helm (tests/helm/build.sh), every object valid for the
Kubernetes versions manifests/ is checked for, and, with default values in the namespace gpu-extender, the same
objects as manifests/ but for the labels Helm adds, so the chart and the manifests cannot drift apart; with
protocol=hami, the same objects as kustomize builds from manifests/hami/ (and hami/second-scheduler/), the hami
values as the extender's flags, and the second scheduler's configuration what `extender scheduler-config` renders
for the extender's settings.

helm and kubectl are the pinned builds of tests/helm/build.sh and tests/e2e/build.sh (tests/gotools.py): a test
that finds one missing builds it where Go is installed and fails if that fails; it skips only without Go.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import posixpath
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from extender import cli
from extender import settings as settings_module
from extender.core.devices import Strategy
from extender.core.placement.config import Policy
from extender.service.pages import build_health_server
from extender.settings import Protocol, Settings
from extender.sources.kube.writes import LEADER_LABEL
from extender.tools.schedconfig import render as scheduler_config
from tests.builders import make_cluster
from tests.conftest import make_service
from tests.gotools import helm, helm_version, kubectl
from tests.test_manifests import (
    ANY_NAME,
    CERT_MANAGER_SCHEMAS,
    CLUSTER,
    EXTENDER_GRANTS,
    MANIFESTS,
    NAMESPACE,
    VALIDATED_VERSIONS,
    Grant,
    documents,
    grants_of_rules,
)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-extender"
DASHBOARD_FILE = ROOT / "dashboards" / "gpu-extender.json"
RELEASE = "gpu-extender"

HELM_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}
"""The labels the chart adds to every object beyond those of manifests/ (never to a selector or a pod)."""

CONFIG_CHECKSUM = "checksum/config"
"""gpu-scheduler's pod annotation that rolls it when its configuration changes (kustomize's hash suffix)."""

# ---- scenarios: the values each test renders with --------------------------------------------------------

Values = dict[str, Any]

DEFAULTS: Values = {}
SECOND_SCHEDULER: Values = {"secondScheduler": {"enabled": True}}
CERT_MANAGER: Values = {"certificates": {"certManager": {"enabled": True}}}
OWN_SECRET_NAMES = {"servingSecretName": "my-serving", "schedulerClientSecretName": "my-scheduler-client"}
OWN_SECRETS: Values = {"certificates": OWN_SECRET_NAMES, **SECOND_SCHEDULER}
OWN_SECRETS_BY_CERT_MANAGER: Values = {
    "certificates": {**OWN_SECRET_NAMES, "certManager": {"enabled": True}},
    **SECOND_SCHEDULER,
}
CREATE_NAMESPACE = {"createNamespace": True}
NO_NETWORK_POLICY = {"networkPolicy": {"enabled": False}}
OWN_PROMETHEUS = {
    "networkPolicy": {
        "healthPortFrom": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                "podSelector": {"matchLabels": {"app": "prometheus-server"}},
            }
        ]
    }
}
POD_MONITOR = {"monitoring": {"podMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "prom"}}}}
SERVICE_MONITOR = {
    "monitoring": {"serviceMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "prom"}}}
}
DASHBOARD = {"monitoring": {"dashboard": {"enabled": True}}}
DASHBOARD_IN_GRAFANAS_NAMESPACE = {
    "monitoring": {"dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "GPU"}}}
}
ONE_REPLICA = {"replicas": 1, "secondScheduler": {"enabled": True, "replicas": 1}}
OWN_IMAGE = {"image": {"repository": "registry.example.com/gpu-extender", "tag": "0.2.0", "pullPolicy": "Always"}}
OWN_SCHEDULER_CONFIG = {"secondScheduler": {"enabled": True, "config": "apiVersion: kubescheduler.config.k8s.io/v1\n"}}
MANIFESTS_ALL = {**SECOND_SCHEDULER, **CERT_MANAGER, **CREATE_NAMESPACE}
"""What `kubectl apply -k` of manifests/, manifests/cert-manager/ and manifests/second-scheduler/ makes."""
EVERYTHING = {
    **MANIFESTS_ALL,
    "monitoring": {**POD_MONITOR["monitoring"], **SERVICE_MONITOR["monitoring"], **DASHBOARD["monitoring"]},
}
OWN_SCHEDULER_NAME = {"secondScheduler": {"enabled": True, "schedulerName": "gpu-share"}}
HAMI: Values = {"protocol": "hami"}
HAMI_SECOND_SCHEDULER: Values = {**HAMI, **SECOND_SCHEDULER}
HAMI_ALL = {**MANIFESTS_ALL, **HAMI}
"""What `kubectl apply -k` of manifests/hami/, manifests/cert-manager/ and manifests/hami/second-scheduler/ makes."""
HAMI_OWN_SCHEDULER_NAME = {**HAMI, **OWN_SCHEDULER_NAME}
HAMI_SETTINGS: Values = {
    **HAMI_SECOND_SCHEDULER,
    "hami": {
        "defaultMemory": 1024,
        "defaultCores": 30,
        "memoryFactor": 1024,
        "nodeLockTimeout": 2.5,
        "topologyAll": True,
        "defaultSchedulerPolicy": {"gpuSchedulerPolicy": "binpack"},
    },
}
"""Every hami value away from its default: HAMi's GPU policy binpack, its node policy left at HAMi's binpack."""
HAMI_NODE_SPREAD: Values = {
    **HAMI_SECOND_SCHEDULER,
    "hami": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread"}},
}
"""HAMi's node policy spread, its GPU policy left at HAMi's spread."""

SCENARIOS: dict[str, Values] = {
    "defaults": DEFAULTS,
    "second-scheduler": SECOND_SCHEDULER,
    "cert-manager": CERT_MANAGER,
    "own-secrets": OWN_SECRETS,
    "own-secrets-by-cert-manager": OWN_SECRETS_BY_CERT_MANAGER,
    "create-namespace": CREATE_NAMESPACE,
    "no-network-policy": NO_NETWORK_POLICY,
    "own-prometheus": OWN_PROMETHEUS,
    "pod-monitor": POD_MONITOR,
    "service-monitor": SERVICE_MONITOR,
    "dashboard": DASHBOARD,
    "dashboard-in-grafanas-namespace": DASHBOARD_IN_GRAFANAS_NAMESPACE,
    "one-replica": ONE_REPLICA,
    "own-image": OWN_IMAGE,
    "own-scheduler-config": OWN_SCHEDULER_CONFIG,
    "manifests-all": MANIFESTS_ALL,
    "everything": EVERYTHING,
    "own-scheduler-name": OWN_SCHEDULER_NAME,
    "hami": HAMI,
    "hami-second-scheduler": HAMI_SECOND_SCHEDULER,
    "hami-all": HAMI_ALL,
    "hami-own-scheduler-name": HAMI_OWN_SCHEDULER_NAME,
    "hami-settings": HAMI_SETTINGS,
    "hami-node-spread": HAMI_NODE_SPREAD,
}


# ---- helm ------------------------------------------------------------------------------------------------


def run_helm(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *arguments], capture_output=True, text=True, timeout=60, check=False)


def value_flags(values: Values) -> list[str]:
    return [flag for key, value in values.items() for flag in ("--set-json", f"{key}={json.dumps(value)}")]


@functools.cache
def rendered_text(scenario: str, namespace: str = NAMESPACE) -> str:
    result = run_helm("template", RELEASE, str(CHART), "--namespace", namespace, *value_flags(SCENARIOS[scenario]))
    assert result.returncode == 0, result.stderr
    return result.stdout


@functools.cache
def render(scenario: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The rendered objects (cached: tests read them, never change them)."""
    return [body for body in yaml.safe_load_all(rendered_text(scenario, namespace)) if body]


Identity = tuple[str, str, str | None]
"""(kind, name, namespace or None)."""


def identity(body: dict[str, Any]) -> Identity:
    return body["kind"], body["metadata"]["name"], body["metadata"].get("namespace")


def find(bodies: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = (body for body in bodies if (body["kind"], body["metadata"]["name"]) == (kind, name))
    return found


def container(bodies: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (only,) = find(bodies, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def mounted_secrets(bodies: list[dict[str, Any]], deployment: str) -> set[str]:
    volumes = find(bodies, "Deployment", deployment)["spec"]["template"]["spec"]["volumes"]
    return {volume["secret"]["secretName"] for volume in volumes if "secret" in volume}


# ---- manifests/ ------------------------------------------------------------------------------------------


def manifests_in(folder: str) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k manifests/<folder>` makes (generated ConfigMaps before their hash)."""
    return [doc.body for doc in documents() if posixpath.dirname(doc.path) == folder]


MANIFEST_FOLDERS = ("base", "second-scheduler", "cert-manager")
MANIFEST_OBJECTS = {identity(body): body for folder in MANIFEST_FOLDERS for body in manifests_in(folder)}


def without_helm_additions(body: dict[str, Any]) -> dict[str, Any]:
    """The object less what the chart adds to manifests/: Helm's labels, and gpu-scheduler's config checksum."""
    copy: dict[str, Any] = json.loads(json.dumps(body))
    labels = copy["metadata"].get("labels", {})
    assert labels.keys() >= HELM_LABELS, f"{identity(body)}: Helm's labels missing"
    for label in HELM_LABELS:
        del labels[label]
    if not labels:
        copy["metadata"].pop("labels", None)
    template = copy.get("spec", {}).get("template", {}).get("metadata", {})
    template.get("annotations", {}).pop(CONFIG_CHECKSUM, None)
    if template.get("annotations") == {}:
        del template["annotations"]
    return copy


# ---- lint and schemas ------------------------------------------------------------------------------------


def test_helm_is_the_version_build_sh_pins() -> None:
    result = run_helm("version", "--short")
    assert result.stdout.startswith(helm_version()), result.stdout


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_passes_strictly_with(scenario: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *value_flags(SCENARIOS[scenario]))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_misspelt_value_is_refused() -> None:
    result = run_helm("template", RELEASE, str(CHART), *value_flags({"secondSchedular": {"enabled": True}}))
    assert result.returncode != 0
    assert "secondSchedular" in result.stderr


def test_a_network_policy_opening_the_health_port_to_all_is_refused() -> None:
    # an empty `from` lets every client in
    result = run_helm("template", RELEASE, str(CHART), *value_flags({"networkPolicy": {"healthPortFrom": []}}))
    assert result.returncode != 0
    assert "healthPortFrom" in result.stderr


REFUSED: dict[str, tuple[Values, str]] = {
    "an unknown protocol": ({"protocol": "nvidia"}, "/protocol"),
    "a memory factor of 0": ({**HAMI, "hami": {"memoryFactor": 0}}, "/hami/memoryFactor"),
    "more than 100 % of compute": ({**HAMI, "hami": {"defaultCores": 101}}, "/hami/defaultCores"),
    "a negative default memory": ({**HAMI, "hami": {"defaultMemory": -1}}, "/hami/defaultMemory"),
    "HAMi's Go duration for the node lock (ours is seconds)": (
        {**HAMI, "hami": {"nodeLockTimeout": "5m"}},
        "/hami/nodeLockTimeout",
    ),
    "a node lock that never lasts": ({**HAMI, "hami": {"nodeLockTimeout": 0}}, "/hami/nodeLockTimeout"),
    "a GPU policy chain (pods annotate their own)": (
        {**HAMI, "hami": {"defaultSchedulerPolicy": {"gpuSchedulerPolicy": "binpack,numa"}}},
        "/hami/defaultSchedulerPolicy/gpuSchedulerPolicy",
    ),
    "a misspelt hami value": ({**HAMI, "hami": {"memoryFactr": 1024}}, "memoryFactr"),
    "a hami value with gpushare, which would ignore it": ({"hami": {"memoryFactor": 1024}}, "/hami/memoryFactor"),
    "a HAMi policy with gpushare": (
        {"hami": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread"}}},
        "/hami/defaultSchedulerPolicy/nodeSchedulerPolicy",
    ),
    "a second scheduler named as the cluster's own": (
        {"secondScheduler": {"enabled": True, "schedulerName": "default-scheduler"}},
        "/secondScheduler/schedulerName",
    ),
    "a scheduler name no pod can give": (
        {"secondScheduler": {"enabled": True, "schedulerName": "HAMi_Scheduler"}},
        "/secondScheduler/schedulerName",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_the_schema_refuses(case: str) -> None:
    values, named = REFUSED[case]
    result = run_helm("template", RELEASE, str(CHART), *value_flags(values))
    assert result.returncode != 0
    assert named in result.stderr, result.stderr


@functools.cache
def every_rendered_object() -> list[dict[str, Any]]:
    unique = {json.dumps(body, sort_keys=True) for scenario in SCENARIOS for body in render(scenario)}
    return [json.loads(text) for text in sorted(unique)]


def is_custom_resource(body: dict[str, Any]) -> bool:
    return str(body["apiVersion"]).split("/")[0] in {"cert-manager.io", "monitoring.coreos.com"}


@pytest.mark.parametrize("version", VALIDATED_VERSIONS)
def test_every_rendered_object_is_valid_for(version: str) -> None:
    failures = []
    for body in every_rendered_object():
        if is_custom_resource(body):
            continue  # not in kubernetes-validate: test_custom_resources_match_their_schema
        try:
            kubernetes_validate.validate(body, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{identity(body)}: {'.'.join(map(str, error.path))}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            failures.append(f"{identity(body)}: {error.message}")
    assert not failures, "\n".join(failures)


_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
"""The Prometheus Operator's Duration."""
_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "additionalProperties": False,
    "properties": {"matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}},
}
_ENDPOINTS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["port", "path"],
        "additionalProperties": False,
        "properties": {
            "port": _NAME,
            "path": {"type": "string", "pattern": "^/"},
            "interval": {"type": "string", "pattern": _DURATION},
        },
    },
}


def _monitor_schema(kind: str, endpoints: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "required": ["name", "namespace"],
                "additionalProperties": False,
                "properties": {"name": _NAME, "namespace": _NAME, "labels": {"type": "object"}},
            },
            "spec": {
                "type": "object",
                "required": ["selector", endpoints],
                "additionalProperties": False,
                "properties": {"selector": _SELECTOR, endpoints: _ENDPOINTS},
            },
        },
    }


PROMETHEUS_OPERATOR_SCHEMAS = {
    "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints"),
    "ServiceMonitor": _monitor_schema("ServiceMonitor", "endpoints"),
}
"""The part of the Prometheus Operator's v1 CRDs the chart uses (its CRDs are not in kubernetes-validate)."""


def test_custom_resources_match_their_schema() -> None:
    schemas = {**CERT_MANAGER_SCHEMAS, **PROMETHEUS_OPERATOR_SCHEMAS}
    formats = jsonschema.Draft202012Validator.FORMAT_CHECKER
    failures, kinds = [], set()
    for body in filter(is_custom_resource, every_rendered_object()):
        kinds.add(body["kind"])
        validator = jsonschema.Draft202012Validator(schemas[body["kind"]], format_checker=formats)
        failures += [f"{identity(body)}: {error.message}" for error in validator.iter_errors(body)]
    assert not failures, "\n".join(failures)
    assert kinds == set(schemas)


# ---- the same objects as manifests/ ---------------------------------------------------------------------


def identities(bodies: list[dict[str, Any]]) -> set[Identity]:
    return {identity(body) for body in bodies}


def test_defaults_render_the_objects_of_manifests_but_the_namespace() -> None:
    # `helm install --create-namespace` makes the namespace; createNamespace=true renders it (below)
    expected = identities(manifests_in("base")) - {("Namespace", NAMESPACE, None)}
    assert identities(render("defaults")) == expected


@pytest.mark.parametrize(
    ("scenario", "folder"),
    [("second-scheduler", "second-scheduler"), ("cert-manager", "cert-manager")],
)
def test_an_option_adds_the_objects_of_its_manifests_folder(scenario: str, folder: str) -> None:
    added = identities(render(scenario)) - identities(render("defaults"))
    assert added == identities(manifests_in(folder))


def test_create_namespace_adds_the_namespace_of_manifests() -> None:
    added = identities(render("create-namespace")) - identities(render("defaults"))
    assert added == {("Namespace", NAMESPACE, None)}


@pytest.mark.parametrize("manifest", sorted(MANIFEST_OBJECTS, key=str), ids=lambda key: "/".join(filter(None, key)))
def test_object_is_the_one_in_manifests(manifest: Identity) -> None:
    """Field by field, labels and annotations too, once the Helm labels and the config checksum are taken out."""
    (chart,) = (body for body in render("manifests-all") if identity(body) == manifest)
    assert without_helm_additions(chart) == MANIFEST_OBJECTS[manifest]


SUBTREES = {
    "pod securityContext": ("spec", "template", "spec", "securityContext"),
    "container securityContext": ("spec", "template", "spec", "containers", 0, "securityContext"),
    "readinessProbe": ("spec", "template", "spec", "containers", 0, "readinessProbe"),
    "livenessProbe": ("spec", "template", "spec", "containers", 0, "livenessProbe"),
    "command": ("spec", "template", "spec", "containers", 0, "command"),
    "args": ("spec", "template", "spec", "containers", 0, "args"),
    "ports": ("spec", "template", "spec", "containers", 0, "ports"),
    "env": ("spec", "template", "spec", "containers", 0, "env"),
    "volumeMounts": ("spec", "template", "spec", "containers", 0, "volumeMounts"),
    "volumes": ("spec", "template", "spec", "volumes"),
    "selector": ("spec", "selector"),
    "pod labels": ("spec", "template", "metadata", "labels"),
    "replicas": ("spec", "replicas"),
}
"""What must never drift, named so that a failure says which (test_object_is_the_one_in_manifests checks the rest)."""


def subtree(body: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        body = body[step] if isinstance(step, int) else body.get(step)
    return body


DEPLOYMENT_FIELDS = [
    (deployment, field)
    for deployment in ("gpu-extender", "gpu-scheduler")
    for field, path in SUBTREES.items()
    if subtree(MANIFEST_OBJECTS[("Deployment", deployment, NAMESPACE)], path) is not None
]
"""(Deployment, field) where manifests/ sets the field (gpu-scheduler has a command and no args nor env)."""


@pytest.mark.parametrize(("deployment", "field"), DEPLOYMENT_FIELDS)
def test_deployment_field_is_the_one_in_manifests(deployment: str, field: str) -> None:
    chart = find(render("manifests-all"), "Deployment", deployment)
    manifest = MANIFEST_OBJECTS[("Deployment", deployment, NAMESPACE)]
    assert subtree(chart, SUBTREES[field]) == subtree(manifest, SUBTREES[field])


def granted(bodies: list[dict[str, Any]], service_account: str, namespace: str) -> set[Grant]:
    """What the rendered roles grant a ServiceAccount of the release (built-in roles left out)."""
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    grants: set[Grant] = set()
    for binding in (body for body in bodies if body["kind"] in {"ClusterRoleBinding", "RoleBinding"}):
        ref = binding["roleRef"]
        defined = [body for body in bodies if (body["kind"], body["metadata"]["name"]) == (ref["kind"], ref["name"])]
        if subject in binding["subjects"] and defined:
            grants |= grants_of_rules(defined[0]["rules"], binding["metadata"].get("namespace", CLUSTER))
    return grants


def test_rbac_rules_and_bindings_are_those_of_manifests() -> None:
    chart = render("manifests-all")
    for key, manifest in MANIFEST_OBJECTS.items():
        if key[0] in {"ClusterRole", "Role"}:
            assert find(chart, key[0], key[1])["rules"] == manifest["rules"], key
        if key[0] in {"ClusterRoleBinding", "RoleBinding"}:
            binding = find(chart, key[0], key[1])
            assert (binding["roleRef"], binding["subjects"]) == (manifest["roleRef"], manifest["subjects"]), key
    assert {identity(b) for b in chart if "rbac" in b["apiVersion"]} == {
        key for key, body in MANIFEST_OBJECTS.items() if "rbac" in body["apiVersion"]
    }
    assert granted(chart, "gpu-extender", NAMESPACE) == EXTENDER_GRANTS


def test_network_policy_is_that_of_manifests() -> None:
    policy = find(render("defaults"), "NetworkPolicy", "gpu-extender")
    assert policy["spec"] == MANIFEST_OBJECTS[("NetworkPolicy", "gpu-extender", NAMESPACE)]["spec"]


# ---- another namespace --------------------------------------------------------------------------------------


OTHER_NAMESPACE = "gpu-sharing"


def test_another_namespace_holds_every_namespaced_object() -> None:
    for body in render("everything", OTHER_NAMESPACE):
        kind, name, where = identity(body)
        if kind in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert where is None and (kind != "Namespace" or name == OTHER_NAMESPACE)
        elif (kind, name) == ("RoleBinding", "gpu-scheduler-authentication-reader"):
            assert where == "kube-system"  # the ConfigMap kube-scheduler reads is there
        elif name == "gpu-extender-unhealthy-gpus":
            assert where == "kube-system"  # gpushare's unhealthy-gpu-<node> ConfigMaps are there
        else:
            assert where == OTHER_NAMESPACE, identity(body)


def test_another_namespace_is_the_one_every_reference_names() -> None:
    bodies = render("everything", OTHER_NAMESPACE)
    assert f"gpu-extender.{NAMESPACE}" not in rendered_text("everything", OTHER_NAMESPACE)
    for binding in (body for body in bodies if "subjects" in body):
        assert {subject["namespace"] for subject in binding["subjects"]} == {OTHER_NAMESPACE}, identity(binding)
    moved = {(OTHER_NAMESPACE if where == NAMESPACE else where, *rest) for (where, *rest) in EXTENDER_GRANTS}
    assert granted(bodies, "gpu-extender", OTHER_NAMESPACE) == moved
    configuration = find(bodies, "ConfigMap", "gpu-scheduler-config")["data"]["kube-scheduler-config.yaml"]
    (extender,) = yaml.safe_load(configuration)["extenders"]
    assert extender["urlPrefix"] == f"https://gpu-extender.{OTHER_NAMESPACE}.svc:443"
    assert f"--leader-elect-resource-namespace={OTHER_NAMESPACE}" in container(bodies, "gpu-scheduler")["command"]
    serving = find(bodies, "Certificate", "gpu-extender-serving")["spec"]["dnsNames"]
    assert f"gpu-extender.{OTHER_NAMESPACE}.svc" in serving


# ---- the options -------------------------------------------------------------------------------------------


def test_the_pods_mount_the_secrets_you_bring() -> None:
    bodies = render("own-secrets")
    assert mounted_secrets(bodies, "gpu-extender") == {"my-serving", "my-scheduler-client"}
    assert mounted_secrets(bodies, "gpu-scheduler") == {"my-scheduler-client"}
    assert not [body for body in bodies if is_custom_resource(body)]


def test_cert_manager_issues_the_secrets_the_pods_mount() -> None:
    bodies = render("own-secrets-by-cert-manager")
    issued = {
        find(bodies, "Certificate", name)["spec"]["secretName"]
        for name in ("gpu-extender-serving", "gpu-extender-scheduler-client")
    }
    assert issued == {"my-serving", "my-scheduler-client"}
    assert mounted_secrets(bodies, "gpu-extender") | mounted_secrets(bodies, "gpu-scheduler") == issued


def test_the_network_policy_can_be_left_out() -> None:
    assert "NetworkPolicy" not in {body["kind"] for body in render("no-network-policy")}


def test_the_network_policy_opens_the_health_port_to_the_prometheus_you_name() -> None:
    policy = find(render("own-prometheus"), "NetworkPolicy", "gpu-extender")
    health = next(rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "health")
    assert health["from"] == OWN_PROMETHEUS["networkPolicy"]["healthPortFrom"], "replaced, not merged"


def test_the_pod_monitor_scrapes_metrics_on_the_health_port_of_every_replica() -> None:
    bodies = render("pod-monitor")
    monitor = find(bodies, "PodMonitor", "gpu-extender")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    pod_labels = find(bodies, "Deployment", "gpu-extender")["spec"]["template"]["metadata"]["labels"]
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= pod_labels.items() and LEADER_LABEL not in selected, "leader and standby alike"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "health", "path": "/metrics", "interval": "30s"}
    assert "health" in {port["name"] for port in container(bodies, "gpu-extender")["ports"]}
    assert "/metrics" in build_health_server(make_service(make_cluster())).router.paths


def test_the_service_monitor_scrapes_metrics_through_a_service_of_every_replica() -> None:
    bodies = render("service-monitor")
    monitor = find(bodies, "ServiceMonitor", "gpu-extender")
    metrics = find(bodies, "Service", "gpu-extender-metrics")
    pod_labels = find(bodies, "Deployment", "gpu-extender")["spec"]["template"]["metadata"]["labels"]
    assert metrics["spec"]["selector"].items() <= pod_labels.items() and LEADER_LABEL not in metrics["spec"]["selector"]
    assert metrics["spec"]["clusterIP"] == "None", "each replica a target of its own"
    (port,) = metrics["spec"]["ports"]
    assert (port["name"], port["targetPort"]) == ("health", "health")
    selected = monitor["spec"]["selector"]["matchLabels"].items()
    assert selected <= metrics["metadata"]["labels"].items()
    assert not selected <= find(bodies, "Service", "gpu-extender")["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "health", "path": "/metrics", "interval": "30s"}


def test_the_dashboard_is_a_config_map_grafanas_sidecar_loads() -> None:
    configmap = find(render("dashboard"), "ConfigMap", "gpu-extender-dashboard")
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1", "the grafana chart's sidecar label"
    assert configmap["data"] == {"gpu-extender.json": DASHBOARD_FILE.read_text()}, "the repository's dashboard"


def test_the_dashboard_can_go_to_grafanas_namespace_with_its_annotations() -> None:
    configmap = find(render("dashboard-in-grafanas-namespace"), "ConfigMap", "gpu-extender-dashboard")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "GPU"}


def test_one_replica_has_no_disruption_budget_to_block_drains() -> None:
    bodies = render("one-replica")
    assert "PodDisruptionBudget" not in {body["kind"] for body in bodies}
    assert {find(bodies, "Deployment", name)["spec"]["replicas"] for name in ("gpu-extender", "gpu-scheduler")} == {1}


def test_the_image_values_set_the_extenders_image() -> None:
    extender = container(render("own-image"), "gpu-extender")
    assert (extender["image"], extender["imagePullPolicy"]) == ("registry.example.com/gpu-extender:0.2.0", "Always")


def test_a_changed_scheduler_configuration_rolls_gpu_scheduler() -> None:
    def checksum(bodies: list[dict[str, Any]]) -> str:
        return str(
            find(bodies, "Deployment", "gpu-scheduler")["spec"]["template"]["metadata"]["annotations"][CONFIG_CHECKSUM]
        )

    own = render("own-scheduler-config")
    data = find(own, "ConfigMap", "gpu-scheduler-config")["data"]
    assert data == {"kube-scheduler-config.yaml": OWN_SCHEDULER_CONFIG["secondScheduler"]["config"]}
    assert checksum(own) != checksum(render("second-scheduler"))


# ---- protocol hami: the objects of manifests/hami/ -----------------------------------------------------------


@functools.cache
def kustomized(folder: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize manifests/<folder>` builds, generated ConfigMaps before their hash."""
    built = subprocess.run(
        [kubectl(), "kustomize", str(MANIFESTS / folder)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    unhashed = re.sub(r"\b(gpu-scheduler-config)-[a-z0-9]{10}\b", r"\1", built)
    return tuple(body for body in yaml.safe_load_all(unhashed) if body)


HAMI_FOLDERS = ("hami", "hami/second-scheduler", "cert-manager")


@functools.cache
def hami_manifest_objects() -> dict[Identity, dict[str, Any]]:
    return {identity(body): body for folder in HAMI_FOLDERS for body in kustomized(folder)}


DELETED_BY_HAMI = {
    ("Role", "gpu-extender-unhealthy-gpus", "kube-system"),
    ("RoleBinding", "gpu-extender-unhealthy-gpus", "kube-system"),
}
"""What manifests/hami/ deletes from manifests/: the read of kube-system's ConfigMaps, gpushare's alone."""
HAMI_MANIFESTS = sorted(set(MANIFEST_OBJECTS) - DELETED_BY_HAMI, key=str)
"""The objects of manifests/hami/, hami/second-scheduler/ and cert-manager/, as named (their patches change some)."""
HAMI_GRANTS = {grant for grant in EXTENDER_GRANTS if grant[0] != "kube-system"} | {
    (CLUSTER, "", "nodes", "patch", ANY_NAME)  # HAMi's node lock, hami.io/mutex.lock
}


def test_kustomize_builds_from_the_hami_folders_the_objects_of_manifests_less_what_hami_deletes() -> None:
    assert set(hami_manifest_objects()) == set(HAMI_MANIFESTS)


def test_hami_renders_the_objects_of_manifests_hami_but_the_namespace() -> None:
    expected = identities(list(kustomized("hami"))) - {("Namespace", NAMESPACE, None)}
    assert identities(render("hami")) == expected


def test_with_hami_the_second_scheduler_adds_the_objects_of_hami_second_scheduler() -> None:
    added = identities(render("hami-second-scheduler")) - identities(render("hami"))
    assert added == identities(list(kustomized("hami/second-scheduler")))


@pytest.mark.parametrize("manifest", HAMI_MANIFESTS, ids=lambda key: "/".join(filter(None, key)))
def test_hami_object_is_the_one_kustomize_builds(manifest: Identity) -> None:
    """Field by field, as test_object_is_the_one_in_manifests: the extender's --protocol=hami, the ClusterRole's
    nodes patch, the second scheduler's configuration for hami-scheduler."""
    (chart,) = (body for body in render("hami-all") if identity(body) == manifest)
    assert without_helm_additions(chart) == hami_manifest_objects()[manifest]


def test_hami_grants_the_node_lock_and_no_read_of_kube_system() -> None:
    assert granted(render("hami-all"), "gpu-extender", NAMESPACE) == HAMI_GRANTS


# ---- protocol hami: HAMi's settings as the extender's flags -------------------------------------------------


def extender_settings(bodies: list[dict[str, Any]]) -> Settings:
    """The settings the rendered extender runs with: its arguments through the real `extender` parser, and its
    variables, the downward API resolved for a pod in the namespace."""
    extender = container(bodies, "gpu-extender")
    arguments = cli.parser().parse_args(extender["args"])
    assert arguments.command == "serve"
    resolved = {"metadata.namespace": NAMESPACE, "metadata.name": "gpu-extender-7d9f8b6c5-x2x4q"}
    env = {
        variable["name"]: variable["value"]
        if "value" in variable
        else resolved[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        for variable in extender.get("env", [])
    }
    flags = {field.name: getattr(arguments, field.name) for field in settings_module.fields()}
    return settings_module.load(flags, env=env, config=arguments.config)


HAMI_VALUES = {
    "defaultMemory": "hami_default_memory",
    "defaultCores": "hami_default_cores",
    "memoryFactor": "hami_memory_factor",
    "nodeLockTimeout": "node_lock_timeout",
    "topologyAll": "hami_topology_all",
}
"""The chart's hami values and the settings they set (the default policies: test_hamis_default_policies_...)."""


def chart_values() -> Values:
    loaded: Values = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_the_hami_defaults_are_the_extenders_so_they_add_no_flag() -> None:
    hami = chart_values()["hami"]
    settings = extender_settings(render("hami"))
    assert settings.protocol is Protocol.HAMI
    for value, field in HAMI_VALUES.items():
        assert hami[value] == getattr(settings, field) == getattr(Settings(), field), value
    assert hami["defaultSchedulerPolicy"] == {"nodeSchedulerPolicy": "", "gpuSchedulerPolicy": ""}
    assert settings.placement is Settings().placement is Policy.FRAGMENTATION


def test_the_hami_values_land_as_the_extenders_flags() -> None:
    extender = container(render("hami-settings"), "gpu-extender")
    settings = extender_settings(render("hami-settings"))
    for value, field in HAMI_VALUES.items():
        assert getattr(settings, field) == HAMI_SETTINGS["hami"][value], value
    flags = {argument.split("=")[0] for argument in extender["args"]}
    assert {"--hami-default-memory", "--hami-default-cores", "--hami-memory-factor"} <= flags
    assert {
        "--node-lock-timeout",
        "--hami-topology-all",
        "--placement",
        "--node-strategy",
        "--device-strategy",
    } <= flags


@pytest.mark.parametrize(
    ("scenario", "node", "gpu"),
    [
        ("hami-settings", Strategy.BINPACK, Strategy.BINPACK),  # GPU binpack asked; node at HAMi's binpack
        ("hami-node-spread", Strategy.SPREAD, Strategy.SPREAD),  # node spread asked; GPU at HAMi's spread
    ],
)
def test_hamis_default_policies_place_by_fill_the_one_left_empty_at_hamis_default(
    scenario: str, node: Strategy, gpu: Strategy
) -> None:
    settings = extender_settings(render(scenario))
    assert (settings.placement, settings.node_strategy, settings.device_strategy) == (Policy.FILL, node, gpu)


# ---- the second scheduler's configuration ---------------------------------------------------------------------


def scheduler_name(values: Values) -> str:
    """The name the second scheduler answers to: the value, else HAMi's webhook's name, else gpu-scheduler."""
    given = str(values["secondScheduler"].get("schedulerName", ""))
    return given or ("hami-scheduler" if values.get("protocol") == "hami" else "gpu-scheduler")


def uncommented(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


BUILT_IN_CONFIGURATION = [
    scenario
    for scenario, values in SCENARIOS.items()
    if values.get("secondScheduler", {}).get("enabled") and not values["secondScheduler"].get("config")
]


@pytest.mark.parametrize("scenario", BUILT_IN_CONFIGURATION)
def test_the_second_schedulers_configuration_is_what_scheduler_config_renders_for_the_extender(scenario: str) -> None:
    """Line for line but the leading comments (the manifests' tests compare those too, for the defaults): the
    extender's own settings, flags and variables as rendered, under the second scheduler's name."""
    bodies = render(scenario)
    text = find(bodies, "ConfigMap", "gpu-scheduler-config")["data"]["kube-scheduler-config.yaml"]
    settings = dataclasses.replace(extender_settings(bodies), scheduler_name=scheduler_name(SCENARIOS[scenario]))
    assert uncommented(text) == uncommented(scheduler_config(settings, "1.34"))


@pytest.mark.parametrize(
    ("scenario", "name"),
    [
        ("second-scheduler", "gpu-scheduler"),
        ("hami-second-scheduler", "hami-scheduler"),
        ("own-scheduler-name", "gpu-share"),
        ("hami-own-scheduler-name", "gpu-share"),
    ],
)
def test_the_second_scheduler_answers_to(scenario: str, name: str) -> None:
    configuration = find(render(scenario), "ConfigMap", "gpu-scheduler-config")["data"]["kube-scheduler-config.yaml"]
    (profile,) = yaml.safe_load(configuration)["profiles"]
    assert profile["schedulerName"] == name


# ---- docs/protocols/hami.md's install with Helm ---------------------------------------------------------------


HAMI_PAGE = ROOT / "docs" / "protocols" / "hami.md"
HELM_PAGE = ROOT / "docs" / "install" / "helm.md"


def sh_blocks(text: str) -> list[str]:
    """The ```sh blocks of Markdown text, each dedented to its fence, with backslash continuations joined."""
    blocks = re.findall(r"^( *)```sh\n(.*?)^\1```", text, re.MULTILINE | re.DOTALL)
    dedented = ["".join(line[len(indent) :] for line in body.splitlines(keepends=True)) for indent, body in blocks]
    return [block.replace("\\\n", " ") for block in dedented]


def hami_helm_install() -> list[str]:
    """The commands of the first sh block after "With Helm" in hami.md's "Install in place of hami-scheduler"."""
    text = HAMI_PAGE.read_text()
    section = text[text.index("## Install in place of hami-scheduler\n") :]
    section = section[: section.index("\n## ", 1)]
    block = sh_blocks(section[section.index("With Helm") :])[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_hamis_page_installs_with_helm_what_its_kustomize_steps_apply() -> None:
    """Steps 1 and 3 as one Helm release: the objects of manifests/hami/, hami/second-scheduler/ and cert-manager/
    (the namespace made by --create-namespace and labelled as helm.md does), the images aside."""
    install, label = hami_helm_install()
    words = shlex.split(install)
    assert words[:4] == ["helm", "install", RELEASE, "charts/gpu-extender"]
    result = run_helm("template", RELEASE, str(CHART), *words[4:])
    assert result.returncode == 0, result.stderr
    rendered = [body for body in yaml.safe_load_all(result.stdout) if body]
    expected = {key: body for key, body in hami_manifest_objects().items() if key != ("Namespace", NAMESPACE, None)}
    assert identities(rendered) == set(expected)
    for body in rendered:
        assert without_images(without_helm_additions(body)) == without_images(expected[identity(body)]), identity(body)
    assert label in sh_blocks(HELM_PAGE.read_text())[0].splitlines(), "labelled as helm.md labels it"


def without_images(body: dict[str, Any]) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(body))
    for each in copy.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        each.pop("image")
    return copy
