"""The install paths, walked on a real node: the commands of the docs, read from the pages and run as written, the
image names aside (the images are built here and imported, see image/node-images.sh), ending with the example GPU
pod Running on the node, its container started by containerd with the environment the device plugin gave it at
kubelet's `Allocate`, and `extender inspect` showing it on its GPU.

Each test installs, checks and uninstalls with the pages' own commands, so the next one starts from a node with
nothing of ours on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster.layout import REPOSITORY, kubernetes_version
from tests.node.operator import Operator, commands, commands_in

DOCS = REPOSITORY / "docs"
README = REPOSITORY / "README.md"
EXAMPLES = REPOSITORY / "manifests" / "examples"
WORKLOAD_IMAGE = "localhost/gpu-workload:1"
"""Stands for the examples' nvidia/cuda image (no registry here, no GPU): busybox, and an `nvidia-smi` that prints
the GPU environment the device plugin gave the container (image/node-images.sh)."""


def example_pod(operator: Operator, manifest: Path) -> dict[str, Any]:
    """Apply an example pod, its image replaced by the workload image, and wait until it is Running."""
    pod = yaml.safe_load(manifest.read_text())
    for container in pod["spec"]["containers"]:
        container["image"] = WORKLOAD_IMAGE
    operator.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pod))
    name = pod["metadata"]["name"]
    operator.wait(lambda: operator.pod_phase(name) == "Running", f"the example pod {name} Running")
    return dict(operator.get("pod", name))


def container_environment(operator: Operator, pod: str) -> dict[str, str]:
    """What the container's `nvidia-smi` printed: the GPU environment it was started with."""
    log = operator.wait(lambda: operator.kubectl("logs", pod, check=False), f"{pod}'s log")
    return dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", log, re.M))


def inspect_output(operator: Operator) -> str:
    """check.md's `extender inspect` through a port-forward to the leader, run as the page gives it."""
    block = next(block for block in commands(DOCS / "install" / "check.md") if "extender inspect" in block)
    script = f"cd \"$(mktemp -d)\"\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{block}"
    # The port-forward needs a moment before inspect can connect: the page's user waits for its "Forwarding" line.
    wait = "for _ in $(seq 50); do grep -q Forwarding pf.log && break; sleep 0.2; done"
    script = script.replace(" 8443:8443 &\n", f" 8443:8443 >pf.log 2>&1 &\n{wait}\n")
    return operator.run(script)


def readme_block(heading: str) -> str:
    """The README's first sh block under `heading` (a bold lead such as **With Helm**, or a heading)."""
    text = README.read_text()
    at = text.index(heading)
    return commands_in(text[at:])[0]


