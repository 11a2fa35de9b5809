"""The kube-scheduler configuration that calls this extender, rendered for the scheduler's Kubernetes version.

`extender scheduler-config --k8s-version X.Y` prints it from the same settings `serve` uses, so the URL,
timeout, weight, resource name and TLS files the scheduler is given always match what the extender serves.
Which format a version gets (checked against the Kubernetes sources and KEP-785):

- 1.25 and later: `KubeSchedulerConfiguration` `kubescheduler.config.k8s.io/v1` (GA in 1.25), YAML for
  `kube-scheduler --config`.
- 1.23 and 1.24: `kubescheduler.config.k8s.io/v1beta3`, the newest version those releases serve (v1 did not
  exist yet; v1beta2 was already deprecated in favour of it). Same extender keys as v1.
- 1.19 to 1.22: the legacy `Policy` file (`kind: Policy, apiVersion: v1`, JSON for
  `kube-scheduler --policy-config-file`), removed in 1.23. Its extender keys differ from the config API:
  `enableHttps` instead of `enableHTTPS`, `httpTimeout` in integer nanoseconds instead of a duration string.
  1.19 is the oldest release we support: the first with the beta configuration API, and older ones have
  been out of support since 2021; nothing older was checked.

Any other version (older, unparsable, another major) is a `SettingsError` naming the value and the range.
This module renders text only: it never reads the environment, touches files or talks to a cluster, and it
never emits `insecure: true` (an HTTPS extender without a CA is refused instead, because kube-scheduler
silently skips verifying the extender's certificate when no CA is configured).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import yaml

from extender.settings import Settings, SettingsError

OLDEST_MINOR = 19
"""Kubernetes 1.19: the oldest scheduler we render for (the legacy Policy file)."""
FIRST_V1BETA3 = 23
"""Kubernetes 1.23: the Policy file is gone; the config API at v1beta3 is the newest served."""
FIRST_V1 = 25
"""Kubernetes 1.25: the config API is GA as v1."""
SUPPORTED = f"1.{OLDEST_MINOR} to 1.22 as a Policy file, 1.23 and 1.24 as v1beta3, 1.25 and later 1.x as v1"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+][0-9A-Za-z.+-]*)?$")

VERBS = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "preemptVerb": "preempt", "bindVerb": "bind"}


def kubernetes_minor(k8s_version: str) -> int:
    """The minor of a Kubernetes 1.x version: "1.31", "v1.31", "1.31.4" and "v1.31.4-eks-1" give 31."""
    match = _VERSION.match(k8s_version.strip())
    if match is None:
        raise SettingsError(
            f"--k8s-version {k8s_version!r} is not a Kubernetes version like 1.31 (supported: {SUPPORTED})"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    if major != 1 or minor < OLDEST_MINOR:
        raise SettingsError(
            f"--k8s-version {k8s_version!r}: no scheduler configuration known for Kubernetes {major}.{minor} "
            f"(supported: {SUPPORTED})"
        )
    return minor


def go_duration(seconds: float) -> str:
    """Seconds as a Go duration string ("5s", "2500ms"), exact to the nanosecond, as metav1.Duration reads it."""
    nanoseconds = round(seconds * 1e9)
    for unit, size in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if nanoseconds % size == 0:
            return f"{nanoseconds // size}{unit}"
    return f"{nanoseconds}ns"


def _check(settings: Settings) -> bool:
    """Refuse settings the scheduler would misread; returns whether the URL is HTTPS.

    `scheduler-config` builds its settings unchecked (it needs no serving certificate), so the fields that
    end up in the scheduler's configuration are checked here.
    """
    parts = urlsplit(settings.url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise SettingsError(f"url {settings.url!r} must be http:// or https:// with a host")
    if settings.weight <= 0:
        raise SettingsError(
            f"weight must be > 0 (kube-scheduler requires it with a prioritize verb), not {settings.weight}"
        )
    if settings.http_timeout <= 0 or round(settings.http_timeout * 1e9) <= 0:
        raise SettingsError(f"http_timeout must be positive, not {settings.http_timeout}")
    if not settings.memory_resource:
        raise SettingsError("memory_resource is empty: the scheduler would send us every pod")
    https = parts.scheme == "https"
    if https and not settings.scheduler_ca_file:
        raise SettingsError(
            "an https url needs --scheduler-ca-file: without a CA kube-scheduler does not verify the extender's "
            "certificate at all"
        )
    if bool(settings.scheduler_cert_file) != bool(settings.scheduler_key_file):
        raise SettingsError("--scheduler-cert-file and --scheduler-key-file go together (mTLS needs both)")
    return https


def extender_entry(settings: Settings, legacy_policy: bool) -> dict[str, Any]:
    """The `extenders[]` entry: the config API's keys, or the legacy Policy's (`enableHttps`, nanoseconds)."""
    https = _check(settings)
    entry: dict[str, Any] = {"urlPrefix": settings.url, **VERBS, "weight": settings.weight}
    entry["enableHttps" if legacy_policy else "enableHTTPS"] = https
    if https:
        tls = {"caFile": settings.scheduler_ca_file}
        if settings.scheduler_cert_file:
            tls |= {"certFile": settings.scheduler_cert_file, "keyFile": settings.scheduler_key_file}
        entry["tlsConfig"] = tls
    entry["httpTimeout"] = round(settings.http_timeout * 1e9) if legacy_policy else go_duration(settings.http_timeout)
    # The scheduler then sends names only (NodeNames, MetaVictims): our cache holds the nodes already.
    entry["nodeCacheCapable"] = True
    # ignoredByScheduler stays false: the scheduler keeps counting gpu-mem per node (NodeResourcesFit) as for
    # any extended resource, so the node total holds even when we are ignorable and down, the kubelet (which
    # checks the same total at admission) never rejects a pod we placed, and our per-GPU check comes on top.
    # With HAMi's protocol only nvidia.com/gpu is a resource nodes advertise (GPUs x split count); gpumem,
    # gpumem-percentage and gpucores are not, so the scheduler must ignore them or no node would ever fit.
    protocol = settings.device_protocol
    entry["managedResources"] = [
        {"name": name, "ignoredByScheduler": name not in protocol.advertised_resources}
        for name in protocol.managed_resources
    ]
    entry["ignorable"] = settings.ignorable
    return entry


def _config_api(settings: Settings, minor: int, api_version: str) -> str:
    if not settings.scheduler_name:
        raise SettingsError("scheduler_name is empty: the profile needs a schedulerName")
    entry = extender_entry(settings, legacy_policy=False)
    document: dict[str, Any] = {"apiVersion": api_version, "kind": "KubeSchedulerConfiguration"}
    if settings.scheduler_kubeconfig:
        document["clientConnection"] = {"kubeconfig": settings.scheduler_kubeconfig}
    document |= {"profiles": [{"schedulerName": settings.scheduler_name}], "extenders": [entry]}
    left = (
        "leaderElection is\n# left at its default here).\n"
        if settings.scheduler_kubeconfig
        else "clientConnection and\n# leaderElection are left at their defaults here).\n"
    )
    header = (
        f"# kube-scheduler configuration for Kubernetes 1.{minor} ({api_version}), from `extender scheduler-config`.\n"
        "# Start kube-scheduler with --config=<this file>, merged with your own settings ("
        + left
        + f"# Pods asking for {settings.memory_resource} are then filtered, scored and bound by {settings.url}.\n"
    )
    if "tlsConfig" in entry:
        header += "# The tlsConfig files are paths on the scheduler's host: mount them there.\n"
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def _policy(settings: Settings, minor: int) -> str:
    for name, value, default, instead in (
        ("scheduler_name", settings.scheduler_name, "default-scheduler", "kube-scheduler's --scheduler-name flag"),
        ("scheduler_kubeconfig", settings.scheduler_kubeconfig, "", "kube-scheduler's --kubeconfig flag"),
    ):
        if value != default:
            raise SettingsError(
                f"{name} {value!r}: a Policy file (Kubernetes 1.{minor}) has no such field; use {instead} instead"
            )
    # No "predicates"/"priorities" keys: absent, the scheduler keeps its defaults; an empty list disables them.
    document = {"kind": "Policy", "apiVersion": "v1", "extenders": [extender_entry(settings, legacy_policy=True)]}
    return json.dumps(document, indent=2) + "\n"


def render(settings: Settings, k8s_version: str) -> str:
    """The configuration text for a kube-scheduler of `k8s_version` (see the module docstring for which)."""
    minor = kubernetes_minor(k8s_version)
    if minor >= FIRST_V1:
        return _config_api(settings, minor, "kubescheduler.config.k8s.io/v1")
    if minor >= FIRST_V1BETA3:
        return _config_api(settings, minor, "kubescheduler.config.k8s.io/v1beta3")
    return _policy(settings, minor)
