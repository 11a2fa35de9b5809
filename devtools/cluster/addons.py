"""What runs on the one-node cluster besides its daemons: the images (imported, since no registry is reachable),
CoreDNS and the device-plugin double's rights (addons.yaml), cert-manager (the install docs' prerequisite), and
the device-plugin double itself.

The images come from `image/node-images.sh`, which builds each from its source at a pinned version and lists them
in `<cache>/node-images/index` (one `name<TAB>archive` line each). They are imported into containerd's `k8s.io`
namespace under the names the manifests use, so `imagePullPolicy: IfNotPresent` finds them and nothing is pulled.

The device-plugin double (devtools/deviceplugin) runs on the host as a root process, as the real plugins run in a
privileged pod: it registers on kubelet's socket and kubelet calls its `Allocate`. One runs at a time, for the
protocol asked; `start_device_plugin` replaces the one running.
"""

from __future__ import annotations

import string
import sys
from collections.abc import Sequence
from pathlib import Path

from devtools.cluster import processes
from devtools.cluster.clients import api_get, ctr, kubectl
from devtools.cluster.layout import CLUSTER_DOMAIN, DNS_SERVICE_IP, NODE_NAME, REPOSITORY, Paths, cache_root
from devtools.cluster.processes import ClusterError

IMAGES_SCRIPT = REPOSITORY / "image" / "node-images.sh"
CERT_MANAGER_SCRIPT = REPOSITORY / "image" / "cert-manager.sh"
CERT_MANAGER_MANIFEST = cache_root() / "node-images" / "cert-manager" / "cert-manager.yaml"
"""cert-manager's install manifest, rendered from its own chart by image/cert-manager.sh."""
ADDONS = Path(__file__).with_name("addons.yaml")
REQUIRED = {
    "pause": "registry.k8s.io/pause:",
    "CoreDNS": "registry.k8s.io/coredns/coredns:",
    "kube-scheduler": "registry.k8s.io/kube-scheduler:",
    "the extender": "ghcr.io/gpu-extender/gpu-extender:",
    "the GPU pods' workload": "localhost/gpu-workload:",
    "cert-manager's controller": "quay.io/jetstack/cert-manager-controller:",
    "cert-manager's webhook": "quay.io/jetstack/cert-manager-webhook:",
    "cert-manager's CA injector": "quay.io/jetstack/cert-manager-cainjector:",
}
"""Each image the cluster needs, by the start of its name in the index."""
RESOURCES = {"gpushare": "aliyun.com/gpu-mem", "hami": "nvidia.com/gpu"}
"""What each protocol's device plugin advertises: the Node shows it once the plugin is registered."""
DEFAULT_GPUS = {
    "gpushare": REPOSITORY / "devtools" / "deviceplugin" / "gpus-gpushare.yaml",
    "hami": REPOSITORY / "devtools" / "deviceplugin" / "gpus-hami.yaml",
}


def images() -> dict[str, Path]:
    """The images image/node-images.sh and image/cert-manager.sh built (their `index` and `index-cert-manager`):
    name -> archive."""
    found: dict[str, Path] = {}
    for index in sorted((cache_root() / "node-images").glob("index*")):
        for line in index.read_text().splitlines():
            if "\t" in line:
                name, archive = line.split("\t", 1)
                found[name] = Path(archive)
    return found


def image_named(prefix: str) -> str:
    for name in images():
        if name.startswith(prefix):
            return name
    raise ClusterError(f"no image {prefix}* in {cache_root() / 'node-images' / 'index'}: run `bash {IMAGES_SCRIPT}`")


def missing_images() -> list[str]:
    built = images()
    problems = [
        f"no image for {what} ({prefix}*)"
        for what, prefix in REQUIRED.items()
        if not any(name.startswith(prefix) and archive.exists() for name, archive in built.items())
    ]
    if not CERT_MANAGER_MANIFEST.exists():
        problems.append(f"no {CERT_MANAGER_MANIFEST}")
    if problems:
        scripts = (
            f"`bash {IMAGES_SCRIPT.relative_to(REPOSITORY)}` and `bash {CERT_MANAGER_SCRIPT.relative_to(REPOSITORY)}`"
        )
        return [f"{'; '.join(problems)}: run {scripts} (make cluster does)"]
    return []


