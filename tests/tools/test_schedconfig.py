"""`extender scheduler-config`: what each Kubernetes minor gets, and what is refused."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pytest
import yaml

from extender import cli
from extender.core.devices import Strategy
from extender.core.placement.config import Policy
from extender.settings import CpuPods, Protocol, Settings
from extender.settings_values import SettingsError
from extender.tools.schedconfig import Wiring, go_duration, kubernetes_minor, render

# minor -> (apiVersion, kind) the scheduler of that minor reads
CONFIG_API = {minor: ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration") for minor in range(25, 36)}
CONFIG_API |= {minor: ("kubescheduler.config.k8s.io/v1beta3", "KubeSchedulerConfiguration") for minor in (23, 24)}
POLICY = {minor: ("v1", "Policy") for minor in range(19, 23)}
EVERY_MINOR = sorted(CONFIG_API | POLICY)

SETTINGS = Settings(
    url="https://gpu-extender.gpu-extender.svc:443",
    weight=3,
    http_timeout=5.0,
    scheduler_ca_file="/etc/kubernetes/gpu-extender/ca.crt",
    scheduler_cert_file="/etc/kubernetes/gpu-extender/client.crt",
    scheduler_key_file="/etc/kubernetes/gpu-extender/client.key",
)


def parse(text: str, minor: int) -> dict[str, Any]:
    """Config API output is YAML; the Policy file must be strict JSON (no comments)."""
    loaded = json.loads(text) if minor in POLICY else yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def only_extender(document: dict[str, Any]) -> dict[str, Any]:
    """The extender entry that filters, scores and binds the GPU pods (beside it, at most the ignorable entry of
    the pods that ask no GPU: `cpu_extender`)."""
    extenders = document["extenders"]
    assert isinstance(extenders, list) and len(extenders) in (1, 2)
    entry = extenders[0]
    assert isinstance(entry, dict) and entry.get("bindVerb") == "bind"
    if len(extenders) == 2:
        assert extenders[1]["filterVerb"] == "filter-cpu" and "bindVerb" not in extenders[1]
    return entry


def cpu_extender(document: dict[str, Any]) -> dict[str, Any] | None:
    """The second, ignorable entry that pods asking no GPU reach on the default scheduler (None without it)."""
    extenders = document["extenders"]
    return extenders[1] if len(extenders) == 2 else None


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_each_minor_gets_the_api_it_serves(minor: int) -> None:
    document = parse(render(SETTINGS, f"1.{minor}"), minor)
    assert (document["apiVersion"], document["kind"]) == (CONFIG_API | POLICY)[minor]


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_extender_entry_calls_every_verb_with_node_names(minor: int) -> None:
    entry = only_extender(parse(render(SETTINGS, f"1.{minor}"), minor))
    assert entry["urlPrefix"] == SETTINGS.url
    assert (entry["filterVerb"], entry["prioritizeVerb"], entry["bindVerb"], entry["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert entry["nodeCacheCapable"] is True
    assert entry["weight"] == 3
    assert entry["ignorable"] is False


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_gpu_memory_is_managed_and_still_counted_by_the_scheduler(minor: int) -> None:
    entry = only_extender(parse(render(SETTINGS, f"1.{minor}"), minor))
    assert entry["managedResources"] == GPU_MEMORY


GPU_MEMORY = [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]
SECOND_SCHEDULER = dataclasses.replace(SETTINGS, scheduler_name="gpu-scheduler")
EVERY_POD = dataclasses.replace(SETTINGS, cpu_pods=CpuPods.ON)


@pytest.mark.parametrize("minor", sorted(CONFIG_API))
def test_a_scheduler_of_its_own_sends_every_pod_so_pods_without_gpus_are_placed_too(minor: int) -> None:
    """An extender managing no resource is sent every pod (extender.go IsInterested); cpu cannot be named in
    managedResources (validation.go: extended resources only)."""
    assert only_extender(parse(render(SECOND_SCHEDULER, f"1.{minor}"), minor))["managedResources"] == []


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (SETTINGS, "the default scheduler also places the extender itself"),
        (dataclasses.replace(SECOND_SCHEDULER, cpu_pods=CpuPods.OFF), "asked"),
        (dataclasses.replace(SECOND_SCHEDULER, placement=Policy.FILL), "the fill policy never looks at cpu"),
    ],
    ids=["default-scheduler", "off", "fill"],
)
def test_pods_that_ask_no_gpu_do_not_reach_the_main_entry(settings: Settings, why: str) -> None:
    assert only_extender(parse(render(settings, "1.34"), 34))["managedResources"] == GPU_MEMORY, why


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_on_the_default_scheduler_pods_without_gpus_reach_an_ignorable_filter_of_their_own(minor: int) -> None:
    """Issue 25: every pod reaches the second entry (an empty managedResources, extender.go IsInterested), which
    only filters (`/filter-cpu`) and is ignorable: an extender that is down or slow (1 s at most) is skipped
    (schedule_one.go findNodesThatPassExtenders), so system pods never wait for it; it does not bind or
    preempt (one binder only, validation.go validateExtenders)."""
    document = parse(render(SETTINGS, f"1.{minor}"), minor)
    entry = cpu_extender(document)
    assert entry is not None
    assert entry["urlPrefix"] == SETTINGS.url and entry["managedResources"] == []
    assert entry["ignorable"] is True and entry["nodeCacheCapable"] is True
    assert {key for key in entry if key.endswith("Verb")} == {"filterVerb"}
    assert entry["httpTimeout"] == (1_000_000_000 if minor in POLICY else "1s")
    assert entry.get("tlsConfig") == only_extender(document).get("tlsConfig")


@pytest.mark.parametrize(
    "settings",
    [
        SECOND_SCHEDULER,
        dataclasses.replace(SETTINGS, cpu_pods=CpuPods.OFF),
        dataclasses.replace(SETTINGS, cpu_pods=CpuPods.ON),
        dataclasses.replace(SETTINGS, placement=Policy.FILL),
    ],
    ids=["second-scheduler", "off", "on", "fill"],
)
def test_no_second_entry_where_pods_without_gpus_have_their_way(settings: Settings) -> None:
    assert cpu_extender(parse(render(settings, "1.34"), 34)) is None


def test_cpu_pods_on_sends_every_pod_even_from_the_default_scheduler() -> None:
    assert only_extender(parse(render(EVERY_POD, "1.34"), 34))["managedResources"] == []


@pytest.mark.parametrize("minor", sorted(POLICY))
def test_a_policy_file_never_sends_every_pod(minor: int) -> None:
    """A Policy file has no NodeResourcesFit arguments to take HAMi's resources away from the scheduler."""
    assert only_extender(parse(render(EVERY_POD, f"1.{minor}"), minor))["managedResources"] == GPU_MEMORY


