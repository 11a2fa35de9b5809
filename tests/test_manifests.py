"""manifests/: every object valid for the Kubernetes versions we support (offline: kubernetes-validate bundles
the schemas), the extender's RBAC exactly what it needs, the scheduler configurations exactly what
`extender scheduler-config` renders and what the contract asks, and the pods locked down.

The checks read the files as data, rebuilding the few things kustomize adds (the generated ConfigMap of the second
scheduler, the namespace) from the kustomization files; `kubectl kustomize`, the pinned kubectl of
tests/e2e/build.sh (tests/gotools.py: built where Go is installed, skipped only without Go), then builds each
folder and must give exactly those objects.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import posixpath
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate_utils

from extender import cli
from extender import settings as settings_module
from extender.service.pages import build_health_server
from extender.settings import Settings
from extender.sources.kube.writes import LEADER_LABEL
from extender.tools.schedconfig import Wiring, go_duration, render
from tests.builders import make_cluster
from tests.conftest import make_service
from tests.gotools import kubectl

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"
NAMESPACE = "gpu-extender"

VALIDATED_VERSIONS = tuple(f"1.{minor}" for minor in range(25, 38))
"""The docs support Kubernetes 1.19 and later (`extender scheduler-config`); kubernetes-validate 1.37, the
newest, bundles the schemas of 1.25 to 1.37 and no older ones, so these are the supported versions that can
be checked offline. What differs below 1.25 is in manifests/README.md ("Kubernetes versions")."""

SCHEDULER_CONFIGS = {
    "second-scheduler/kube-scheduler-config.yaml": ("1.34", "gpu-scheduler", Wiring.FULL, "gpushare"),
    "hami/second-scheduler/kube-scheduler-config.yaml": ("1.34", "hami-scheduler", Wiring.FULL, "hami"),
    "default-scheduler/kube-scheduler-config.yaml": ("1.34", "default-scheduler", Wiring.FULL, "gpushare"),
    "default-scheduler/kube-scheduler-config-v1beta3.yaml": ("1.24", "default-scheduler", Wiring.FULL, "gpushare"),
    "default-scheduler/kube-scheduler-config-filter-bind.yaml": (
        "1.34",
        "default-scheduler",
        Wiring.FILTER_BIND,
        "gpushare",
    ),
    "legacy-policy/scheduler-policy.json": ("1.22", "default-scheduler", Wiring.FULL, "gpushare"),
}
"""Checked-in outputs of `extender scheduler-config` (path under manifests/ -> version, profile, wiring,
protocol): files for kube-scheduler, not API objects."""

EVERY_MINOR = range(19, 35)
"""Every Kubernetes minor `extender scheduler-config` renders for, up to the kube-scheduler the manifests run."""

Grant = tuple[str, str, str, str, str]
"""(namespace, or "*" cluster-wide; API group; resource; verb; resource name, or "*" any)."""

CLUSTER = "*"
ANY_NAME = "*"

EXTENDER_GRANTS: set[Grant] = {
    *((CLUSTER, "", "nodes", verb, ANY_NAME) for verb in ("get", "list", "watch")),
    # No patch: the annotations travel inside the Binding (extender/sources/kube/binder.py).
    *((CLUSTER, "", "pods", verb, ANY_NAME) for verb in ("get", "list", "watch")),
    (CLUSTER, "", "pods/binding", "create", ANY_NAME),
    # core/v1 Events only: binder.EventRecorder posts to /api/v1/namespaces/{ns}/events.
    (CLUSTER, "", "events", "create", ANY_NAME),
    # ResourceQuotas' GPU keys (sources/kube/source.py `quotas`; core/quota/).
    *((CLUSTER, "", "resourcequotas", verb, ANY_NAME) for verb in ("get", "list", "watch")),
    # The PodGroups of coscheduling and Volcano (sources/kube/podgroups.py): listed and watched, never read alone.
    *(
        (CLUSTER, group, "podgroups", verb, ANY_NAME)
        for group in ("scheduling.x-k8s.io", "scheduling.volcano.sh")
        for verb in ("list", "watch")
    ),
    (NAMESPACE, "coordination.k8s.io", "leases", "create", ANY_NAME),
    (NAMESPACE, "coordination.k8s.io", "leases", "get", Settings().lease_name),
    (NAMESPACE, "coordination.k8s.io", "leases", "update", Settings().lease_name),
    # The leader labels its own pod gpu-extender.io/leader=true, which the Service selects (controller.LeaderLabel).
    (NAMESPACE, "", "pods", "patch", ANY_NAME),
    # gpushare's unhealthy-gpu-<node> lists (sources/kube/source.py `unhealthy`); RBAC cannot narrow list to names.
    *(("kube-system", "", "configmaps", verb, ANY_NAME) for verb in ("get", "list", "watch")),
}
"""Everything the extender's ServiceAccount may do, and all it needs (docs/how-it-works/api-server.md)."""


