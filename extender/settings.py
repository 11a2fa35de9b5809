"""One frozen settings object, built once from defaults, a config file, `EXTENDER_*` variables and flags.

Precedence, lowest to highest: the defaults below, `--config FILE` (YAML or JSON, keys as the field names,
dashes or underscores), the environment (`EXTENDER_TLS_CERT` for `tls_cert`), the command line
(`--tls-cert`). Every field is a flag and a variable; the docstring under a field is its help text.
A wrong value is a `SettingsError` naming where it came from, never a stack trace.

Everything else receives the object (or the parts it needs) explicitly; nothing reads the environment later.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.core.devices import Strategy
from extender.core.ledger import GROUP_HOLD_TTL
from extender.core.placement.config import Narrowing, Policy, PolicyConfig
from extender.core.placement.workload import HALF_LIFE
from extender.core.protocols import DeviceProtocol
from extender.core.protocols.gpushare import Profile, SeveralGpus
from extender.core.protocols.hami import Hami
from extender.settings_values import SettingsError, convert, read_config

ENV_PREFIX = "EXTENDER_"

JITTER = 1.2
"""client-go's JitterFactor: a wait of `retry_period` becomes one in [retry_period, 2.2 x retry_period)."""
_PROFILE = Profile()
_NAMED = {field.name for field in dataclasses.fields(Profile)} - {"several_gpus"}
"""The profile's fields that are settings of the same name (`several_gpus` is `gpushare_several_gpus`)."""

HEALTH_MAX_CONNECTIONS = 64
"""Connections to the health port: the kubelet's probes and Prometheus take one or two each; whoever else
reaches the port (a NetworkPolicy limits who does) cannot take the file descriptors the verbs need."""


class Protocol(enum.StrEnum):
    """Which device plugin the nodes run (`core/protocols/`)."""

    GPUSHARE = "gpushare"
    HAMI = "hami"


class GpuSeries(enum.StrEnum):
    """Which GPU series /metrics carries (`service/gpu_metrics.py`)."""

    AUTO = "auto"
    """Per GPU up to the limit, per node beyond it."""
    GPU = "gpu"
    NODE = "node"
    OFF = "off"


