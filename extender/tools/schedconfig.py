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

Two wirings (`Wiring`), measured with `make bench-e2e` (docs/benchmarks/bench-e2e.md):
- `full`, the default: filter, prioritize, preempt and bind. Our prioritize scores each node by the fill of the
  GPUs the pod would get and of the node, so the node choice binpacks GPUs, not only node totals.
- `filter-bind` (1.23 and later): filter, preempt and bind, no prioritize. kube-scheduler's own
  `NodeResourcesFit` scores the nodes, `MostAllocated` (binpack) or `LeastAllocated` (spread) on the managed
  resources nodes advertise, with our weight: one HTTPS call fewer per pod. What it gives up: the scheduler
  sees node totals only, so of two nodes equally full it cannot prefer the one whose GPUs the pod would fill;
  and the profile's `NodeResourcesFit` no longer scores cpu and memory, so pods asking no GPU get no score
  from it. The devices on the chosen node are still ours to choose, at bind.

This module renders text only: it never reads the environment, touches files or talks to a cluster, and it
never emits `insecure: true` (an HTTPS extender without a CA is refused instead, because kube-scheduler
silently skips verifying the extender's certificate when no CA is configured).
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any
from urllib.parse import urlsplit

import yaml

from extender.core.devices import Strategy
from extender.core.placement.config import Policy
from extender.settings import CpuPods, Settings
from extender.settings_values import SettingsError

OLDEST_MINOR = 19
"""Kubernetes 1.19: the oldest scheduler we render for (the legacy Policy file)."""
FIRST_V1BETA3 = 23
"""Kubernetes 1.23: the Policy file is gone; the config API at v1beta3 is the newest served."""
FIRST_V1 = 25
"""Kubernetes 1.25: the config API is GA as v1."""
SUPPORTED = f"1.{OLDEST_MINOR} to 1.22 as a Policy file, 1.23 and 1.24 as v1beta3, 1.25 and later 1.x as v1"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+][0-9A-Za-z.+-]*)?$")


class Wiring(enum.StrEnum):
    """Which verbs kube-scheduler calls, and who scores the nodes (the module's docstring says what each gives)."""

    FULL = "full"
    FILTER_BIND = "filter-bind"


FIRST_FILTER_BIND = FIRST_V1BETA3
"""Kubernetes 1.23: the oldest we render `filter-bind` for. The config API has `NodeResourcesFitArgs.scoringStrategy`
from v1beta2 (1.22), but we render 1.22 as a Policy file, whose `priorities` would replace every default."""

VERBS = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "preemptVerb": "preempt", "bindVerb": "bind"}
SCORING = {Strategy.BINPACK: "MostAllocated", Strategy.SPREAD: "LeastAllocated"}
"""kube-scheduler's NodeResourcesFit scoring strategy for our node strategy (the same arithmetic, per node)."""
DEFAULT_SCHEDULER = "default-scheduler"
"""The cluster's own scheduler: it also places the extender's pods, so it never sends us every pod by default."""


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
            f"weight must be > 0 (kube-scheduler requires it of a prioritize verb and of a score plugin), not "
            f"{settings.weight}"
        )
    if settings.http_timeout <= 0 or round(settings.http_timeout * 1e9) <= 0:
        raise SettingsError(f"http_timeout must be positive, not {settings.http_timeout}")
    if not settings.memory_resource:
        raise SettingsError("memory_resource is empty: the scheduler would send us every pod")
    if not 0 <= settings.nodes_to_score <= 100:
        raise SettingsError(f"nodes_to_score is a percentage of the nodes, 0 to 100, not {settings.nodes_to_score}")
    https = parts.scheme == "https"
    if https and not settings.scheduler_ca_file:
        raise SettingsError(
            "an https url needs --scheduler-ca-file: without a CA kube-scheduler does not verify the extender's "
            "certificate at all"
        )
    if bool(settings.scheduler_cert_file) != bool(settings.scheduler_key_file):
        raise SettingsError("--scheduler-cert-file and --scheduler-key-file go together (mTLS needs both)")
    return https


