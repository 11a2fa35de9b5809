"""The schedulers users run today, through the same real replay as ours: `--peer NAME=DIR` (`make bench-placement`).

A peer is built from its public source, in a directory the user gives (nothing is fetched or built by
`make test`), with Go and the module proxy: `go build` of its command into the e2e tier's cache
(`~/.cache/gpu-extender/peers/`, one binary per source tree, by a digest of its Go files), once. It then runs
in place of `extender serve` in the real modes (`real.py`, `churn_real.py`): started against the run's control
plane, and wired into the run's kube-scheduler as its own docs say. The pods, the nodes, the timetable and the
figures are the run's, unchanged.

- **gpushare** (`gpushare-scheduler-extender`, AliyunContainerService, Go): measured at commit c0b6141 (its
  last on `master` when this was written, "update install.md (#206)", k8s 1.25 libraries). Obtain it with
  `git clone https://github.com/AliyunContainerService/gpushare-scheduler-extender && git -C
  gpushare-scheduler-extender checkout c0b6141`. Wired as `config/scheduler-policy-config.yaml` there says: one
  extender entry, `filter` and `bind` at `/gpushare-scheduler`, plain HTTP, `nodeCacheCapable: true`,
  `aliyun.com/gpu-mem` managed and not ignored by kube-scheduler, not ignorable; kube-scheduler's own scores
  choose among the nodes it passes. It reads the same node resources as ours (`aliyun.com/gpu-mem`, here 1000 a
  GPU, and `aliyun.com/gpu-count`) and writes the annotations gpushare's device plugin reads, which the run's end
  check reads too. It runs with the admin's kubeconfig (its own RBAC grants nodes, pods, bindings, configmaps,
  events) and `LOG_LEVEL=error`, its quietest.

- **hami** (`hami-scheduler`, HAMi's scheduler extender, `cmd/scheduler`, Go with cgo for go-nvml): measured at
  tag v2.10.0. Obtain it with `git clone https://github.com/Project-HAMi/HAMi && git -C HAMi checkout v2.10.0`.
  A run with it speaks HAMi's protocol (`hami.py`: its nodes registered as HAMi's device plugin registers them, the
  trace's shares as `nvidia.com/gpumem-percentage` and `nvidia.com/gpucores`, a double of the device plugin
  releasing each bind's node lock), and ours beside it runs with `--protocol hami`. Wired and started as its
  chart does with the admission webhook off (`HamiProcess`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from devtools.harness import free_port, stop_process

CACHE = Path(os.environ.get("GPU_EXTENDER_CACHE", Path.home() / ".cache" / "gpu-extender")) / "peers"
BUILD_TIMEOUT = 1200.0
"""Seconds for `go build` (the first build downloads the peer's modules)."""
START_TIMEOUT = 120.0
BACKOFF = 10.0
BACKOFF_MAX = 300.0
"""kubelet's restart back-off for a container that exits: 10 s, doubled per exit, at most 5 minutes."""
CHUNK = 1 << 16
"""Bytes read from a peer's output at most at once."""
TAIL_BYTES = 2 << 20
"""A peer's output is kept in its log file from this many bytes before its end (2 MiB), in whole reads."""


class PeerError(RuntimeError):
    """A peer could not be built or started (one line: what, and where its output is)."""


@dataclass(frozen=True, slots=True)
class PeerKind:
    """How to build one peer, find its source and wire it."""

    name: str
    module: str
    """The module line its go.mod must have: a directory of something else is refused."""
    command: str
    """The package `go build` makes the binary of."""
    obtain: str
    """How to get the source measured here."""
    protocol: str
    """The device protocol its nodes and pods speak (`trace.GPUSHARE` or `hami.HAMI`, by name)."""
    shown: str
    """How the pages name it: the program and the version measured."""
    cgo: bool = False
    """Whether it needs cgo to build (a C compiler): hami-scheduler links go-nvml."""


GPUSHARE = PeerKind(
    "gpushare",
    "github.com/AliyunContainerService/gpushare-scheduler-extender",
    "./cmd",
    "git clone https://github.com/AliyunContainerService/gpushare-scheduler-extender && "
    "git -C gpushare-scheduler-extender checkout c0b6141",
    "gpushare",
    "gpushare-scheduler-extender c0b6141",
)
HAMI = PeerKind(
    "hami",
    "github.com/Project-HAMi/HAMi",
    "./cmd/scheduler",
    "git clone https://github.com/Project-HAMi/HAMi && git -C HAMi checkout v2.10.0",
    "hami",
    "hami-scheduler v2.10.0",
    cgo=True,
)
PEERS = {kind.name: kind for kind in (GPUSHARE, HAMI)}


@dataclass(frozen=True, slots=True)
class Built:
    """A peer's binary, and what kind of peer it is."""

    kind: PeerKind
    binary: Path
    arguments: tuple[str, ...] = ()
    """Flags added to the ones it is run with (hami-scheduler's API client raised: `client_flags`)."""

    def process(self, workdir: Path, kubeconfig: Path) -> PeerProcess:
        kind = HamiProcess if self.kind is HAMI else GpushareProcess
        return kind(self.binary, workdir, kubeconfig, self.arguments)


def client_flags(qps: int) -> tuple[str, ...]:
    """hami-scheduler's API client raised to `qps` requests a second, bursts of twice that: its flags
    `--kube-qps` and `--kube-burst` (cmd/scheduler/main.go at v2.10.0), which its chart sets through
    `scheduler.extender.extraArgs`; as shipped, neither is set and client-go's 5 and 10 apply."""
    return (f"--kube-qps={qps}", f"--kube-burst={2 * qps}")


def parse(values: list[str]) -> dict[str, Path]:
    """`--peer NAME=DIR` values as {name: source directory}; a ValueError names what is wrong."""
    peers: dict[str, Path] = {}
    for value in values:
        name, _, directory = value.partition("=")
        if name not in PEERS or not directory:
            raise ValueError(f"--peer {value!r}: NAME=DIR, NAME one of {', '.join(PEERS)}")
        peers[name] = Path(directory).expanduser()
    return peers


def source_digest(source: Path) -> str:
    """A digest of the source tree's go.mod, go.sum and Go files (vendor/ and tests left out): a changed tree
    builds again."""
    digest = hashlib.sha256()
    files = [source / "go.mod", source / "go.sum"]
    files += sorted(
        path
        for path in source.rglob("*.go")
        if "vendor" not in path.relative_to(source).parts and not path.name.endswith("_test.go")
    )
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build(kind: PeerKind, source: Path, cache: Path = CACHE) -> Built:
    """The peer's binary, built from `source` unless already in the cache."""
    go_mod = source / "go.mod"
    if not go_mod.is_file():
        raise PeerError(f"{kind.name}: no go.mod in {source}; get the source with: {kind.obtain}")
    first = go_mod.read_text(errors="replace").splitlines()[:1]
    if first != [f"module {kind.module}"]:
        raise PeerError(f"{kind.name}: {go_mod} is not {kind.module}'s; get the source with: {kind.obtain}")
    binary = cache / f"{kind.name}-{source_digest(source)}"
    if binary.is_file():
        return Built(kind, binary)
    go = shutil.which("go")
    if go is None:
        raise PeerError(f"{kind.name}: building it needs Go (https://go.dev/dl/) and the module proxy")
    cache.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    try:
        done = subprocess.run(
            [go, "build", "-o", str(partial), kind.command],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            env=os.environ | {"CGO_ENABLED": "1" if kind.cgo else "0", "GOFLAGS": "-mod=mod -buildvcs=false"},
        )
    except subprocess.TimeoutExpired:
        raise PeerError(f"{kind.name}: go build took over {BUILD_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise PeerError(f"{kind.name}: go build failed in {source}: {tail}")
    partial.replace(binary)
    return Built(kind, binary)


class PeerProcess:
    """A peer on a loopback port, against the run's API server, restarted as kubelet would when it exits.
    Mutable: owns a process. Each peer says how it is started (`command`, `environment`), where kube-scheduler
    calls it (`url`) and how it is wired (`config`)."""

    name = "peer"
    """Its process's name, in messages and its log's file name."""

    def __init__(self, binary: Path, workdir: Path, kubeconfig: Path, arguments: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.arguments = arguments
        self.workdir = workdir
        self.log = workdir / f"{self.name}.log"
        self.kubeconfig = kubeconfig
        self.port = free_port()
        self.popen: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._tail: collections.deque[bytes] = collections.deque()
        self._kept = 0
        """Bytes in `_tail`."""
        self._bytes = 0
        """Bytes of output read, over every process of the peer."""
        self._since = 0
        """`_bytes` when its current process started: what `_why` reads comes after it."""
        self.crashes: list[str] = []
        """Why it exited, each time it did during the run (`revive`)."""
        self.exits: list[float] = []
        """When `revive` found it exited (`time.monotonic()`), each time, beside `crashes`."""
        self._restart_at: float | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        return [str(self.binary)]

    def environment(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def config(self, scheduler_name: str) -> str:
        raise NotImplementedError

    def settled(self, nodes: list[dict[str, object]]) -> str:
        """ "" once the peer has done what it does once at its start, given the Nodes as they are; else what it is
        still doing (the replay starts the pods after it, as a cluster's pods come long after its start)."""
        return ""

    @staticmethod
    def scheduler_config(scheduler_name: str, extender: dict[str, object]) -> str:
        """kube-scheduler's configuration (the v1 API kube-scheduler 1.34 reads): one profile, one extender."""
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": scheduler_name}],
            "extenders": [extender],
        }
        return yaml.safe_dump(config, sort_keys=False)

    def start(self) -> None:
        self._spawn()
        assert self.popen is not None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.popen.poll() is not None:
                self._write_log()
                raise PeerError(f"{self.name} exited with code {self.popen.returncode} at start; its log: {self.log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            if time.monotonic() > deadline:
                raise PeerError(f"{self.name} did not listen within {START_TIMEOUT:.0f} s; its log: {self.log}")
            time.sleep(0.2)

    def _spawn(self) -> None:
        self._since = self._bytes
        self.popen = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=os.environ | self.environment(),
        )
        self._reader = threading.Thread(target=self._read, args=(self.popen,), daemon=True)
        self._reader.start()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def revive(self) -> None:
        """What kubelet does for the peer's container when it exits during a run: note the crash (the last line
        of its output that says why), and start it again after a back-off of 10 s doubled per crash, at most
        5 minutes (CrashLoopBackOff), without waiting for it to listen. Meanwhile kube-scheduler's calls to it
        fail, as they would in a cluster. Call it often; it does nothing while the peer runs."""
        if self.running():
            return
        now = time.monotonic()
        if self._restart_at is None:
            if self._reader is not None:
                self._reader.join(timeout=5)
            self.crashes.append(self._why())
            self.exits.append(now)
            self._restart_at = now + min(BACKOFF * 2 ** (len(self.crashes) - 1), BACKOFF_MAX)
        elif now >= self._restart_at:
            self._restart_at = None
            self._spawn()

    def exited_at(self, elapsed: float) -> list[float]:
        """Seconds into the run at which each exit was found, the run having lasted `elapsed` seconds so far (on
        whichever clock the runner keeps): so a report can set the exits beside its curve over time."""
        start = time.monotonic() - elapsed
        return [round(at - start, 1) for at in self.exits]

    def _why(self) -> str:
        """Why its last process exited: its last line naming a fatal error or a panic, else its last line, from
        its own output (a crash before it may still be in the tail)."""
        kept = b"".join(self._tail)
        lines = kept[max(0, len(kept) - (self._bytes - self._since)) :].decode(errors="replace").splitlines()
        found = [line for line in lines if line.startswith(("fatal error:", "panic:"))]
        return (found or lines or [f"exit code {self.popen.returncode if self.popen else '?'}"])[-1][:200]

    def stop(self) -> None:
        if self.popen is not None:
            stop_process(self.popen)
        self._write_log()

    def _read(self, popen: subprocess.Popen[bytes]) -> None:
        """Keep the last `TAIL_BYTES` of its output (it writes lines for every pod and node even at its quietest
        level: hundreds of megabytes a minute on the trace), in the reads that brought them: a read may be a few
        bytes (a Go panic is written a frame at a time), so reads are dropped by their bytes, not their number."""
        assert popen.stdout is not None
        while chunk := popen.stdout.read1(CHUNK):
            self._tail.append(chunk)
            self._kept += len(chunk)
            self._bytes += len(chunk)
            while self._kept - len(self._tail[0]) >= TAIL_BYTES:
                self._kept -= len(self._tail.popleft())

    def _write_log(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
        kept = b"".join(self._tail)
        dropped = f"[{self._bytes - len(kept):,} earlier bytes not kept]\n".encode()
        self.log.write_bytes(dropped + kept)


class GpushareProcess(PeerProcess):
    """gpushare-scheduler-extender: its port and log level from the environment, as its Deployment sets them."""

    name = "gpushare-extender"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/gpushare-scheduler"

    def environment(self) -> dict[str, str]:
        return super().environment() | {"PORT": str(self.port), "LOG_LEVEL": "error"}

    def config(self, scheduler_name: str) -> str:
        """kube-scheduler's configuration with this extender wired as gpushare's own docs wire it
        (`config/scheduler-policy-config.yaml` at c0b6141, in the v1 API kube-scheduler 1.34 reads)."""
        extender = {
            "urlPrefix": self.url,
            "filterVerb": "filter",
            "bindVerb": "bind",
            "enableHTTPS": False,
            "nodeCacheCapable": True,
            "managedResources": [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}],
            "ignorable": False,
        }
        return self.scheduler_config(scheduler_name, extender)


HAMI_DEVICE_CONFIG = {
    "nvidia": {
        "resourceCountName": "nvidia.com/gpu",
        "resourceMemoryName": "nvidia.com/gpumem",
        "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
        "resourceCoreName": "nvidia.com/gpucores",
        "resourcePriorityName": "nvidia.com/priority",
        "overwriteEnv": False,
        "defaultMemory": 0,
        "defaultCores": 0,
        "defaultGPUNum": 1,
        "preConfiguredDeviceMemory": 0,
        "memoryFactor": 1,
        "deviceSplitCount": 10,
        "deviceMemoryScaling": 1,
        "deviceCoreScaling": 1,
        "enableNumaTopology": False,
        "gpuCorePolicy": "default",
        "libCudaLogLevel": 1,
        "runtimeClassName": "",
    }
}
"""The NVIDIA part of the device configuration HAMi's chart renders with its default values
(charts/hami/templates/scheduler/device-configmap.yaml and values.yaml at v2.10.0; the MIG allow-list left out:
these nodes have no MIG GPU)."""

HAMI_MANAGED = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
                "nvidia.com/priority")  # fmt: skip
"""The NVIDIA resources HAMi's chart hands to its extender, each ignored by kube-scheduler's own filters
(`hami-vgpu.scheduler.managedResources`, charts/hami/templates/_helpers.tpl at v2.10.0)."""


HANDSHAKE = "hami.io/node-handshake"


def _annotations(node: dict[str, object]) -> dict[str, str]:
    metadata = node.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}


class HamiProcess(PeerProcess):
    """hami-scheduler (HAMi v2.10.0's scheduler extender, `cmd/scheduler`) as its chart runs it beside
    kube-scheduler, with the admission webhook off (the replay sets each pod's scheduler itself): plain HTTP,
    the chart's default policies (nodes binpack, GPUs spread), its device configuration, no leader election (one
    replica), its metrics on a port of their own, and its API client at its defaults (5 requests a second, bursts
    of 10: the chart sets neither)."""

    name = "hami-scheduler"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        device_config = self.workdir / "hami-device-config.yaml"
        device_config.write_text(yaml.safe_dump(HAMI_DEVICE_CONFIG, sort_keys=False))
        return [
            str(self.binary),
            f"--http_bind=127.0.0.1:{self.port}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            "--node-scheduler-policy=binpack",
            "--gpu-scheduler-policy=spread",
            f"--device-config-file={device_config}",
            "--leader-elect=false",
            *self.arguments,
        ]

    def settled(self, nodes: list[dict[str, object]]) -> str:
        """hami-scheduler writes its handshake annotations on every node when it starts, one for each device
        type it knows (`hami.io/node-handshake` for NVIDIA, `-dcu`, `-xpu`, `-va`, `-biren`: each device's init
        at v2.10.0, e.g. pkg/device/nvidia/device.go:169), through a client of 5 requests a second: about 7
        minutes for 400 nodes, during which its filters wait behind them and time out (30 s). Settled when every
        node carries every such annotation any node carries, NVIDIA's among them."""
        keys = [{key for key in _annotations(node) if key.startswith(HANDSHAKE)} for node in nodes]
        every = set().union(*keys) if keys else set()
        waiting = sum(1 for found in keys if HANDSHAKE not in found or found != every)
        if not waiting:
            return ""
        return f"its handshake annotations on {waiting:,} of {len(nodes):,} nodes still to be written"

    def config(self, scheduler_name: str) -> str:
        """kube-scheduler's configuration as HAMi's chart renders it for Kubernetes 1.26 and later
        (charts/hami/templates/scheduler/configmap.yaml at v2.10.0, the webhook disabled: plain HTTP)."""
        extender = {
            "urlPrefix": self.url,
            "enableHTTPS": False,
            "filterVerb": "filter",
            "bindVerb": "bind",
            "nodeCacheCapable": True,
            "weight": 1,
            "httpTimeout": "30s",
            "managedResources": [{"name": name, "ignoredByScheduler": True} for name in HAMI_MANAGED],
        }
        return self.scheduler_config(scheduler_name, extender)