# ---- loading -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Document:
    path: str
    """Under manifests/."""
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        return self.body["metadata"].get("namespace")

    def __str__(self) -> str:
        return f"{self.path}: {self.kind} {self.name}"


def _yaml_files() -> list[Path]:
    return sorted(path for path in MANIFESTS.rglob("*.yaml") if path.name != "kustomization.yaml")


@functools.cache
def documents() -> tuple[Document, ...]:
    """Every API object under manifests/, as checked in, plus the ConfigMaps the kustomizations generate."""
    found: list[Document] = []
    for path in _yaml_files():
        relative = path.relative_to(MANIFESTS).as_posix()
        if relative in SCHEDULER_CONFIGS:
            continue
        found += [Document(relative, body) for body in yaml.safe_load_all(path.read_text()) if body]
    return (*found, *generated_config_maps())


def kustomizations() -> dict[Path, dict[str, Any]]:
    return {path.parent: yaml.safe_load(path.read_text()) for path in sorted(MANIFESTS.rglob("kustomization.yaml"))}


def generated_config_maps() -> list[Document]:
    """The ConfigMaps of the kustomizations' configMapGenerator, as kustomize builds them (before the hash)."""
    generated = []
    for folder, kustomization in kustomizations().items():
        for generator in kustomization.get("configMapGenerator", []):
            data = {}
            for entry in generator["files"]:
                key, _, file = entry.rpartition("=") if "=" in entry else (posixpath.basename(entry), "", entry)
                data[key] = (folder / file).read_text()
            metadata = {"name": generator["name"], "labels": generator.get("options", {}).get("labels", {})}
            if "namespace" in generator:
                metadata["namespace"] = generator["namespace"]
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
            generated.append(Document(f"{folder.relative_to(MANIFESTS).as_posix()}/kustomization.yaml", body))
    return generated