def test_hamis_resources_no_node_advertises_are_ignored_by_node_resources_fit_when_every_pod_comes_to_us() -> None:
    hami = dataclasses.replace(SECOND_SCHEDULER, protocol=Protocol.HAMI)
    document = parse(render(hami, "1.34"), 34)
    assert only_extender(document)["managedResources"] == []
    (profile,) = document["profiles"]
    assert profile["pluginConfig"] == [
        {
            "name": "NodeResourcesFit",
            "args": {"ignoredResources": ["nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"]},
        }
    ]


@pytest.mark.parametrize("minor", sorted(CONFIG_API))
def test_kube_scheduler_keeps_its_adaptive_share_of_nodes_unless_told_a_percentage(minor: int) -> None:
    """The default leaves kube-scheduler's adaptive share (issue 26: the same placement on the trace, real mode,
    three seeds, for a third less CPU per pod); `--nodes-to-score 100` makes it filter every node."""
    assert "percentageOfNodesToScore" not in parse(render(SETTINGS, f"1.{minor}"), minor)
    every = parse(render(dataclasses.replace(SETTINGS, nodes_to_score=100), f"1.{minor}"), minor)
    assert every["percentageOfNodesToScore"] == 100


@pytest.mark.parametrize("share", [-1, 101])
def test_a_share_of_nodes_to_score_outside_0_to_100_is_refused(share: int) -> None:
    with pytest.raises(SettingsError, match=f"nodes_to_score is a percentage of the nodes, 0 to 100, not {share}"):
        render(dataclasses.replace(SETTINGS, nodes_to_score=share), "1.34")


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_timeout_is_a_duration_in_the_config_api_and_nanoseconds_in_the_policy(minor: int) -> None:
    entry = only_extender(parse(render(SETTINGS, f"1.{minor}"), minor))
    assert entry["httpTimeout"] == (5_000_000_000 if minor in POLICY else "5s")


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_https_verifies_our_certificate_and_presents_a_client_certificate(minor: int) -> None:
    entry = only_extender(parse(render(SETTINGS, f"1.{minor}"), minor))
    https_key = "enableHttps" if minor in POLICY else "enableHTTPS"
    assert entry[https_key] is True
    assert ({"enableHttps", "enableHTTPS"} - {https_key}).isdisjoint(entry)
    assert entry["tlsConfig"] == {
        "caFile": "/etc/kubernetes/gpu-extender/ca.crt",
        "certFile": "/etc/kubernetes/gpu-extender/client.crt",
        "keyFile": "/etc/kubernetes/gpu-extender/client.key",
    }
    assert "insecure" not in entry["tlsConfig"]


