"""The one-node cluster's credentials: one CA, the API server's serving certificate, its client certificate for
kubelet, the service-account signing key, and a static token per component.

Components authenticate with static tokens (`--token-auth-file`), each under the name and groups Kubernetes' own
RBAC and Node authorizer expect (`system:kube-scheduler`, `system:kube-controller-manager`, `system:kube-proxy`,
`system:node:<node>` in `system:nodes`), so the default roles apply as on a kubeadm cluster, without a client
certificate to issue per component. The API server reaches kubelet with a client certificate of the same CA,
which kubelet trusts (`authentication.x509.clientCAFile`). Pods get service-account tokens signed by `sa.key`.

Made once per cluster, by `up`, into `Paths.pki`; nothing here is ever sent anywhere but to the cluster's own
processes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from devtools.cluster.layout import API_PORT, API_SERVICE_IP, CLUSTER_DOMAIN, NODE_IP, NODE_NAME, Paths


@dataclass(frozen=True, slots=True)
class User:
    """A static-token identity: `key` names its kubeconfig (kubeconfig-<key>.yaml)."""

    key: str
    name: str
    groups: tuple[str, ...]


USERS = (
    User("admin", "kubernetes-admin", ("system:masters",)),
    User("scheduler", "system:kube-scheduler", ()),
    User("controller-manager", "system:kube-controller-manager", ()),
    User("proxy", "system:kube-proxy", ()),
    User("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
    # The device-plugin double runs on the host as the real plugins' DaemonSets would run in a pod: it gets their
    # rights (devtools/cluster/addons.py grants them), no more.
    User("device-plugin", "gpu-device-plugin", ()),
)


def api_url() -> str:
    return f"https://{NODE_IP}:{API_PORT}"


def write_pki(paths: Paths) -> None:
    """Every key, certificate, token file and kubeconfig of the cluster (overwriting an earlier cluster's)."""
    pki = paths.pki
    pki.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="gpu-extender one-node cluster")
    ca.cert_pem.write_to_path(str(pki / "ca.crt"))
    ca.private_key_pem.write_to_path(str(pki / "ca.key"))
    serving = ca.issue_cert(
        NODE_IP,
        API_SERVICE_IP,
        "127.0.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
        "localhost",
        common_name="kube-apiserver",
    )
    _write_pair(serving, pki / "apiserver")
    kubelet_client = ca.issue_cert(
        "kube-apiserver-kubelet-client", common_name="kube-apiserver-kubelet-client", organization_name="system:masters"
    )
    _write_pair(kubelet_client, pki / "apiserver-kubelet-client")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki / "sa.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (pki / "sa.pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    tokens = {user.key: secrets.token_hex(16) for user in USERS}
    rows = [f'{tokens[user.key]},{user.name},{user.name},"{",".join(user.groups)}"' for user in USERS]
    (pki / "tokens.csv").write_text("\n".join(rows) + "\n")
    for path in (pki / "tokens.csv", pki / "ca.key", pki / "sa.key"):
        path.chmod(0o600)
    for user in USERS:
        write_kubeconfig(paths.kubeconfig(user.key), user.key, tokens[user.key], pki / "ca.crt")


def _write_pair(issued: trustme.LeafCert, stem: Path) -> None:
    stem.with_suffix(".crt").write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(stem.with_suffix(".key")))
    stem.with_suffix(".key").chmod(0o600)


def write_kubeconfig(path: Path, user: str, token: str, ca_file: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpu-extender", "cluster": {"server": api_url(), "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "gpu-extender", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