def import_images(paths: Paths) -> None:
    """Each archive once (one may carry several names), then check that containerd has every name."""
    built = images()
    for archive in sorted(set(built.values())):
        ctr(["images", "import", str(archive)])
    present = set(ctr(["images", "ls", "-q"]).stdout.split())
    absent = [f"{name} ({archive})" for name, archive in built.items() if name not in present]
    if absent:
        raise ClusterError(f"imported, but containerd has no image {', '.join(absent)}")


def apply(paths: Paths) -> None:
    """CoreDNS and the device plugin's rights; waits until CoreDNS is Available."""
    text = string.Template(ADDONS.read_text()).substitute(
        IMAGE=image_named(REQUIRED["CoreDNS"]), DOMAIN=CLUSTER_DOMAIN, DNS_SERVICE_IP=DNS_SERVICE_IP
    )
    kubectl(paths, "apply", "-f", "-", input_text=text)
    try:
        kubectl(paths, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s")
    except ClusterError as error:
        pods = kubectl(paths, "-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-dns")
        raise ClusterError(f"CoreDNS did not become Available: {error}\n{pods[-3000:]}") from None


def install_cert_manager(paths: Paths) -> None:
    """cert-manager as its docs install it (its chart's manifest), waited for until its webhook answers: the
    startupapicheck Job of the chart completes once a Certificate can be created."""
    kubectl(paths, "apply", "-f", str(CERT_MANAGER_MANIFEST))
    for deployment in ("cert-manager", "cert-manager-cainjector", "cert-manager-webhook"):
        kubectl(paths, "-n", "cert-manager", "rollout", "status", f"deployment/{deployment}", "--timeout=180s")
    kubectl(
        paths,
        "-n",
        "cert-manager",
        "wait",
        "--for=condition=complete",
        "job/cert-manager-startupapicheck",
        "--timeout=180s",
    )


def start_device_plugin(paths: Paths, protocol: str, gpus: Path | None = None, refuse: Sequence[str] = ()) -> None:
    """Start the device-plugin double of `protocol` (replacing the one running) and wait until the Node
    advertises its resource. `refuse`: pods (by name) whose Allocate it fails on purpose, as a plugin
    that cannot allocate does (HAMi's: a gRPC error, so kubelet fails the pod)."""
    if protocol not in RESOURCES:
        raise ClusterError(f"unknown protocol {protocol!r}: gpushare or hami")
    processes.stop(paths, "device-plugin")
    argv = [
        sys.executable,
        "-m",
        "devtools.deviceplugin",
        f"--protocol={protocol}",
        f"--node={NODE_NAME}",
        f"--kubeconfig={paths.kubeconfig('device-plugin')}",
        f"--gpus={gpus or DEFAULT_GPUS[protocol]}",
        f"--record={paths.state / 'device-plugin.jsonl'}",
        *(f"--refuse={pod}" for pod in refuse),
    ]
    resource = RESOURCES[protocol]

    def advertised() -> bool:
        # Registered by this start (its log since the start's header line says so: a resource advertised by an
        # earlier plugin may linger a moment on the Node), and the Node advertises it.
        log = (paths.logs / "device-plugin.log").read_text(errors="replace")
        if "registered" not in log.rsplit("\n==== ", 1)[-1]:
            return False
        found = api_get(paths, f"/api/v1/nodes/{NODE_NAME}")
        allocatable = (found or {}).get("status", {}).get("allocatable", {})
        return str(allocatable.get(resource, "0")) not in ("0", "")

    processes.start_and_wait(
        paths, "device-plugin", argv, advertised, f"registered (the Node advertises {resource})", in_node=False
    )
    (paths.state / "protocol").write_text(f"{protocol}\n")
