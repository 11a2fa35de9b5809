"""The one-node cluster's network: a namespace of its own with no way out, made by `up` and deleted whole by `down`.

    machine (host namespace)                 namespace gpu-extender (the node)
    gpux-host 10.249.0.1/30  <--- veth --->  gpux-node 10.249.0.2/30   the node's address: API server, kubelet
                                             gpux-br0  10.244.0.1/24   the pods' bridge (Debian's bridge CNI)
                                             gpux-svc  10.96.0.0/24    Services: what kube-proxy does not rewrite
                                                                       to a pod or the node is dropped here

The namespace has no default route, so a packet for any other address (a pod's DNS query for the machine's
resolver, an image pull, a masquerade) fails inside it with "network unreachable": nothing the cluster does reaches
an interface that leaves the machine. The host reaches the cluster only through the veth (the API at
10.249.0.2:6443). kube-proxy's iptables rules, the bridge and the veth live in the namespace, so deleting it
removes them all; the pods' own namespaces (made by containerd under `RUN`) are removed by `down` too.

Every command here runs Debian's `ip` (iproute2) and is idempotent where `down` needs it: a half-made network is
removed as well as a whole one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from devtools.cluster.layout import (
    BRIDGE,
    HOST_IP,
    HOST_VETH,
    NETNS,
    NODE_IP,
    NODE_VETH,
    POD_GATEWAY,
    SERVICE_CIDR,
    SERVICE_DEVICE,
    VETH_PREFIX,
)

NETNS_PATH = Path("/run/netns") / NETNS


class NetworkError(RuntimeError):
    """An `ip` or `sysctl` command failed; the message carries its output."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def in_node(*argv: str) -> list[str]:
    """`argv` run inside the node's namespace: its network only (nsenter, not `ip netns exec`, which would also
    give it a mount namespace of its own, hiding kubelet's volume mounts from containerd)."""
    return ["nsenter", f"--net={NETNS_PATH}", "--", *argv]


def exists() -> bool:
    return NETNS_PATH.exists()


def create() -> None:
    """The namespace, the veth pair, the bridge, the Services' device (a bridge with no port) and the sysctls
    kube-proxy and the bridge CNI need, all inside the namespace (the host's own settings are left alone)."""
    if exists():
        raise NetworkError(f"network namespace {NETNS} exists already: `make cluster-down` first")
    _run("ip", "netns", "add", NETNS)
    _run("ip", "link", "add", HOST_VETH, "type", "veth", "peer", "name", NODE_VETH, "netns", NETNS)
    _run("ip", "addr", "add", f"{HOST_IP}/{VETH_PREFIX}", "dev", HOST_VETH)
    _run("ip", "link", "set", HOST_VETH, "up")
    node = ("ip", "-n", NETNS)
    _run(*node, "link", "set", "lo", "up")
    _run(*node, "addr", "add", f"{NODE_IP}/{VETH_PREFIX}", "dev", NODE_VETH)
    _run(*node, "link", "set", NODE_VETH, "up")
    _run(*node, "link", "add", BRIDGE, "type", "bridge")
    _run(*node, "addr", "add", f"{POD_GATEWAY}/24", "dev", BRIDGE)
    _run(*node, "link", "set", BRIDGE, "up")
    # A bridge with no port drops all it is given (this kernel has no `dummy` device type).
    _run(*node, "link", "add", SERVICE_DEVICE, "type", "bridge")
    _run(*node, "link", "set", SERVICE_DEVICE, "up")
    _run(*node, "route", "add", SERVICE_CIDR, "dev", SERVICE_DEVICE)
    for setting in (
        "net.ipv4.ip_forward=1",  # pods to the node's address and to each other through the bridge's gateway
        "net.bridge.bridge-nf-call-iptables=1",  # kube-proxy sees pod-to-Service traffic that stays on the bridge
        "net.ipv4.conf.all.route_localnet=1",
        "net.ipv6.conf.all.disable_ipv6=1",  # one family: the node, pods and Services are IPv4 only
        "net.ipv6.conf.default.disable_ipv6=1",
    ):
        _run(*in_node("sysctl", "-q", "-w", setting))


def delete() -> None:
    """The namespace (and with it every interface and iptables rule in it) and the host's end of the veth."""
    _run("ip", "link", "del", HOST_VETH, check=False)
    if exists():
        _run("ip", "netns", "del", NETNS, check=False)


def pids_inside() -> list[int]:
    """The processes still in the node's namespace (`ip netns pids`): `down` stops them before deleting it."""
    if not exists():
        return []
    done = _run("ip", "netns", "pids", NETNS, check=False)
    return [int(word) for word in done.stdout.split() if word.isdigit()]