def gpu_share_demo_runs_on_its_gpu(cluster: Operator) -> None:
    """The README's example pod for wiring (a), placed by gpu-scheduler through the extender: Running, with the
    GPU the extender chose in its annotations and in the environment gpushare's device plugin gave it at
    kubelet's Allocate, and on that GPU in `extender inspect`."""
    pod = example_pod(cluster, EXAMPLES / "gpu-pod-second-scheduler.yaml")
    annotations = pod["metadata"]["annotations"]
    index = annotations["ALIYUN_COM_GPU_MEM_IDX"]
    assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "4"
    environment = container_environment(cluster, "gpu-share-demo")
    # What gpushare's plugin sets at Allocate for the GPU our extender chose (devtools/deviceplugin/gpushare.py).
    assert environment["ALIYUN_COM_GPU_MEM_IDX"] == index
    assert environment["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert environment["NVIDIA_VISIBLE_DEVICES"] == index
    assert "gpu-share-demo" in inspect_output(cluster)


def ready(cluster: Operator, deployment: str, replicas: int = 2) -> None:
    cluster.wait(
        lambda: cluster.get("deployment", deployment, "-n", "gpu-extender")["status"].get("readyReplicas") == replicas,
        f"{deployment}'s {replicas} replicas Ready",
    )


def installed_and_placing(cluster: Operator, install: str, remove: Callable[[], None]) -> None:
    """`install` (the README's block), then both Deployments Ready and the example pod Running on its GPU;
    `remove` undoes the install, whatever happened."""
    try:
        cluster.run(install)
        ready(cluster, "gpu-extender")
        ready(cluster, "gpu-scheduler")
        gpu_share_demo_runs_on_its_gpu(cluster)
    finally:
        cluster.kubectl("delete", "pod", "gpu-share-demo", "--ignore-not-found", check=False)
        remove()


def test_the_readmes_kustomize_install_with_cert_manager(cluster: Operator) -> None:
    installed_and_placing(
        cluster,
        readme_block("**With kustomize**"),
        lambda: uninstall(cluster, ["manifests/second-scheduler/", "manifests/cert-manager/", "manifests/"]),
    )


def test_the_readmes_helm_install(cluster: Operator) -> None:
    install = readme_block("**With Helm**")
    # The image names aside: ours is built here and imported under the name the chart defaults to; the second
    # scheduler at the cluster's own version, as the README's "set its image to your Kubernetes version" says.
    install = install.replace("registry.example.com/gpu-extender", "ghcr.io/gpu-extender/gpu-extender")
    install = re.sub(
        r"secondScheduler\.image\.tag=v[0-9.]+", f"secondScheduler.image.tag={kubernetes_version()}", install
    )

    def remove() -> None:
        cluster.run("helm uninstall gpu-extender -n gpu-extender --wait", check=False)
        uninstall(cluster, [])

    installed_and_placing(cluster, install, remove)


def test_the_default_schedulers_wiring(cluster: Operator) -> None:
    """Wiring (b): the TLS files and the configuration as default-scheduler.md makes them on the control-plane
    node, then the cluster's own scheduler restarted with them (what its step 3, the static pod's edit, does:
    this cluster's scheduler is a process, with the cluster's DNS as ClusterFirstWithHostNet gives it)."""
    page = DOCS / "install" / "default-scheduler.md"
    tls_files, rendered, _appended = commands(page, "Wiring (b)")[:3]
    kustomize = DOCS / "install" / "kustomize.md"
    (extender,) = commands(kustomize, "1. The extender")
    certificates = next(b for b in commands(kustomize, "2. Certificates") if "extender certs" in b)
    try:
        cluster.run(extender)
        cluster.run(certificates)
        ready(cluster, "gpu-extender")
        cluster.run(tls_files)
        cluster.run(rendered)
        cluster.restart_scheduler(Path("/etc/kubernetes/kube-scheduler-config.yaml"))
        pod = example_pod(cluster, EXAMPLES / "gpu-pod.yaml")
        index = pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"]
        assert container_environment(cluster, "gpu-share-demo")["ALIYUN_COM_GPU_MEM_IDX"] == index
    finally:
        cluster.kubectl("delete", "pod", "gpu-share-demo", "--ignore-not-found", check=False)
        # uninstall.md for (b): undo the edit, then remove the configuration and the TLS files.
        cluster.restart_scheduler()
        cluster.run("rm -rf /etc/kubernetes/kube-scheduler-config.yaml /etc/kubernetes/gpu-extender", check=False)
        uninstall(cluster, ["manifests/"])


def uninstall(operator: Operator, folders: list[str]) -> None:
    """uninstall.md's `kubectl delete -k` of each folder the test applied, then wait until the namespace is gone,
    so the next test starts from a node with nothing of ours."""
    (page,) = commands(DOCS / "install" / "uninstall.md")
    for folder in folders:
        assert f"kubectl delete -k {folder}" in page, f"uninstall.md does not say how to remove {folder}"
        operator.kubectl("delete", "-k", folder, "--ignore-not-found", "--wait=false", check=False)
    operator.kubectl("delete", "namespace", "gpu-extender", "--ignore-not-found", "--wait=false", check=False)
    operator.wait(
        lambda: not operator.kubectl("get", "namespace", "gpu-extender", "--ignore-not-found"),
        "the namespace gpu-extender gone",
    )


def hami_share_demo_runs_on_its_gpu(cluster: Operator) -> None:
    """manifests/examples/hami-gpu-pod.yaml placed by hami-scheduler (ours): Running, HAMi's device plugin has
    written bind-phase success and released the node lock, and the container has HAMi-core's limits for the GPU
    the extender chose."""
    pod = example_pod(cluster, EXAMPLES / "hami-gpu-pod.yaml")
    allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    # HAMi's encoding: containers by ";", a container's GPUs by ":", a GPU's UUID,type,memory,cores by ",".
    uuid, _, memory, cores = allocated.split(";")[0].split(":")[0].split(",")[:4]
    cluster.wait(
        lambda: cluster.get("pod", "hami-share-demo")["metadata"]["annotations"].get("hami.io/bind-phase") == "success",
        "hami.io/bind-phase: success, written by the device plugin at Allocate",
    )
    environment = container_environment(cluster, "hami-share-demo")
    # HAMi-core's limits, as HAMi's device plugin sets them at Allocate (devtools/deviceplugin).
    assert environment["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert environment["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{memory}m"
    assert environment["CUDA_DEVICE_SM_LIMIT"] == cores
    node = cluster.get("node", "gpu-node")
    assert "hami.io/mutex.lock" not in node["metadata"].get("annotations", {}), "the node lock was not released"


def test_kustomize_hami_second_scheduler(cluster: Operator) -> None:
    install, scheduler = commands(DOCS / "protocols" / "hami.md", "Install in place of hami-scheduler")[:2]
    cluster.device_plugin("hami")
    try:
        cluster.run(install.replace("    # or: kubectl apply -k manifests/cert-manager/", ""))
        cluster.run(scheduler)
        hami_share_demo_runs_on_its_gpu(cluster)
    finally:
        cluster.kubectl("delete", "pod", "hami-share-demo", "--ignore-not-found", check=False)
        uninstall(cluster, ["manifests/hami/second-scheduler/", "manifests/hami/"])
        cluster.device_plugin("gpushare")


def test_helm_hami(cluster: Operator) -> None:
    """hami.md's Helm install (the image names aside, as in the README's), with cert-manager."""
    (install,) = [
        b for b in commands(DOCS / "protocols" / "hami.md", "Install in place of hami-scheduler") if "helm" in b
    ]
    install = install.replace("registry.example.com/gpu-extender", "ghcr.io/gpu-extender/gpu-extender")
    install = re.sub(
        r"secondScheduler\.image\.tag=v[0-9.]+", f"secondScheduler.image.tag={kubernetes_version()}", install
    )
    cluster.device_plugin("hami")
    try:
        cluster.run(install)
        ready(cluster, "gpu-extender")
        ready(cluster, "gpu-scheduler")
        hami_share_demo_runs_on_its_gpu(cluster)
    finally:
        cluster.kubectl("delete", "pod", "hami-share-demo", "--ignore-not-found", check=False)
        cluster.run("helm uninstall gpu-extender -n gpu-extender --wait", check=False)
        uninstall(cluster, [])
        cluster.device_plugin("gpushare")