def find(kind: str, name: str, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    matches = [doc.body for doc in documents() if doc.kind == kind and doc.name == name and doc.namespace == namespace]
    assert len(matches) == 1, f"expected one {kind} {namespace}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(deployment: str) -> dict[str, Any]:
    spec: dict[str, Any] = find("Deployment", deployment)["spec"]["template"]["spec"]
    return spec


def container(deployment: str) -> dict[str, Any]:
    (only,) = pod_spec(deployment)["containers"]
    assert isinstance(only, dict)
    return only


def is_cert_manager(doc: Document) -> bool:
    return str(doc.body["apiVersion"]).startswith("cert-manager.io/")


def mounted_secret_file(deployment: str, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path` in the deployment's container, from its volumes."""
    mounts = {mount["mountPath"]: mount for mount in container(deployment).get("volumeMounts", [])}
    folder, file = posixpath.split(path)
    mount = mounts.get(folder)
    assert mount is not None, f"{path}: nothing is mounted at {folder}"
    assert mount.get("readOnly") is True, f"{folder} must be mounted read-only"
    (volume,) = (volume for volume in pod_spec(deployment)["volumes"] if volume["name"] == mount["name"])
    secret = volume.get("secret")
    assert secret is not None, f"{path}: volume {volume['name']} is not a Secret"
    items = {item["path"]: item["key"] for item in secret.get("items", [])}
    assert not secret.get("items") or file in items, f"{path}: the Secret volume does not project {file}"
    return secret["secretName"], items.get(file, file)


# ---- every object is valid -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VALIDATED_VERSIONS)
def test_kubernetes_validate_has_the_strict_schemas_of(version: str) -> None:
    # validate() silently falls back to the newest older schema it has: make sure it has this one
    assert f"{version}.0" in kubernetes_validate_utils.all_versions()


@pytest.mark.parametrize("version", VALIDATED_VERSIONS)
def test_every_object_is_valid_for(version: str) -> None:
    failures = []
    for doc in documents():
        if is_cert_manager(doc):
            continue  # not in kubernetes-validate: test_cert_manager_objects_match_their_schema
        if doc.kind == "PrometheusRule":
            continue  # the Prometheus Operator's, not in kubernetes-validate: tests/test_alert_rules.py (promtool)
        try:
            kubernetes_validate.validate(doc.body, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{doc}: {'.'.join(map(str, error.path))}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            failures.append(f"{doc}: {error.message}")
    assert not failures, "\n".join(failures)


def test_every_kind_the_checks_rely_on_is_found() -> None:
    kinds = {doc.kind for doc in documents()}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ClusterRole", "Role", "ConfigMap", "Pod"} <= kinds
    assert {"Issuer", "Certificate"} <= kinds


_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {"name": _NAME, "namespace": _NAME, "labels": {"type": "object"}},
}
_ISSUER_REF = {
    "type": "object",
    "required": ["name", "kind"],
    "additionalProperties": False,
    "properties": {"name": _NAME, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": {"const": "cert-manager.io"}},
}
_USAGES = ["digital signature", "key encipherment", "server auth", "client auth", "cert sign", "crl sign"]
CERT_MANAGER_SCHEMAS: dict[str, dict[str, Any]] = {
    "Issuer": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Issuer"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": False,
                "properties": {
                    "selfSigned": {"type": "object", "additionalProperties": False},
                    "ca": {
                        "type": "object",
                        "required": ["secretName"],
                        "additionalProperties": False,
                        "properties": {"secretName": _NAME},
                    },
                },
            },
        },
    },
    "Certificate": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Certificate"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["secretName", "issuerRef"],
                "anyOf": [{"required": ["commonName"]}, {"required": ["dnsNames"]}],
                "additionalProperties": False,
                "properties": {
                    "secretName": _NAME,
                    "issuerRef": _ISSUER_REF,
                    "isCA": {"type": "boolean"},
                    "commonName": {"type": "string", "minLength": 1, "maxLength": 64},
                    "dnsNames": {"type": "array", "minItems": 1, "items": _NAME},
                    "ipAddresses": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "ipv4"}},
                    "usages": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": _USAGES}},
                    "duration": {"type": "string", "pattern": r"^[0-9]+h$"},
                    "renewBefore": {"type": "string", "pattern": r"^[0-9]+h$"},
                    "privateKey": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        },
                    },
                },
            },
        },
    },
}
"""The part of cert-manager's v1 CRDs the manifests use (its CRDs are not in kubernetes-validate)."""


def test_cert_manager_objects_match_their_schema() -> None:
    formats = jsonschema.Draft202012Validator.FORMAT_CHECKER
    failures = []
    for doc in (doc for doc in documents() if is_cert_manager(doc)):
        if doc.kind not in CERT_MANAGER_SCHEMAS:
            failures.append(f"{doc}: no schema for {doc.kind}")
            continue
        validator = jsonschema.Draft202012Validator(CERT_MANAGER_SCHEMAS[doc.kind], format_checker=formats)
        failures += [f"{doc}: {error.message}" for error in validator.iter_errors(doc.body)]
    assert not failures, "\n".join(failures)


def test_kustomizations_name_every_manifest_of_their_folder() -> None:
    for folder, kustomization in kustomizations().items():
        # Files of the folder; the other kustomizations it builds on (base, ../base) are checked on their own.
        listed = {resource for resource in kustomization.get("resources", []) if resource.endswith(".yaml")}
        for generator in kustomization.get("configMapGenerator", []):
            listed |= {entry.rpartition("=")[2] for entry in generator["files"]}
        present = {path.name for path in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present, f"{folder.relative_to(MANIFESTS)}/kustomization.yaml"


@pytest.mark.parametrize("folder", ["alerts", "base", "cert-manager", "second-scheduler"])  # hami/: patches, below
def test_kustomize_builds_the_objects_checked_here(folder: str) -> None:
    built = subprocess.run(
        [kubectl(), "kustomize", str(MANIFESTS / folder)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    unhashed = re.sub(r"\b(gpu-scheduler-config)-[a-z0-9]{10}\b", r"\1", built)
    in_folder = [doc.body for doc in documents() if posixpath.dirname(doc.path) == folder]
    assert sorted(json.dumps(body, sort_keys=True) for body in yaml.safe_load_all(unhashed)) == sorted(
        json.dumps(body, sort_keys=True) for body in in_folder
    )


def test_every_object_lives_in_the_extenders_namespace() -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for doc in documents():
        if doc.kind in cluster_scoped or doc.path.startswith("examples/"):
            assert doc.namespace is None, doc
        elif (doc.kind, doc.name) == ("RoleBinding", "gpu-scheduler-authentication-reader"):
            assert doc.namespace == "kube-system", doc  # the configmap kube-scheduler reads is there
        elif doc.name == "gpu-extender-unhealthy-gpus":
            assert doc.namespace == "kube-system", doc  # gpushare's unhealthy-gpu-<node> ConfigMaps are there
        else:
            assert doc.namespace == NAMESPACE, doc


def test_kustomize_does_not_move_the_kube_system_binding() -> None:
    # `namespace:` in a kustomization overrides every object's namespace, the kube-system RoleBinding's too
    layout = {folder.relative_to(MANIFESTS).as_posix(): k.get("namespace") for folder, k in kustomizations().items()}
    assert layout == {
        ".": None,
        "alerts": None,
        "base": None,
        "cert-manager": NAMESPACE,
        "second-scheduler": None,
        "hami": None,
        "hami/second-scheduler": None,
    }


# ---- RBAC ------------------------------------------------------------------------------------------------


def grants_of_rules(rules: list[dict[str, Any]], namespace: str) -> set[Grant]:
    return {
        (namespace, group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [ANY_NAME]
    }


def granted_to(service_account: str) -> tuple[set[Grant], set[tuple[str, str, str]]]:
    """What the manifests grant a ServiceAccount of gpu-extender: the rules of the roles defined here, and the
    built-in roles referenced (kind, name, namespace or "*")."""
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE}
    grants: set[Grant] = set()
    built_in: set[tuple[str, str, str]] = set()
    for binding in (doc for doc in documents() if doc.kind in {"ClusterRoleBinding", "RoleBinding"}):
        if subject not in binding.body["subjects"]:
            continue
        scope = binding.namespace or CLUSTER
        ref = binding.body["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        role_namespace = None if ref["kind"] == "ClusterRole" else binding.namespace
        role = (ref["kind"], ref["name"], role_namespace)
        defined = [doc for doc in documents() if (doc.kind, doc.name, doc.namespace) == role]
        if defined:
            grants |= grants_of_rules(defined[0].body["rules"], scope)
        else:
            built_in.add((ref["kind"], ref["name"], scope))
    return grants, built_in


def test_the_extender_is_granted_exactly_what_it_needs() -> None:
    grants, built_in = granted_to("gpu-extender")
    assert not built_in
    assert grants == EXTENDER_GRANTS, (
        f"missing: {EXTENDER_GRANTS - grants}; beyond the list: {grants - EXTENDER_GRANTS}"
    )


def test_no_role_has_a_wildcard_or_more_than_rules() -> None:
    for doc in (doc for doc in documents() if doc.kind in {"ClusterRole", "Role"}):
        assert set(doc.body) == {"apiVersion", "kind", "metadata", "rules"}, doc  # no aggregationRule
        for rule in doc.body["rules"]:
            assert "nonResourceURLs" not in rule, doc
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in value for value in rule.get(field, [])), f"{doc}: {field} {rule[field]}"


def test_the_second_scheduler_is_granted_what_kube_scheduler_needs() -> None:
    grants, built_in = granted_to("gpu-scheduler")
    assert built_in == {
        ("ClusterRole", "system:kube-scheduler", CLUSTER),
        ("ClusterRole", "system:volume-scheduler", CLUSTER),
        ("Role", "extension-apiserver-authentication-reader", "kube-system"),
    }
    # system:kube-scheduler allows get/update of the Lease kube-scheduler only: gpu-scheduler has its own
    lease = flag_values(container("gpu-scheduler")["command"])
    assert (lease["--leader-elect-resource-namespace"], lease["--leader-elect-resource-name"]) == (
        NAMESPACE,
        "gpu-scheduler",
    )
    assert grants == {
        (NAMESPACE, "coordination.k8s.io", "leases", "create", ANY_NAME),
        (NAMESPACE, "coordination.k8s.io", "leases", "get", "gpu-scheduler"),
        (NAMESPACE, "coordination.k8s.io", "leases", "update", "gpu-scheduler"),
    }


# ---- the scheduler configurations ------------------------------------------------------------------------


def flag_values(arguments: list[str]) -> dict[str, str]:
    """--name=value arguments (the only form the manifests use) as a mapping."""
    values = {}
    for argument in arguments:
        if argument.startswith("--"):
            name, separator, value = argument.partition("=")
            assert separator, f"{argument}: write flags as --name=value"
            values[name] = value
    return values


def environment(deployment: str) -> dict[str, str]:
    """The container's variables, the downward API resolved for a pod of the deployment."""
    resolved = {"metadata.namespace": NAMESPACE, "metadata.name": f"{deployment}-7d9f8b6c5-x2x4q"}
    values = {}
    for variable in container(deployment).get("env", []):
        if "value" in variable:
            values[variable["name"]] = variable["value"]
        else:
            values[variable["name"]] = resolved[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    return values


@functools.cache
def extender_settings(protocol: str = "gpushare") -> Settings:
    """The settings the extender Deployment runs with: its arguments through the real `extender` parser, and its
    variables; for `hami`, with the argument manifests/hami/ appends (`--protocol=hami`)."""
    extender = container("gpu-extender")
    assert extender["command"] == ["extender"]
    extra = [] if protocol == "gpushare" else [f"--protocol={protocol}"]
    arguments = cli.parser().parse_args([*extender["args"], *extra])
    assert arguments.command == "serve"
    flags = {field.name: getattr(arguments, field.name) for field in settings_module.fields()}
    return settings_module.load(flags, env=environment("gpu-extender"), config=arguments.config)


def parse(text: str, minor: int) -> dict[str, Any]:
    loaded = json.loads(text) if minor < 23 else yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_rendered_configuration_meets_the_contract(minor: int) -> None:
    settings = extender_settings()
    entry, aside = parse(render(settings, f"1.{minor}"), minor)["extenders"]  # aside: pods asking no GPU (issue 25)
    assert (aside["filterVerb"], aside["managedResources"], aside["ignorable"]) == ("filter-cpu", [], True)
    assert (entry["filterVerb"], entry["prioritizeVerb"], entry["bindVerb"], entry["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert {"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False} in entry["managedResources"]
    assert entry["nodeCacheCapable"] is True
    assert entry["weight"] > 0
    timeout = settings.http_timeout
    assert entry["httpTimeout"] == (round(timeout * 1e9) if minor < 23 else go_duration(timeout))
    assert entry["enableHttps" if minor < 23 else "enableHTTPS"] is True
    assert entry["tlsConfig"] == {
        "caFile": settings.scheduler_ca_file,
        "certFile": settings.scheduler_cert_file,
        "keyFile": settings.scheduler_key_file,
    }
    assert "insecure" not in json.dumps(entry).lower()


def test_the_configured_url_reaches_the_extender_through_its_service() -> None:
    settings = extender_settings()
    url = urlsplit(settings.url)
    service = find("Service", "gpu-extender")
    (port,) = service["spec"]["ports"]
    assert (url.scheme, url.hostname, url.port) == ("https", f"gpu-extender.{NAMESPACE}.svc", port["port"])
    selector = dict(service["spec"]["selector"])
    # The leader's own label, set by the extender on its pod (not in the template): kube-scheduler reaches the
    # leader alone.
    assert selector.pop(LEADER_LABEL) == "true"
    assert selector.items() <= find("Deployment", "gpu-extender")["spec"]["template"]["metadata"]["labels"].items()
    assert {"name": "EXTENDER_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container(
        "gpu-extender"
    )["env"]
    (container_port,) = (p for p in container("gpu-extender")["ports"] if p["name"] == port["targetPort"])
    assert container_port["containerPort"] == settings.port
    serving = find("Certificate", "gpu-extender-serving")["spec"]["dnsNames"]
    assert url.hostname in serving
    assert set(serving) == {
        "gpu-extender",
        f"gpu-extender.{NAMESPACE}",
        f"gpu-extender.{NAMESPACE}.svc",
        f"gpu-extender.{NAMESPACE}.svc.cluster.local",
    }
    # and the loopback address, for `extender inspect` through `kubectl port-forward`
    assert find("Certificate", "gpu-extender-serving")["spec"]["ipAddresses"] == ["127.0.0.1"]


@pytest.mark.parametrize("path", sorted(SCHEDULER_CONFIGS))
def test_checked_in_configuration_is_what_the_command_renders(path: str) -> None:
    version, scheduler_name, wiring, protocol = SCHEDULER_CONFIGS[path]
    regenerate = "see manifests/README.md to regenerate it"
    settings = dataclasses.replace(extender_settings(protocol), scheduler_name=scheduler_name)
    assert (MANIFESTS / path).read_text() == render(settings, version, wiring), regenerate


def test_the_filter_bind_configuration_leaves_node_scoring_to_node_resources_fit_on_gpu_memory() -> None:
    document = yaml.safe_load((MANIFESTS / "default-scheduler/kube-scheduler-config-filter-bind.yaml").read_text())
    entry, _ = document["extenders"]
    assert (entry["filterVerb"], entry["bindVerb"], entry["preemptVerb"]) == ("filter", "bind", "preempt")
    assert "prioritizeVerb" not in entry
    (profile,) = document["profiles"]
    assert profile["plugins"]["score"]["enabled"] == [
        {"name": "NodeResourcesFit", "weight": extender_settings().weight}
    ]
    (fit,) = profile["pluginConfig"]
    assert fit["args"]["scoringStrategy"] == {
        "type": "MostAllocated",
        "resources": [{"name": "aliyun.com/gpu-mem", "weight": 1}],
    }


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("EXTENDER_")]:
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_the_command_line_renders_the_default_scheduler_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["scheduler-config", "--k8s-version", "1.34"]) == 0
    assert capsys.readouterr().out == (MANIFESTS / "default-scheduler/kube-scheduler-config.yaml").read_text()


def test_the_second_scheduler_reads_the_rendered_configuration() -> None:
    (generated,) = (
        doc.body
        for doc in generated_config_maps()
        if doc.name == "gpu-scheduler-config" and doc.path.startswith("second-scheduler/")
    )
    (file_name,) = generated["data"]
    (volume,) = (volume for volume in pod_spec("gpu-scheduler")["volumes"] if "configMap" in volume)
    assert volume["configMap"]["name"] == generated["metadata"]["name"]
    (mount,) = (mount for mount in container("gpu-scheduler")["volumeMounts"] if mount["name"] == volume["name"])
    assert flag_values(container("gpu-scheduler")["command"])["--config"] == f"{mount['mountPath']}/{file_name}"
    profiles = yaml.safe_load(generated["data"][file_name])["profiles"]
    assert profiles == [{"schedulerName": "gpu-scheduler"}]


def test_the_second_scheduler_mounts_the_files_its_configuration_names() -> None:
    settings = extender_settings()
    assert mounted_secret_file("gpu-scheduler", settings.scheduler_ca_file) == (
        "gpu-extender-scheduler-client",
        "ca.crt",
    )
    assert mounted_secret_file("gpu-scheduler", settings.scheduler_cert_file) == (
        "gpu-extender-scheduler-client",
        "tls.crt",
    )
    assert mounted_secret_file("gpu-scheduler", settings.scheduler_key_file) == (
        "gpu-extender-scheduler-client",
        "tls.key",
    )


def test_example_pods_ask_for_gpu_memory_of_the_right_scheduler() -> None:
    examples = {doc.path: doc.body for doc in documents() if doc.path.startswith("examples/")}
    assert set(examples) == {
        "examples/gpu-pod.yaml",
        "examples/gpu-pod-second-scheduler.yaml",
        "examples/hami-gpu-pod.yaml",
    }
    for path, pod in examples.items():
        (cuda,) = pod["spec"]["containers"]
        # HAMi's pods ask nvidia.com/gpu (kubelet calls its device plugin for that resource) and its memory.
        asked = ("nvidia.com/gpu", "nvidia.com/gpumem") if "hami" in path else (extender_settings().memory_resource,)
        assert set(asked) <= set(cuda["resources"]["limits"]), path
    assert examples["examples/hami-gpu-pod.yaml"]["spec"]["schedulerName"] == "hami-scheduler"
    assert "schedulerName" not in examples["examples/gpu-pod.yaml"]["spec"]
    assert examples["examples/gpu-pod-second-scheduler.yaml"]["spec"]["schedulerName"] == "gpu-scheduler"


# ---- certificates -----------------------------------------------------------------------------------------


def test_one_private_ca_signs_both_certificates() -> None:
    assert find("Issuer", "gpu-extender-selfsigned")["spec"] == {"selfSigned": {}}
    ca = find("Certificate", "gpu-extender-ca")["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "gpu-extender-selfsigned"
    assert find("Issuer", "gpu-extender-ca")["spec"] == {"ca": {"secretName": ca["secretName"]}}
    for name in ("gpu-extender-serving", "gpu-extender-scheduler-client"):
        assert find("Certificate", name)["spec"]["issuerRef"] == {
            "group": "cert-manager.io",
            "kind": "Issuer",
            "name": "gpu-extender-ca",
        }


def test_serving_certificate_is_for_servers_and_client_certificate_for_kube_scheduler() -> None:
    serving = find("Certificate", "gpu-extender-serving")["spec"]
    client = find("Certificate", "gpu-extender-scheduler-client")["spec"]
    assert "server auth" in serving["usages"] and "client auth" not in serving["usages"]
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]
    assert client["commonName"] == "kube-scheduler"
    assert not serving.get("isCA") and not client.get("isCA")


def test_the_extender_mounts_the_certificates_secrets() -> None:
    settings = extender_settings()
    serving = find("Certificate", "gpu-extender-serving")["spec"]["secretName"]
    client = find("Certificate", "gpu-extender-scheduler-client")["spec"]["secretName"]
    assert mounted_secret_file("gpu-extender", settings.tls_cert) == (serving, "tls.crt")
    assert mounted_secret_file("gpu-extender", settings.tls_key) == (serving, "tls.key")
    assert mounted_secret_file("gpu-extender", settings.client_ca) == (client, "ca.crt")


# ---- the Deployments ---------------------------------------------------------------------------------------


def test_the_extender_runs_two_replicas_electing_a_leader() -> None:
    assert find("Deployment", "gpu-extender")["spec"]["replicas"] == 2
    settings = extender_settings()
    assert settings.leader_elect is True
    assert settings.lease_namespace == NAMESPACE
    assert settings.identity == environment("gpu-extender")["EXTENDER_IDENTITY"]
    by_downward_api = {
        variable["name"]: variable["valueFrom"]["fieldRef"]["fieldPath"]
        for variable in container("gpu-extender")["env"]
        if "valueFrom" in variable
    }
    assert by_downward_api == {
        "EXTENDER_LEASE_NAMESPACE": "metadata.namespace",
        "EXTENDER_IDENTITY": "metadata.name",
        "EXTENDER_POD_NAME": "metadata.name",
    }


def test_the_extender_serves_https_with_mutual_tls() -> None:
    settings = extender_settings()
    assert not settings.insecure_http
    assert settings.tls_cert and settings.tls_key and settings.client_ca


def test_the_extender_uses_only_settings_that_exist() -> None:
    names = {field.name for field in settings_module.fields()}
    (serve, *arguments) = container("gpu-extender")["args"]
    assert serve == "serve"
    for flag in flag_values(arguments):
        assert flag.removeprefix("--").removeprefix("no-").replace("-", "_") in names, flag
    for variable in environment("gpu-extender"):
        assert variable.removeprefix(settings_module.ENV_PREFIX).lower() in names, variable


def test_the_extenders_rollout_keeps_a_replica_with_a_full_cache() -> None:
    # every replica with a full cache is Ready (/synced), leader or not, so a rollout can wait for the new one
    strategy = find("Deployment", "gpu-extender")["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize("deployment", ["gpu-extender", "gpu-scheduler"])
def test_pods_are_locked_down(deployment: str) -> None:
    pod = pod_spec(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("hostPath" not in volume for volume in pod["volumes"])
    security = container(deployment)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security.get("privileged", False) is False
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("deployment", ["gpu-extender", "gpu-scheduler"])
def test_pods_have_requests_and_limits(deployment: str) -> None:
    resources = container(deployment)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"cpu", "memory"}


@pytest.mark.parametrize("deployment", ["gpu-extender", "gpu-scheduler"])
def test_replicas_spread_over_nodes_and_keep_one_through_evictions(deployment: str) -> None:
    template = find("Deployment", deployment)["spec"]["template"]
    spread = {constraint["topologyKey"]: constraint for constraint in template["spec"]["topologySpreadConstraints"]}
    assert (
        spread["kubernetes.io/hostname"]["labelSelector"]["matchLabels"].items()
        <= template["metadata"]["labels"].items()
    )
    budget = find("PodDisruptionBudget", deployment)["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"] == find("Deployment", deployment)["spec"]["selector"]["matchLabels"]


def test_probes_get_synced_and_healthz_from_the_plain_health_listener() -> None:
    """The kubelet's httpGet cannot present a client certificate: the probes go to --health-port, which serves
    the probe pages alone (tests/test_cli.py runs it), never to the mTLS port of the verbs."""
    extender, settings = container("gpu-extender"), extender_settings()
    assert settings.health_port and settings.health_port != settings.port
    ports = {port["name"]: port["containerPort"] for port in extender["ports"]}
    assert ports == {"https": settings.port, "health": settings.health_port}
    assert extender["readinessProbe"]["httpGet"] == {"path": "/synced", "port": "health"}
    assert extender["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    served = set(build_health_server(make_service(make_cluster())).router.paths)
    assert served == {"/healthz", "/readyz", "/synced", "/metrics"}
    assert find("Service", "gpu-extender")["spec"]["ports"][0]["targetPort"] == "https"


def test_the_extenders_pods_hold_no_client_key() -> None:
    """Only kube-scheduler holds the client certificate's key: the extender mounts the CA that signed it."""
    client = find("Certificate", "gpu-extender-scheduler-client")["spec"]["secretName"]
    mounted = [
        item["key"]
        for volume in pod_spec("gpu-extender")["volumes"]
        if volume.get("secret", {}).get("secretName") == client
        for item in volume["secret"]["items"]
    ]
    assert mounted == ["ca.crt"]


def test_the_network_policy_leaves_the_verbs_to_mtls_and_the_health_port_to_prometheus() -> None:
    (policy,) = [doc.body for doc in documents() if doc.kind == "NetworkPolicy"]
    deployment = find("Deployment", "gpu-extender")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod_labels.items(), "the policy selects the extender's pods"
    ports = {port["name"]: port for port in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    rules = {rule["ports"][0]["port"]: rule for rule in policy["spec"]["ingress"]}
    assert set(rules) == set(ports) == {"https", "health"}
    assert "from" not in rules["https"], "the verbs port is open: kube-scheduler may be in the host network"
    assert rules["health"]["from"], "the health port is limited to named peers"
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_manifests_is_its_base_alone() -> None:
    """`kubectl apply -k manifests/` applies base/ and nothing else: the base is a folder of its own because
    kustomize refuses an overlay (hami/) inside its base's folder."""
    assert yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"] == ["base"]


def test_the_hami_overlay_serves_hamis_protocol_with_the_right_to_lock_nodes_and_no_more() -> None:
    """manifests/hami/ patches manifests/ as kustomize would: the extender serves --protocol=hami; its ClusterRole
    gains nodes patch (HAMi's node lock), and the gpushare-only read of kube-system's ConfigMaps goes."""
    overlay = yaml.safe_load((MANIFESTS / "hami" / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../base"]
    json_patches = {
        patch["target"]["kind"]: yaml.safe_load(patch["patch"]) for patch in overlay["patches"] if "target" in patch
    }
    deleted = {(body["kind"], body["metadata"]["name"], body["metadata"]["namespace"]) for body in (
        yaml.safe_load(patch["patch"]) for patch in overlay["patches"] if "target" not in patch
    ) if body.pop("$patch") == "delete"}  # fmt: skip
    (args_patch,) = json_patches["Deployment"]
    assert args_patch == {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--protocol=hami"}
    assert "--protocol" in {flag.split("=")[0] for flag in [args_patch["value"]]}
    (rule_patch,) = json_patches["ClusterRole"]
    assert rule_patch["path"] == "/rules/-"
    assert rule_patch["value"] == {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}
    assert deleted == {
        ("Role", "gpu-extender-unhealthy-gpus", "kube-system"),
        ("RoleBinding", "gpu-extender-unhealthy-gpus", "kube-system"),
    }
    assert {(doc.kind, doc.name, doc.namespace) for doc in documents()} >= deleted, "what it deletes exists"
