"""What each daemon of the one-node cluster is started with: its command line and the configuration files it reads.

The settings are those of a kubeadm node where they matter to what runs on it (the same resources, the same RBAC
identities, CoreDNS at the tenth Service address, the pods' CNI on a bridge), and differ where this machine asks:
- cgroups v1 through cgroupfs (`cgroupDriver: cgroupfs`, containerd's `SystemdCgroup = false`): no systemd here;
- eviction thresholds of 1 %, so a nearly full disk on a test machine does not evict the pods under test (the
  defaults are 10 % and 15 %); image garbage collection at 100 %, so the images imported here (no registry can
  give them back) are never removed;
- kubelet's `resolvConf` is an empty file: pods resolve through CoreDNS alone, which forwards nothing;
- kubelet authenticates the API server by its client certificate and authorises every authenticated caller
  (no webhook round trip for `kubectl logs` and `exec`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from devtools.cluster.layout import (
    API_PORT,
    BRIDGE,
    CLUSTER_DOMAIN,
    CNI_BIN,
    CONTAINERD_SOCKET,
    DNS_SERVICE_IP,
    KUBELET_ROOT,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    POD_GATEWAY,
    SERVICE_CIDR,
    Paths,
)

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
"""The sandbox image kubeadm v1.34 pins, its PauseVersion; image/node-images.sh builds it from kubernetes' pause.c."""


def etcd(paths: Paths) -> list[str]:
    binary = str(paths.binaries / "etcd")
    argv = [
        binary,
        "--name=gpu-node",
        f"--data-dir={paths.state / 'etcd'}",
        "--listen-client-urls=http://127.0.0.1:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=gpu-node=http://127.0.0.1:2380",
        "--log-level=warn",
    ]
    # Debian's etcd 3.4 has no --unsafe-no-fsync (3.5 added it): passed only when the binary lists it.
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, check=False)
    if "--unsafe-no-fsync" in help_text.stdout + help_text.stderr:
        argv.append("--unsafe-no-fsync")
    return argv


def apiserver(paths: Paths) -> list[str]:
    pki = paths.pki
    return [
        str(paths.binaries / "kube-apiserver"),
        "--etcd-servers=http://127.0.0.1:2379",
        "--bind-address=0.0.0.0",
        f"--advertise-address={NODE_IP}",
        f"--secure-port={API_PORT}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager(paths: Paths) -> list[str]:
    kubeconfig = paths.kubeconfig("controller-manager")
    return [
        str(paths.binaries / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--service-account-private-key-file={paths.pki / 'sa.key'}",
        f"--root-ca-file={paths.pki / 'ca.crt'}",
        "--use-service-account-credentials=true",
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def scheduler(paths: Paths, config: Path | None = None) -> list[str]:
    """The cluster's default scheduler; with `config`, started with that KubeSchedulerConfiguration as given (the
    default scheduler's wiring of the extender: the file names its kubeconfig, /etc/kubernetes/scheduler.conf), and
    resolving names through the cluster's DNS, as a static pod with `dnsPolicy: ClusterFirstWithHostNet` does (in a
    mount namespace of its own where /etc/resolv.conf is the cluster's: the host's stays as it is)."""
    kubeconfig = paths.kubeconfig("scheduler")
    argv = [
        str(paths.binaries / "kube-scheduler"),
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--profiling=false",
        "--v=1",
    ]
    if config is None:
        return [*argv, f"--kubeconfig={kubeconfig}", "--leader-elect=false"]
    resolv = paths.config / "resolv-cluster-first.conf"
    resolv.write_text(
        f"search kube-system.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
        f"nameserver {DNS_SERVICE_IP}\noptions ndots:5\n"
    )
    with_cluster_dns = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", with_cluster_dns, str(resolv), *argv, f"--config={config}",
    ]  # fmt: skip


def containerd(paths: Paths) -> list[str]:
    """containerd with its own root, state and socket (never the host's /var/lib/containerd), and CRI's CNI
    pointed at this cluster's configuration; pods' network namespaces are mounted under its state directory."""
    cni_conf = paths.config / "cni"
    cni_conf.mkdir(parents=True, exist_ok=True)
    (cni_conf / "10-gpu-extender.conflist").write_text(json.dumps(cni_config(), indent=2) + "\n")
    config = f"""version = 2
root = "{paths.state / "containerd"}"
state = "{paths.run / "containerd"}"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  # This machine gives root no CAP_SYS_RESOURCE, so an oom_score_adj below containerd's own (kubelet asks -998
  # for sandboxes, -997 for Guaranteed pods) fails every container; raise such values to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""
    path = paths.config / "containerd.toml"
    path.write_text(config)
    return ["containerd", f"--config={path}"]


def cni_config() -> dict[str, object]:
    """The pods' network: Debian's bridge plugin on the bridge `network.create` made, addresses from host-local,
    no masquerade (nothing is to leave the node's namespace), portmap for hostPort."""
    return {
        "cniVersion": "1.0.0",
        "name": "gpu-extender",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet(paths: Paths) -> list[str]:
    resolv = paths.config / "resolv.conf"
    resolv.write_text("# pods resolve through the cluster's DNS alone (kubelet's clusterDNS)\n")
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(paths.pki / "ca.crt")},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv),
        "failSwapOn": False,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "maxPods": 110,
    }
    path = paths.config / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return [
        str(paths.binaries / "kubelet"),
        f"--config={path}",
        f"--kubeconfig={paths.kubeconfig('kubelet')}",
        f"--root-dir={KUBELET_ROOT}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    ]


def proxy(paths: Paths) -> list[str]:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(paths.kubeconfig("proxy"))},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": NODE_NAME,
        "healthzBindAddress": f"{NODE_IP}:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # NodePorts on every address of the node, 127.0.0.1 included (kube-proxy's default, and kubeadm's): what
        # gpushare-scheduler-extender's install relies on (kube-scheduler calls it at 127.0.0.1:32766).
        "nodePortAddresses": [],
        # Leave the conntrack table's size and timeouts as the kernel has them (some are not the namespace's).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    path = paths.config / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return [str(paths.binaries / "kube-proxy"), f"--config={path}", "--v=1"]