def extender_entry(settings: Settings, legacy_policy: bool, wiring: Wiring = Wiring.FULL) -> dict[str, Any]:
    """The `extenders[]` entry: the config API's keys, or the legacy Policy's (`enableHttps`, nanoseconds).
    Without a prioritize verb there is no weight: kube-scheduler reads it only for prioritize."""
    entry: dict[str, Any] = {"urlPrefix": settings.url}
    if wiring is Wiring.FILTER_BIND:
        entry |= {key: verb for key, verb in VERBS.items() if key != "prioritizeVerb"}
    else:
        entry |= {**VERBS, "weight": settings.weight}
    entry |= _connection(settings, legacy_policy, settings.http_timeout)
    # ignoredByScheduler stays false: the scheduler keeps counting gpu-mem per node (NodeResourcesFit) as for
    # any extended resource, so the node total holds even when we are ignorable and down, the kubelet (which
    # checks the same total at admission) never rejects a pod we placed, and our per-GPU check comes on top.
    # With HAMi's protocol only nvidia.com/gpu is a resource nodes advertise (GPUs x split count); gpumem,
    # gpumem-percentage and gpucores are not, so the scheduler must ignore them or no node would ever fit.
    protocol = settings.device_protocol
    if every_pod(settings) and not legacy_policy:
        # kube-scheduler sends a pod to an extender that manages no resource whatever it asks (extender.go
        # IsInterested), and managedResources may name extended resources only (validation.go), not cpu. What
        # kube-scheduler must not count is then said to NodeResourcesFit itself (`ignored_resources`), which is
        # what ignoredByScheduler does for it (scheduler.go buildExtenders).
        entry["managedResources"] = []
    else:
        entry["managedResources"] = [
            {"name": name, "ignoredByScheduler": name not in protocol.advertised_resources}
            for name in protocol.managed_resources
        ]
    entry["ignorable"] = settings.ignorable
    return entry


def _connection(settings: Settings, legacy_policy: bool, timeout: float) -> dict[str, Any]:
    """How kube-scheduler reaches us: HTTPS and its files, the timeout, and names only (`nodeCacheCapable`: the
    scheduler then sends NodeNames and MetaVictims, our cache holding the nodes already)."""
    https = _check(settings)
    keys: dict[str, Any] = {"enableHttps" if legacy_policy else "enableHTTPS": https}
    if https:
        tls = {"caFile": settings.scheduler_ca_file}
        if settings.scheduler_cert_file:
            tls |= {"certFile": settings.scheduler_cert_file, "keyFile": settings.scheduler_key_file}
        keys["tlsConfig"] = tls
    keys["httpTimeout"] = round(timeout * 1e9) if legacy_policy else go_duration(timeout)
    keys["nodeCacheCapable"] = True
    return keys


CPU_FILTER_VERB = "filter-cpu"
CPU_TIMEOUT = 1.0
"""The most the default scheduler waits for the second entry on a pod asking no GPU (`cpu_entry`): our filter
answers in milliseconds; an extender that hangs delays such a pod by this at most, then is ignored."""


def cpu_entry(settings: Settings, legacy_policy: bool) -> dict[str, Any] | None:
    """The second `extenders[]` entry, for the default scheduler (`pods_aside`): every pod reaches it (an empty
    managedResources), it only filters (`/filter-cpu`: a pod asking no GPU goes where its cpu strands the least
    GPU; one asking a GPU passes untouched, the first entry filtered and binds it), and it is `ignorable`: when
    the extender is down, refuses or times out, kube-scheduler places the pod as if it were not there
    (`findNodesThatPassExtenders`, pkg/scheduler/schedule_one.go at v1.34.1), so the cluster's system pods, the
    extender's own among them, never wait for it. None when not wanted."""
    if not pods_aside(settings):
        return None
    entry: dict[str, Any] = {"urlPrefix": settings.url, "filterVerb": CPU_FILTER_VERB}
    entry |= _connection(settings, legacy_policy, min(settings.http_timeout, CPU_TIMEOUT))
    entry["managedResources"] = []
    entry["ignorable"] = True
    return entry


def pods_aside(settings: Settings) -> bool:
    """Whether pods that ask no GPU reach us through a second, ignorable entry (`cpu_entry`): under the
    fragmentation policy, on the default scheduler, `cpu_pods` auto. Measured on the trace: the default
    scheduler's wiring without it ends a point below (docs/benchmarks/placement.md)."""
    return (
        settings.placement is Policy.FRAGMENTATION
        and settings.cpu_pods is CpuPods.AUTO
        and settings.scheduler_name == DEFAULT_SCHEDULER
    )


def every_pod(settings: Settings) -> bool:
    """Whether the scheduler sends us every pod, those that ask no GPU too (`Settings.cpu_pods`): under the
    fragmentation policy, on a scheduler of its own unless told otherwise."""
    if settings.placement is not Policy.FRAGMENTATION or settings.cpu_pods is CpuPods.OFF:
        return False
    return settings.cpu_pods is CpuPods.ON or settings.scheduler_name != DEFAULT_SCHEDULER


def ignored_resources(settings: Settings) -> list[str]:
    """The protocol's resources no node advertises, which NodeResourcesFit must not count when the extender manages
    every pod (HAMi's gpumem, gpumem-percentage and gpucores); none otherwise."""
    if not every_pod(settings):
        return []
    protocol = settings.device_protocol
    return [name for name in protocol.managed_resources if name not in protocol.advertised_resources]