@pytest.mark.parametrize("minor", EVERY_MINOR)
def test_plain_http_has_no_tls_config(minor: int) -> None:
    plain = Settings(url="http://127.0.0.1:8080")
    entry = only_extender(parse(render(plain, f"1.{minor}"), minor))
    assert entry["enableHttps" if minor in POLICY else "enableHTTPS"] is False
    assert "tlsConfig" not in entry


@pytest.mark.parametrize("minor", sorted(CONFIG_API))
def test_config_api_has_a_profile_and_a_header_saying_what_it_is(minor: int) -> None:
    text = render(dataclasses.replace(SETTINGS, scheduler_name="gpu-scheduler"), f"1.{minor}")
    assert parse(text, minor)["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    assert "leaderElection" not in parse(text, minor)
    assert text.startswith(f"# kube-scheduler configuration for Kubernetes 1.{minor} (")
    assert "--config" in text.splitlines()[1]


def test_profile_defaults_to_the_default_scheduler() -> None:
    assert parse(render(SETTINGS, "1.31"), 31)["profiles"] == [{"schedulerName": "default-scheduler"}]


@pytest.mark.parametrize("minor", sorted(CONFIG_API))
def test_the_scheduler_s_kubeconfig_goes_in_its_client_connection(minor: int) -> None:
    """With --config, kube-scheduler ignores its --kubeconfig flag (kubeadm's static pod has one)."""
    text = render(dataclasses.replace(SETTINGS, scheduler_kubeconfig="/etc/kubernetes/scheduler.conf"), f"1.{minor}")
    assert parse(text, minor)["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert "leaderElection is\n# left at its default here" in text
    assert "clientConnection" not in parse(render(SETTINGS, f"1.{minor}"), minor)


@pytest.mark.parametrize(
    ("changed", "flag"),
    [({"scheduler_name": "gpu-scheduler"}, "--scheduler-name"), ({"scheduler_kubeconfig": "/k"}, "--kubeconfig")],
)
def test_a_policy_file_refuses_what_only_kube_scheduler_s_flags_can_say(changed: dict[str, str], flag: str) -> None:
    with pytest.raises(
        SettingsError, match=f"a Policy file \\(Kubernetes 1.22\\) has no such field; use kube-scheduler's {flag}"
    ):
        render(dataclasses.replace(SETTINGS, **changed), "1.22")


def test_an_empty_scheduler_name_is_refused() -> None:
    with pytest.raises(SettingsError, match="scheduler_name is empty"):
        render(dataclasses.replace(SETTINGS, scheduler_name=""), "1.31")


def test_policy_keeps_the_default_predicates_and_priorities() -> None:
    # absent keys mean "the defaults"; an empty list would switch every in-tree filter off
    document = parse(render(SETTINGS, "1.22"), 22)
    assert set(document) == {"kind", "apiVersion", "extenders"}


def test_client_certificate_is_optional() -> None:
    server_only = Settings(scheduler_ca_file="/ca.crt", scheduler_cert_file="", scheduler_key_file="")
    entry = only_extender(parse(render(server_only, "1.31"), 31))
    assert entry["tlsConfig"] == {"caFile": "/ca.crt"}


@pytest.mark.parametrize(
    ("seconds", "duration", "nanoseconds"),
    [(5.0, "5s", 5_000_000_000), (2.5, "2500ms", 2_500_000_000), (0.0005, "500us", 500_000), (30, "30s", 30 * 10**9)],
)
def test_timeout_formats_are_exact(seconds: float, duration: str, nanoseconds: int) -> None:
    assert go_duration(seconds) == duration
    entry = only_extender(parse(render(Settings(http_timeout=seconds), "1.21"), 21))
    assert entry["httpTimeout"] == nanoseconds


@pytest.mark.parametrize(("version", "minor"), [("1.31", 31), ("v1.31", 31), ("1.31.4", 31), ("v1.29.3-eks-1", 29)])
def test_version_spellings(version: str, minor: int) -> None:
    assert kubernetes_minor(version) == minor


@pytest.mark.parametrize("version", ["1.18", "1.10", "0.31", "2.0", "1.x", "abc", "", "1", "1.31.4.5"])
def test_unsupported_versions_are_refused_with_the_range(version: str) -> None:
    with pytest.raises(SettingsError) as raised:
        render(SETTINGS, version)
    message = str(raised.value)
    assert repr(version) in message
    assert "1.19" in message and "1.25" in message


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        (Settings(url="gpu-extender:443"), "url"),
        (Settings(url="ftp://gpu-extender"), "url"),
        (Settings(weight=0), "weight"),
        (Settings(http_timeout=0), "http_timeout"),
        (Settings(scheduler_ca_file=""), "--scheduler-ca-file"),
        (Settings(scheduler_key_file=""), "--scheduler-key-file"),
    ],
)
def test_settings_the_scheduler_would_misread_are_refused(settings: Settings, names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        render(settings, "1.31")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads EXTENDER_* variables; the tests must not depend on the caller's."""
    for name in [name for name in os.environ if name.startswith("EXTENDER_")]:
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_cli_prints_a_config_that_parses(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["scheduler-config", "--k8s-version", "1.31", "--weight", "7"]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    assert document["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert only_extender(document)["weight"] == 7


@pytest.mark.usefixtures("clean_env")
def test_cli_renders_a_second_scheduler_with_its_kubeconfig(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["scheduler-config", "--k8s-version", "1.34", "--scheduler-name", "gpu-scheduler"]
    assert cli.main([*argv, "--scheduler-kubeconfig", "/etc/kubernetes/scheduler.conf"]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    assert document["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    assert document["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}


@pytest.mark.usefixtures("clean_env")
def test_cli_reports_an_unsupported_version_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["scheduler-config", "--k8s-version", "1.18"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "1.18" in captured.err


def test_hamis_protocol_renders_its_managed_resources_only_nvidia_gpu_counted_by_the_scheduler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nodes advertise nvidia.com/gpu (GPUs x split count); gpumem, gpumem-percentage and gpucores exist only in
    pods, so kube-scheduler must ignore them (HAMi's chart ignores all four: charts/hami/templates/_helpers.tpl)."""
    cli.main(["scheduler-config", "--k8s-version", "1.34", "--protocol", "hami", "--scheduler-name", "hami-scheduler"])
    config = yaml.safe_load(capsys.readouterr().out)
    (extender,) = config["extenders"]
    assert extender["managedResources"] == [] and config["profiles"][0]["pluginConfig"][0]["args"] == {
        "ignoredResources": ["nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"]
    }
    assert config["profiles"][0]["schedulerName"] == "hami-scheduler"
    cli.main(["scheduler-config", "--k8s-version", "1.34", "--protocol", "hami", "--cpu-pods", "off"])
    (extender,) = yaml.safe_load(capsys.readouterr().out)["extenders"]
    assert extender["managedResources"] == [
        {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
        {"name": "nvidia.com/gpumem", "ignoredByScheduler": True},
        {"name": "nvidia.com/gpumem-percentage", "ignoredByScheduler": True},
        {"name": "nvidia.com/gpucores", "ignoredByScheduler": True},
    ]


FILTER_BIND_MINORS = sorted(CONFIG_API)


@pytest.mark.parametrize("minor", FILTER_BIND_MINORS)
def test_filter_bind_calls_every_verb_but_prioritize_and_gives_no_extender_weight(minor: int) -> None:
    entry = only_extender(parse(render(SETTINGS, f"1.{minor}", Wiring.FILTER_BIND), minor))
    assert (entry["filterVerb"], entry["bindVerb"], entry["preemptVerb"]) == ("filter", "bind", "preempt")
    assert "prioritizeVerb" not in entry and "weight" not in entry
    assert entry["managedResources"] == GPU_MEMORY
    assert entry["nodeCacheCapable"] is True


@pytest.mark.parametrize("minor", FILTER_BIND_MINORS)
def test_filter_bind_binpacks_nodes_with_node_resources_fit_on_gpu_memory_alone_at_our_weight(minor: int) -> None:
    """Our prioritize adds up to 10 x weight x 10 to a node; NodeResourcesFit at that weight, up to 100 x weight."""
    (profile,) = parse(render(SETTINGS, f"1.{minor}", Wiring.FILTER_BIND), minor)["profiles"]
    assert profile == {
        "schedulerName": "default-scheduler",
        "plugins": {"score": {"enabled": [{"name": "NodeResourcesFit", "weight": 3}]}},
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [{"name": "aliyun.com/gpu-mem", "weight": 1}],
                    }
                },
            }
        ],
    }


def test_filter_bind_spreads_with_least_allocated_when_nodes_are_spread() -> None:
    settings = dataclasses.replace(SETTINGS, node_strategy=Strategy.SPREAD)
    document = yaml.safe_load(render(settings, "1.34", Wiring.FILTER_BIND))
    scoring = document["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]
    assert scoring["type"] == "LeastAllocated"


def test_filter_bind_says_who_scores_in_its_header() -> None:
    header = [line for line in render(SETTINGS, "1.34", Wiring.FILTER_BIND).splitlines() if line.startswith("#")]
    assert any("NodeResourcesFit scores the nodes, MostAllocated on aliyun.com/gpu-mem" in line for line in header)


@pytest.mark.parametrize("minor", sorted(POLICY))
def test_filter_bind_is_refused_for_a_policy_file(minor: int) -> None:
    with pytest.raises(SettingsError, match=f"needs kube-scheduler 1.23 or later.*1.{minor} gets a Policy file"):
        render(SETTINGS, f"1.{minor}", Wiring.FILTER_BIND)


def test_the_full_wiring_is_the_default() -> None:
    assert render(SETTINGS, "1.34") == render(SETTINGS, "1.34", Wiring.FULL)