class CpuPods(enum.StrEnum):
    """Whether the scheduler sends pods that ask no GPU through the extender (`Settings.cpu_pods`)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def _doc(help_text: str, **extra: Any) -> Any:
    return dataclasses.field(default=extra.pop("default"), metadata={"help": help_text, **extra})


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    """How a replica holds its Lease (client-go's LeaderElectionConfig); the rules are client-go's."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def check(self) -> str | None:
        """Why these timings cannot work (client-go's own checks), or None."""
        if self.lease_duration <= self.renew_deadline:
            return f"lease_duration ({self.lease_duration}) must be greater than renew_deadline ({self.renew_deadline})"
        if self.renew_deadline <= JITTER * self.retry_period:
            deadline, period = self.renew_deadline, self.retry_period
            return f"renew_deadline ({deadline}) must be greater than {JITTER} x retry_period ({period})"
        return None


@dataclass(frozen=True, slots=True)
class Settings:
    # -- serving
    host: str = _doc("Address to listen on.", default="0.0.0.0")
    port: int = _doc("Port to listen on.", default=8443)
    health_port: int = _doc(
        "Port of a second, plain-HTTP listener on --host that serves only GET /healthz, /readyz, /synced and "
        "/metrics, for kubelet httpGet probes and Prometheus without a client certificate; never the verbs or "
        "/inspect. 0: no such listener.",
        default=0,
    )
    tls_cert: str = _doc("PEM certificate chain to serve HTTPS with.", default="")
    tls_key: str = _doc("PEM private key of --tls-cert.", default="")
    client_ca: str = _doc(
        "PEM CA bundle: when set, only clients with a certificate it signed are served (mTLS).", default=""
    )
    tls_reload_interval: float = _doc(
        "Seconds between checks of --tls-cert, --tls-key and --client-ca for new contents (a mounted Secret "
        "changes by a symlink swap, without file events); new handshakes get the new files, open connections "
        "keep theirs, and files that cannot be used are logged and the previous ones kept.",
        default=10.0,
    )
    insecure_http: bool = _doc(
        "Serve plain HTTP instead of HTTPS (logged as a warning; tests and demos only).", default=False
    )
    max_body_bytes: int = _doc("Largest request body accepted; larger ones get 413.", default=32 * 1024 * 1024)
    max_connections: int = _doc(
        "Open connections on the verbs' port at most; one more is closed at once, logged and counted.", default=512
    )
    health_max_connections: int = _doc("Open connections on the health port at most.", default=HEALTH_MAX_CONNECTIONS)
    header_timeout: float = _doc(
        "Seconds from a request's first byte to the end of its head; a slower head gets 408 and is closed.",
        default=10.0,
    )
    body_timeout: float = _doc(
        "Seconds of grace for a request body, after which it must have come at --body-min-rate on average.",
        default=10.0,
    )
    body_min_rate: float = _doc("Bytes per second a request body must average after its grace.", default=1048576.0)
    idle_timeout: float = _doc("Seconds an idle keep-alive connection is kept (no byte resets it).", default=75.0)
    write_timeout: float = _doc(
        "Seconds a client may leave replies unread (above 64 KiB) before its connection is dropped.", default=30.0
    )
    handshake_timeout: float = _doc("Seconds a TLS handshake may take.", default=10.0)
    # -- the cache
    cluster: str = _doc(
        "File of Kubernetes Nodes and Pods (YAML or JSON) to serve from instead of an API server.", default=""
    )
    reservation_ttl: float = _doc(
        "Seconds a reservation waits for the API to show its pod bound before it is freed.", default=300.0
    )
    expiry_interval: float = _doc("Seconds between sweeps for expired reservations.", default=5.0)
    group_hold_ttl: float = _doc(
        "Seconds the GPUs held for a job placed whole (a Kueue pod group) wait for all its members' binds before "
        "they are let go together and the job is planned again.",
        default=GROUP_HOLD_TTL,
    )
    # -- the API server (when --cluster is not given)
    kubeconfig: str = _doc(
        "Kubeconfig to reach the API server; when empty: the in-cluster service account, else $KUBECONFIG, "
        "else ~/.kube/config.",
        default="",
    )
    kube_context: str = _doc("Context of the kubeconfig to use (default: its current-context).", default="")
    api_timeout: float = _doc("Seconds to wait for one API request (watches excepted).", default=10.0)
    list_page_size: int = _doc("Objects per page when listing nodes and pods.", default=500)
    watch_timeout: float = _doc(
        "Seconds a watch lasts before it is renewed (jittered up to twice this, as client-go does).", default=300.0
    )
    watch_inactivity: float = _doc(
        "Seconds without a byte on a watch before it is opened again from where it was, logged at debug (the API "
        "sends nothing, not even a bookmark, while the watched resource does not change): a server that is "
        "gone fails the new request.",
        default=120.0,
    )
    # -- leader election
    leader_elect: bool = _doc(
        "Elect a leader with a Lease: only the leader is ready and binds, standbys keep a warm cache.", default=True
    )
    lease_name: str = _doc("Name of the Lease.", default="gpu-extender")
    lease_namespace: str = _doc(
        "Namespace of the Lease; empty: the service account's namespace in a pod, else the kubeconfig context's.",
        default="",
    )
    lease_duration: float = _doc(
        "Seconds a standby waits after the leader's last renewal before taking over.", default=15.0
    )
    renew_deadline: float = _doc("Seconds the leader keeps trying to renew before it stops leading.", default=10.0)
    retry_period: float = _doc("Seconds between tries to take or renew the Lease.", default=2.0)
    identity: str = _doc(
        "This replica's name in the Lease and in Events; empty: hostname and a random suffix.", default=""
    )
    pod_name: str = _doc(
        "This replica's own pod, in the Lease's namespace (from the downward API). When set, the leader labels it "
        "gpu-extender.io/leader=true and every other replica removes that label, so a Service selecting it "
        "sends kube-scheduler to the leader alone while every replica with a full cache is Ready (/synced); and "
        "an annotation on it asks kube-scheduler to retry pods refused while the cache was behind.",
        default="",
    )
    # -- the device plugin
    protocol: Protocol = _doc(
        "The node-side device plugin served: gpushare (aliyun.com/gpu-mem, the settings below) or hami (HAMi's "
        "device plugin: nvidia.com/gpu, gpumem, gpumem-percentage, gpucores, and its node lock).",
        default=Protocol.GPUSHARE,
    )
    hami_default_memory: int = _doc(
        "hami: MiB per GPU for a container asking neither nvidia.com/gpumem nor a percentage (0: the whole GPU).",
        default=0,
    )
    hami_default_cores: int = _doc("hami: % compute per GPU for a container asking no nvidia.com/gpucores.", default=0)
    hami_memory_factor: int = _doc("hami: MiB that one unit of nvidia.com/gpumem stands for.", default=1)
    hami_topology_all: bool = _doc(
        "hami: give every container asking several GPUs the best-linked set (hami.io/node-nvidia-score), as if "
        "its pod asked the topology-aware GPU policy; off: only pods that ask it.",
        default=False,
    )
    node_lock_timeout: float = _doc(
        "hami: seconds after which the device plugin's node lock counts as abandoned and is taken over "
        "(HAMi's --node-lock-timeout).",
        default=300.0,
    )
    # -- the gpushare device plugin's profile
    memory_resource: str = _doc(
        "Resource holding GPU memory (node total, pod demand).", default=_PROFILE.memory_resource
    )
    count_resource: str = _doc(
        "Resource holding the GPU count of a node (and, on a pod, how many GPUs it spans).",
        default=_PROFILE.count_resource,
    )
    memory_unit: str = _doc("How messages name one unit of --memory-resource.", default=_PROFILE.memory_unit)
    index_annotation: str = _doc("Pod annotation: device index.", default=_PROFILE.index_annotation)
    pod_memory_annotation: str = _doc(
        "Pod annotation: memory given to the pod.", default=_PROFILE.pod_memory_annotation
    )
    device_memory_annotation: str = _doc(
        "Pod annotation: memory of the device.", default=_PROFILE.device_memory_annotation
    )
    assigned_annotation: str = _doc(
        'Pod annotation: assigned flag (we write "false").', default=_PROFILE.assigned_annotation
    )
    assume_time_annotation: str = _doc(
        "Pod annotation: decision time, Unix nanoseconds.", default=_PROFILE.assume_time_annotation
    )
    indexes_annotation: str = _doc(
        "Pod annotation: all device indexes, comma-separated.", default=_PROFILE.indexes_annotation
    )
    node_annotation: str = _doc("Pod annotation: the node reserved on.", default=_PROFILE.node_annotation)
    node_devices_annotation: str = _doc(
        "Node annotation: JSON list of devices overriding capacity.", default=_PROFILE.node_devices_annotation
    )
    model_label: str = _doc(
        "Node label naming its GPU model (gpushare; GPU feature discovery's by default, ACK's is "
        "aliyun.accelerator/nvidia_name): pods restricted to models by node affinity on it are placed knowing "
        "which GPUs they can use. Empty: models unknown.",
        default=_PROFILE.model_label,
    )
    gpushare_several_gpus: SeveralGpus = _doc(
        "gpushare: what becomes of a pod asking several GPUs (--count-resource above 1): refuse (at filter on every "
        "node, as unresolvable, and at bind), or bind (placed, its GPUs recorded in --indexes-annotation alone) for a "
        "node side of one's own that reads that annotation. Refused by default: the gpushare device plugin gives a pod "
        "one GPU at most, reading ALIYUN_COM_GPU_MEM_IDX alone, so such a pod's container would start without a GPU "
        "(under NVIDIA's runtime, not at all) and, never marked assigned, every later pod of its size on the node "
        "would be matched to it and get no GPU.",
        default=_PROFILE.several_gpus,
    )
    # -- quotas
    resource_quotas: bool = _doc(
        "Hold each namespace to the GPU keys of its ResourceQuotas, counted on what its pods are given, per GPU "
        "model too: HAMi's limits.nvidia.com/gpumem and gpucores, limits.<memory or GPU resource>[.<model>] "
        "(docs/operations/quotas.md). False: ResourceQuotas are not read.",
        default=True,
    )
    # -- jobs
    pod_groups: bool = _doc(
        "Watch the PodGroups of scheduler-plugins' coscheduling (scheduling.x-k8s.io) and of Volcano "
        "(scheduling.volcano.sh) where their CRDs are installed, and place their pods' jobs whole "
        "(docs/how-it-works/jobs.md). False: PodGroups are not read and pods naming one are placed as any pod; "
        "Kueue's pod groups are placed whole either way.",
        default=True,
    )
    quota_metrics_limit: int = _doc(
        "The most quota limits exported as series of their own on /metrics (2 each); beyond it only their count.",
        default=1000,
    )
    # -- policy
    placement: Policy = _doc(
        "How nodes and GPUs are chosen: fragmentation (where the GPU capacity left unusable for the pods the "
        "cluster runs grows least) or fill (by --node-strategy and --device-strategy).",
        default=Policy.FRAGMENTATION,
    )
    narrowing: Narrowing = _doc(
        "With --placement fragmentation, what the filter passes of the nodes that fit: best (the one best node; "
        "kube-scheduler then binds there without scoring), ties (every node as good as the best; kube-scheduler's "
        "scores choose) or off (every node that fits; our prioritize scores them 0-10).",
        default=Narrowing.BEST,
    )
    fragmentation_tolerance: float = _doc(
        "With --placement fragmentation, GPUs of added fragmentation within which a node counts as good as the best.",
        default=0.0,
    )
    cpu_pods: CpuPods = _doc(
        "With --placement fragmentation, whether scheduler-config sends the pods that ask no GPU through the "
        "extender too, so their cpu goes where it strands the least GPU (where that is equal, kube-scheduler's own "
        "scores choose): on (every pod through the one extender entry), off, or auto: on for a scheduler of its "
        "own (--scheduler-name other than default-scheduler); for the default scheduler, which also places the "
        "extender's own pods and the cluster's system pods, through a second extender entry that only filters "
        "and is ignorable, so they never wait for an extender that is down.",
        default=CpuPods.AUTO,
    )
    nodes_to_score: int = _doc(
        "scheduler-config's percentageOfNodesToScore: 0 leaves kube-scheduler's adaptive share (about 40 % of "
        "1,000 nodes, 10 % of 5,000: on the trace it placed as well as every node, at a third less CPU per pod); "
        "100 lets the extender see every node that fits.",
        default=0,
    )
    workload_half_life: float = _doc(
        "Seconds after which a pod seen weighs half in the learned workload the fragmentation policy places for.",
        default=HALF_LIFE,
    )
    node_strategy: Strategy = _doc(
        "With --placement fill, node scoring: binpack (fill the fullest node) or spread.", default=Strategy.BINPACK
    )
    device_strategy: Strategy = _doc(
        "With --placement fill, device choice: binpack (fullest GPU that fits) or spread.", default=Strategy.BINPACK
    )
    node_weight: int = _doc("With --placement fill, weight of node fill in a node's score.", default=1)
    device_weight: int = _doc("With --placement fill, weight of the chosen GPUs' fill in a node's score.", default=1)
    # -- how kube-scheduler reaches us (scheduler-config)
    url: str = _doc(
        "URL kube-scheduler calls us at (its urlPrefix).", default="https://gpu-extender.gpu-extender.svc:443"
    )
    http_timeout: float = _doc(
        "Seconds kube-scheduler waits for a reply (its httpTimeout). `serve` starts no write of a bind with less "
        "than a second of it left: kube-scheduler that stopped waiting may place other pods in the pod's room.",
        default=5.0,
    )
    weight: int = _doc("Weight kube-scheduler gives our prioritize scores (> 0).", default=5)
    ignorable: bool = _doc(
        "Let the scheduler go on when we are unreachable (pods would then bypass GPU checks).", default=False
    )
    scheduler_ca_file: str = _doc(
        "Path, on the scheduler, of the CA that signed our serving certificate.",
        default="/etc/kubernetes/gpu-extender/ca.crt",
    )
    scheduler_cert_file: str = _doc(
        "Path, on the scheduler, of its client certificate for mTLS.", default="/etc/kubernetes/gpu-extender/client.crt"
    )
    scheduler_key_file: str = _doc(
        "Path, on the scheduler, of its client key for mTLS.", default="/etc/kubernetes/gpu-extender/client.key"
    )
    scheduler_name: str = _doc(
        "The rendered profile's schedulerName (1.23 and later): gpu-scheduler for a second scheduler.",
        default="default-scheduler",
    )
    scheduler_kubeconfig: str = _doc(
        "clientConnection.kubeconfig of the rendered configuration (1.23 and later): with --config, kube-scheduler "
        "ignores its --kubeconfig flag, so one outside a pod's service account (kubeadm's static pod: "
        "/etc/kubernetes/scheduler.conf) needs it here. Empty: none (a pod's service account).",
        default="",
    )
    # -- metrics
    gpu_metrics: GpuSeries = _doc(
        "Per-GPU series on /metrics: auto (per GPU while the cache holds at most --gpu-metrics-limit GPUs, per "
        "node beyond), gpu, node (per node and cluster-wide only) or off (cluster-wide only).",
        default=GpuSeries.AUTO,
    )
    gpu_metrics_limit: int = _doc(
        "With --gpu-metrics auto, the most GPUs for which per-GPU series are exported (5 series each).",
        default=10_000,
    )
    # -- logging
    log_level: str = _doc("Logging level.", default="INFO")
    log_format: LogFormat = _doc("Log lines as text or JSON.", default=LogFormat.TEXT)

    @property
    def device_protocol(self) -> DeviceProtocol:
        """The protocol the cache reads nodes and pods with (`core/protocols/`)."""
        if self.protocol is Protocol.HAMI:
            return Hami(
                self.hami_default_memory, self.hami_default_cores, self.hami_memory_factor, self.hami_topology_all
            )
        return self.profile

    @property
    def profile(self) -> Profile:
        named = {field.name: getattr(self, field.name) for field in dataclasses.fields(Profile) if field.name in _NAMED}
        return Profile(**named, several_gpus=self.gpushare_several_gpus)

    @property
    def policy(self) -> PolicyConfig:
        return PolicyConfig(
            node_strategy=self.node_strategy,
            device_strategy=self.device_strategy,
            node_weight=self.node_weight,
            device_weight=self.device_weight,
            policy=self.placement,
            narrowing=self.narrowing,
            tolerance=self.fragmentation_tolerance,
        )

    @property
    def lease_timings(self) -> LeaseTimings:
        return LeaseTimings(self.lease_duration, self.renew_deadline, self.retry_period)

    @property
    def scheme(self) -> str:
        return "http" if self.insecure_http else "https"

    def check(self) -> Settings:
        """Refuse inconsistent combinations; returns self so it chains."""
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port {self.port} is out of range 0..65535")
        if not 0 <= self.health_port <= 65535:
            raise SettingsError(f"health_port {self.health_port} is out of range 0..65535")
        if self.health_port and self.health_port == self.port:
            raise SettingsError(f"health_port and port are both {self.port}: the health listener needs its own port")
        if not self.insecure_http and not (self.tls_cert and self.tls_key):
            raise SettingsError("HTTPS needs --tls-cert and --tls-key (or --insecure-http for plain HTTP)")
        if self.insecure_http and self.client_ca:
            raise SettingsError("--client-ca needs HTTPS: drop --insecure-http")
        for name in (
            "max_connections",
            "health_max_connections",
            "header_timeout",
            "body_timeout",
            "body_min_rate",
            "idle_timeout",
            "write_timeout",
            "handshake_timeout",
            "reservation_ttl",
            "expiry_interval",
            "group_hold_ttl",
            "tls_reload_interval",
            "http_timeout",
            "max_body_bytes",
            "api_timeout",
            "list_page_size",
            "watch_timeout",
            "watch_inactivity",
            "retry_period",
            "node_lock_timeout",
            "hami_memory_factor",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        refusal = self.lease_timings.check()
        if refusal is not None:
            raise SettingsError(refusal)
        if self.hami_default_memory < 0 or not 0 <= self.hami_default_cores <= 100:
            raise SettingsError("hami_default_memory must be >= 0 and hami_default_cores between 0 and 100")
        if self.quota_metrics_limit < 0:
            raise SettingsError(f"quota_metrics_limit must be >= 0, not {self.quota_metrics_limit}")
        if self.weight <= 0:
            raise SettingsError(f"weight must be > 0, not {self.weight}")
        if self.node_weight < 0 or self.device_weight < 0 or self.node_weight + self.device_weight == 0:
            raise SettingsError("node_weight and device_weight must be >= 0 and not both 0")
        return self


def fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(Settings)


def flag(field: dataclasses.Field[Any]) -> str:
    return "--" + field.name.replace("_", "-")


def env_name(field: dataclasses.Field[Any]) -> str:
    return ENV_PREFIX + field.name.upper()


def load(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None, config: str = "", check: bool = True
) -> Settings:
    """Build (and unless `check=False`, check) the settings. `flags` maps field names to the flags given."""
    flags = flags or {}
    env = os.environ if env is None else env
    config = config or env.get(ENV_PREFIX + "CONFIG", "")
    from_file = read_config(config) if config else {}
    known = {field.name: field for field in fields()}
    unknown = sorted(set(from_file) - set(known))
    if unknown:
        raise SettingsError(f"config file {config}: unknown settings {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name, field in known.items():
        if name in flags and flags[name] is not None:
            values[name] = convert(field, flags[name], flag(field))
        elif env_name(field) in env:
            values[name] = convert(field, env[env_name(field)], env_name(field))
        elif name in from_file:
            values[name] = convert(field, from_file[name], f"{config}: {name}")
    built = Settings(**values)
    return built.check() if check else built
