"""The one-node cluster's clients, for the code that brings it up and checks it: the API as its admin, containerd's
own `ctr`, and the kubectl built beside the cluster's daemons. Each error names the call and what it answered."""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import orjson

from devtools.cluster.layout import CONTAINERD_SOCKET, Paths
from devtools.cluster.pki import api_url
from devtools.cluster.processes import ClusterError


def api_context(paths: Paths) -> ssl.SSLContext:
    """Verifies the API server against the cluster's CA."""
    return ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))


def admin_token(paths: Paths) -> str:
    for row in (paths.pki / "tokens.csv").read_text().splitlines():
        token, name = row.split(",")[:2]
        if name == "kubernetes-admin":
            return token
    raise ClusterError(f"no admin token in {paths.pki / 'tokens.csv'}")


def api_get(paths: Paths, path: str) -> dict[str, Any] | None:
    """GET an API path as the admin; None when it is not there (or the API does not answer)."""
    request = urllib.request.Request(api_url() + path, headers={"Authorization": f"Bearer {admin_token(paths)}"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=api_context(paths)) as answer:
            return dict(orjson.loads(answer.read()))
    except (OSError, urllib.error.URLError, orjson.JSONDecodeError):
        return None


def ctr(arguments: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """containerd's own client on this cluster's socket, in the namespace CRI uses (k8s.io)."""
    argv = ["ctr", f"--address={CONTAINERD_SOCKET}", "--namespace=k8s.io", *arguments]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def kubectl(paths: Paths, *arguments: str, input_text: str | None = None) -> str:
    """The cluster's kubectl as its admin; its output, or a ClusterError with what it said."""
    argv = [str(paths.binaries / "kubectl"), f"--kubeconfig={paths.kubeconfig('admin')}", *arguments]
    done = subprocess.run(argv, input=input_text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(arguments)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout
