"""Where the one-node cluster keeps everything, and the addresses it uses: one place, read by every other module.

The cluster lives in a network namespace of its own (`NETNS`). Inside it: the node's address (`NODE_IP`, one end
of a veth pair whose other end, `HOST_IP`, is the only way in from the machine), the pods' bridge (`POD_CIDR`),
and the Services' range (`SERVICE_CIDR`, routed to a dummy device so that what kube-proxy does not rewrite is
dropped there). The namespace has no default route: nothing the cluster sends, a pod's DNS query or an image
pull included, can leave the machine; every address below exists only inside this machine.

Files: `STATE` (certificates, tokens, kubeconfigs, etcd's data, containerd's images, every process's log and pid)
and `RUN` (sockets and containerd's state) belong to the cluster alone, and `KUBELET_ROOT` is kubelet's default
root (its device-plugin socket, /var/lib/kubelet/device-plugins/kubelet.sock, is a constant of kubelet's that
device plugins are written against). `make cluster-down` removes all three.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
K8S_MODULE = REPOSITORY / "tests" / "e2e" / "k8s"
"""The Go module that pins the Kubernetes release (its go.mod) and names the commands built (tools.go)."""

NETNS = "gpu-extender"
HOST_VETH = "gpux-host"
NODE_VETH = "gpux-node"
HOST_IP = "10.249.0.1"
NODE_IP = "10.249.0.2"
VETH_PREFIX = 30
BRIDGE = "gpux-br0"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
SERVICE_DEVICE = "gpux-svc"
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
API_PORT = 6443
NODE_NAME = "gpu-node"

STATE = Path(os.environ.get("GPU_EXTENDER_CLUSTER_STATE", "/var/lib/gpu-extender-cluster"))
RUN = Path(os.environ.get("GPU_EXTENDER_CLUSTER_RUN", "/run/gpu-extender-cluster"))
KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGIN_DIR = KUBELET_ROOT / "device-plugins"
CNI_BIN = Path("/usr/lib/cni")
"""Debian's containernetworking-plugins."""
CONTAINERD_SOCKET = RUN / "containerd.sock"
USE_LOCK = Path("/tmp/gpu-extender-cluster.lock")
"""Held (flock, exclusive) by whoever installs things on the cluster for a while (a test session of tests/node, a
bench): two at once would install into the same namespaces. `processes.cluster_lock()` takes it."""
ETC_KUBERNETES = Path("/etc/kubernetes")
"""kubeadm's folder: the scheduler's kubeconfig is at /etc/kubernetes/scheduler.conf, as wiring (b)'s docs assume.
Made (and removed by `down`) only when the machine has none: `ETC_MARKER` says the cluster made it."""
ETC_MARKER = ETC_KUBERNETES / ".made-by-gpu-extender-cluster"


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release required in tests/e2e/k8s/go.mod, e.g. "v1.34.1"."""
    requirement = r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\d+\.\d+\.\d+)\s*$"
    match = re.search(requirement, (K8S_MODULE / "go.mod").read_text(), re.M)
    if match is None:
        raise RuntimeError(f"no k8s.io/kubernetes requirement in {K8S_MODULE / 'go.mod'}")
    return match.group(1)


def cache_root() -> Path:
    """${GPU_EXTENDER_CACHE:-~/.cache/gpu-extender}: where tests/e2e/build.sh and image/node-images.sh build."""
    return Path(os.environ.get("GPU_EXTENDER_CACHE") or Path.home() / ".cache" / "gpu-extender")


@dataclass(frozen=True, slots=True)
class Paths:
    """The files of one cluster, under `STATE`."""

    state: Path = STATE
    run: Path = RUN

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def config(self) -> Path:
        return self.state / "config"

    def kubeconfig(self, user: str = "admin") -> Path:
        return self.state / f"kubeconfig-{user}.yaml"

    @property
    def binaries(self) -> Path:
        return cache_root() / f"k8s-{kubernetes_version()}"
