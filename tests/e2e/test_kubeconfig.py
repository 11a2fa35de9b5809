"""Our client reaches a real kube-apiserver through each kind of kubeconfig users have: a token, a client
certificate, and an exec credential plugin. Its own control plane, started with a client CA (x509 client
certificates authenticate as their Common Name, as kubeadm's admin.conf does)."""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trustme
import yaml

from extender.sources.kube.client import KubeClient, Unauthorized
from extender.sources.kube.config import load_config
from tests.e2e.controlplane import EXTENDER_USER, ControlPlane, binaries_dir, missing_binaries

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client_ca(tmp_path_factory: pytest.TempPathFactory) -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, client_ca: trustme.CA) -> Iterator[ControlPlane]:
    binaries = binaries_dir()
    if missing_binaries(binaries):
        pytest.skip("e2e binaries missing (see tests/e2e/conftest.py: the session fixture says why)")
    workdir = tmp_path_factory.mktemp("kubeconfig-plane")
    ca_file = workdir / "client-ca.pem"
    client_ca.cert_pem.write_to_path(str(ca_file))
    control = ControlPlane(binaries, workdir, [f"--client-ca-file={ca_file}"])
    control.start()
    yield control
    control.stop()


def write_kubeconfig(path: Path, plane: ControlPlane, user: dict[str, Any]) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": plane.url, "certificate-authority": str(plane.ca_file)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "e2e", "user": "u", "namespace": "gpu-extender"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def nodes_listed(kubeconfig: Path) -> dict[str, Any]:
    async with KubeClient(load_config(str(kubeconfig))) as client:
        listed: dict[str, Any] = await client.get("/api/v1/nodes", {"limit": "1"})
        return listed


async def test_a_kubeconfig_with_a_token(plane: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", plane, {"token": plane.users["extender"].token})
    assert load_config(str(kubeconfig)).namespace == "gpu-extender"
    assert "items" in await nodes_listed(kubeconfig)


async def test_a_kubeconfig_with_a_wrong_token_is_unauthorized(plane: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", plane, {"token": "not-a-token"})
    with pytest.raises(Unauthorized, match="Unauthorized"):
        await nodes_listed(kubeconfig)


async def test_a_kubeconfig_with_a_client_certificate(
    plane: ControlPlane, client_ca: trustme.CA, tmp_path: Path
) -> None:
    issued = client_ca.issue_cert("gpu-extender.client", common_name=EXTENDER_USER)
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "client.crt"))
    issued.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    user = {"client-certificate": "client.crt", "client-key": "client.key"}  # relative to the kubeconfig
    assert "items" in await nodes_listed(write_kubeconfig(tmp_path / "kc", plane, user))


async def test_a_kubeconfig_with_an_exec_credential_plugin(plane: ControlPlane, tmp_path: Path) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": plane.users["extender"].token},
    }
    plugin = tmp_path / "get-token"
    plugin.write_text(f"#!{sys.executable}\nprint({orjson.dumps(credential).decode()!r})\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "args": []}}
    assert "items" in await nodes_listed(write_kubeconfig(tmp_path / "kc", plane, user))