def node_scoring_profile(settings: Settings) -> dict[str, Any]:
    """The `filter-bind` profile: NodeResourcesFit scores the nodes by the managed resources nodes advertise
    (gpushare: the GPU memory; HAMi: nvidia.com/gpu) and nothing else, with the weight our prioritize would have
    had (ours: score 0..10 x weight x 10; a plugin's: 0..100 x weight), so it outweighs the default score
    plugins as much as our prioritize does."""
    resources = [{"name": name, "weight": 1} for name in settings.device_protocol.advertised_resources]
    scoring = {"type": SCORING[settings.node_strategy], "resources": resources}
    return {
        "schedulerName": settings.scheduler_name,
        "plugins": {"score": {"enabled": [{"name": "NodeResourcesFit", "weight": settings.weight}]}},
        "pluginConfig": [{"name": "NodeResourcesFit", "args": {"scoringStrategy": scoring}}],
    }


def _fit_args(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's NodeResourcesFit args, added when it has none."""
    configs = profile.setdefault("pluginConfig", [])
    for config in configs:
        if config["name"] == "NodeResourcesFit":
            return config.setdefault("args", {})  # type: ignore[no-any-return]
    configs.append({"name": "NodeResourcesFit", "args": {}})
    return configs[-1]["args"]  # type: ignore[no-any-return]


def _config_api(settings: Settings, minor: int, api_version: str, wiring: Wiring) -> str:
    if not settings.scheduler_name:
        raise SettingsError("scheduler_name is empty: the profile needs a schedulerName")
    entry = extender_entry(settings, legacy_policy=False, wiring=wiring)
    document: dict[str, Any] = {"apiVersion": api_version, "kind": "KubeSchedulerConfiguration"}
    if settings.scheduler_kubeconfig:
        document["clientConnection"] = {"kubeconfig": settings.scheduler_kubeconfig}
    if settings.nodes_to_score:
        # Global, not the profile's (which 1.23 and 1.24 lack): kube-scheduler stops filtering once it has found
        # this share of the nodes, and we choose among those only.
        document["percentageOfNodesToScore"] = settings.nodes_to_score
    resource, url = " or ".join(settings.device_protocol.managed_resources), settings.url
    pods = "Every pod (--cpu-pods) is" if every_pod(settings) else f"Pods asking for {resource} are"
    if wiring is Wiring.FILTER_BIND:
        profile = node_scoring_profile(settings)
        scored_on = ", ".join(settings.device_protocol.advertised_resources)
        what = (
            f"# {pods} then filtered and bound by {url};\n"
            f"# kube-scheduler's NodeResourcesFit scores the nodes, {SCORING[settings.node_strategy]} on {scored_on} "
            "(wiring filter-bind).\n"
        )
    else:
        profile = {"schedulerName": settings.scheduler_name}
        what = f"# {pods} then filtered, scored and bound by {url}.\n"
    ignored = ignored_resources(settings)
    if ignored:
        _fit_args(profile)["ignoredResources"] = ignored
    second = cpu_entry(settings, legacy_policy=False)
    document |= {"profiles": [profile], "extenders": [entry] if second is None else [entry, second]}
    if second is not None:
        what += (
            f"# Pods asking no GPU are filtered by {url}/{CPU_FILTER_VERB} (a second entry, ignorable: placed as if\n"
            "# it were not there when the extender is down or slow).\n"
        )
    left = (
        "leaderElection is\n# left at its default here).\n"
        if settings.scheduler_kubeconfig
        else "clientConnection and\n# leaderElection are left at their defaults here).\n"
    )
    header = (
        f"# kube-scheduler configuration for Kubernetes 1.{minor} ({api_version}), from `extender scheduler-config`.\n"
        "# Start kube-scheduler with --config=<this file>, merged with your own settings (" + left + what
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
    entries = [extender_entry(settings, legacy_policy=True)]
    second = cpu_entry(settings, legacy_policy=True)
    document = {"kind": "Policy", "apiVersion": "v1", "extenders": entries if second is None else [*entries, second]}
    return json.dumps(document, indent=2) + "\n"


def render(settings: Settings, k8s_version: str, wiring: Wiring = Wiring.FULL) -> str:
    """The configuration text for a kube-scheduler of `k8s_version` and this wiring (see the module docstring)."""
    minor = kubernetes_minor(k8s_version)
    if minor >= FIRST_V1:
        return _config_api(settings, minor, "kubescheduler.config.k8s.io/v1", wiring)
    if minor >= FIRST_V1BETA3:
        return _config_api(settings, minor, "kubescheduler.config.k8s.io/v1beta3", wiring)
    if wiring is not Wiring.FULL:
        raise SettingsError(
            f"wiring {wiring.value} needs kube-scheduler 1.{FIRST_FILTER_BIND} or later (NodeResourcesFit's "
            f"scoringStrategy); 1.{minor} gets a Policy file: use the full wiring"
        )
    return _policy(settings, minor)
