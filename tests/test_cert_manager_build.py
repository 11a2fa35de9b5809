"""image/cert-manager.sh: what it pins and names without building anything (what it does without root, or with an
action it does not know, is image/lib.sh's: tests/test_image_lib.py); and, once it has built cert-manager
(as root, into the cache), that the commands inside its images work against a real kube-apiserver (the v1.34.1 of
tests/e2e/build.sh): the rendered manifest applies, `ctl check api` passes (what the chart's startupapicheck job
runs), the webhook, called by the API server with the CA that cainjector injected, refuses an invalid Certificate,
and the certificates of manifests/cert-manager/ become Ready.

Out of cluster: the commands run here with an admin kubeconfig, and the webhook configurations are patched to call
the webhook on localhost; pods, the webhook's Service and kube-proxy are devtools/cluster's to test. Skipped when
the script has not built cert-manager yet, or tests/e2e/build.sh has not built kubectl and the control plane.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.harness import stop_process
from tests.e2e.controlplane import ControlPlane, binaries_dir, free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "image" / "cert-manager.sh"
TEXT = SCRIPT.read_text()
COMMANDS = ("controller", "webhook", "cainjector", "ctl")


def cache_root() -> Path:
    return Path(os.environ.get("GPU_EXTENDER_CACHE") or Path.home() / ".cache" / "gpu-extender")


def pinned(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", TEXT, re.M)
    assert match, f"no {name}= line in {SCRIPT}"
    return match.group(1)


def test_the_pin_is_a_release_and_the_commit_of_its_tag() -> None:
    assert re.fullmatch(r"v1\.\d+\.\d+", pinned("version"))
    assert re.fullmatch(r"[0-9a-f]{40}", pinned("commit"))


def test_images_are_named_as_the_chart_names_them() -> None:
    for command, repository in (
        ("controller", "cert-manager-controller"),
        ("webhook", "cert-manager-webhook"),
        ("cainjector", "cert-manager-cainjector"),
        ("ctl", "cert-manager-ctl"),  # startupapicheck.image in v1.11's values.yaml
    ):
        assert f"[{command}]=quay.io/jetstack/{repository}\n" in TEXT


# ---- The built images against a real API server --------------------------------------------------------------


def built_archives() -> dict[str, Path]:
    """Each command's docker-archive, from the index the script wrote ({} when it has not run)."""
    index = cache_root() / "node-images" / "index-cert-manager"
    if not index.exists():
        return {}
    archives = {}
    for line in index.read_text().splitlines():
        name, archive = line.split("\t")
        repository, tag = name.rsplit(":", 1)
        assert tag == pinned("version"), line
        archives[repository.removeprefix("quay.io/jetstack/cert-manager-")] = Path(archive)
    return archives


def extract_command(archive: Path, command: str, into: Path) -> Path:
    """/app/cmd/<command>/<command> out of the image's layers (no root, no container runtime needed)."""
    member = f"app/cmd/{command}/{command}"
    with tarfile.open(archive) as image:
        manifest = image.extractfile("manifest.json")
        assert manifest is not None
        for layer_name in reversed(json.load(manifest)[0]["Layers"]):
            layer = image.extractfile(layer_name)
            assert layer is not None
            with tarfile.open(fileobj=layer) as files:
                if member in files.getnames():
                    source = files.extractfile(member)
                    assert source is not None
                    target = into / command
                    target.write_bytes(source.read())
                    target.chmod(0o755)
                    return target
    raise AssertionError(f"no {member} in {archive}")


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    archives = built_archives()
    if sorted(archives) != sorted(COMMANDS):
        pytest.skip(
            f"cert-manager not built (run `sudo bash {SCRIPT.relative_to(ROOT)}`); index has {sorted(archives)}"
        )
    into = tmp_path_factory.mktemp("cert-manager-bin")
    return {command: extract_command(archives[command], command, into) for command in COMMANDS}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries = binaries_dir()
    missing = [name for name in ("etcd", "kube-apiserver", "kubectl") if not (binaries / name).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not built (run `bash tests/e2e/build.sh`)")
    control_plane = ControlPlane(binaries, tmp_path_factory.mktemp("cert-manager-plane"))
    control_plane.start()
    yield control_plane
    control_plane.stop()


def test_cert_manager_issues_our_certificates_against_kube_apiserver(
    commands: dict[str, Path], plane: ControlPlane, tmp_path: Path
) -> None:
    kubeconfig = str(plane.kubeconfig("admin"))

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(plane.binaries / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
        )

    manifest = cache_root() / "node-images" / "cert-manager" / "cert-manager.yaml"
    applied = kubectl("apply", "--server-side", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    port = free_port()
    for kind, path in (("validatingwebhookconfiguration", "/validate"), ("mutatingwebhookconfiguration", "/mutate")):
        patch = [
            {"op": "replace", "path": "/webhooks/0/clientConfig", "value": {"url": f"https://localhost:{port}{path}"}}
        ]
        patched = kubectl("patch", kind, "cert-manager-webhook", "--type=json", f"-p={json.dumps(patch)}")
        assert patched.returncode == 0, patched.stderr

    processes: list[subprocess.Popen[bytes]] = []
    logs: dict[str, Path] = {}

    def start(command: str, *args: str) -> None:
        logs[command] = tmp_path / f"{command}.log"
        with logs[command].open("wb") as log:
            argv = [str(commands[command]), f"--kubeconfig={kubeconfig}", "--v=2", *args]
            processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def tails() -> str:
        return "\n".join(f"--- {name}:\n" + "\n".join(log.read_text().splitlines()[-15:]) for name, log in logs.items())

    try:
        start("cainjector", "--leader-elect=false")
        start(
            "webhook",
            f"--secure-port={port}",
            f"--healthz-port={free_port()}",
            "--dynamic-serving-ca-secret-namespace=cert-manager",
            "--dynamic-serving-ca-secret-name=cert-manager-webhook-ca",
            "--dynamic-serving-dns-names=localhost",
        )
        start("controller", "--leader-elect=false", "--cluster-resource-namespace=cert-manager")
        check = subprocess.run(
            [str(commands["ctl"]), "check", "api", f"--kubeconfig={kubeconfig}", "--wait=2m"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert check.returncode == 0, check.stdout + check.stderr + tails()
        assert "The cert-manager API is ready" in check.stdout

        # The gpu-extender namespace is there: ControlPlane makes it.
        ours = kubectl("apply", "-k", str(ROOT / "manifests" / "cert-manager"))
        assert ours.returncode == 0, ours.stderr
        ready = kubectl("wait", "-n", "gpu-extender", "--for=condition=Ready", "certificate", "--all", "--timeout=120s")
        assert ready.returncode == 0, ready.stdout + ready.stderr + tails()
        secrets = kubectl("get", "-n", "gpu-extender", "secrets", "-o", "jsonpath={.items[*].metadata.name}")
        assert set(secrets.stdout.split()) >= {"gpu-extender-ca", "gpu-extender-tls", "gpu-extender-scheduler-client"}

        invalid = {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": "invalid", "namespace": "gpu-extender"},
            "spec": {"secretName": "invalid", "issuerRef": {"name": "gpu-extender-ca"}},
        }
        refused = kubectl("create", "-f", "-", stdin=json.dumps(invalid))
        assert refused.returncode != 0
        assert 'admission webhook "webhook.cert-manager.io" denied the request' in refused.stderr
    finally:
        for process in reversed(processes):
            stop_process(process)
