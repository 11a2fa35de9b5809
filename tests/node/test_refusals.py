"""What a pod sees on a real node when the node side cannot run it, in each protocol, as the peers' users meet it
(their issues: pods bound but never started, `UnexpectedAdmissionError`, HAMi's `bind-phase: failed`):

- gpushare's protocol (test_operations.py, on its install): a pod asking several GPUs, which gpushare's device
  plugin cannot give (it would start the container without a GPU), is never bound; it waits Pending with the
  reason in its events.
- HAMi's protocol: a pod whose `Allocate` HAMi's device plugin fails (here on purpose, as a plugin that lost a GPU
  does) is failed by kubelet at admission (`UnexpectedAdmissionError`, the plugin's error in its events), HAMi's
  `bind-phase: failed` is written and the node lock released, and the GPUs it was given are free again: the next
  pod takes them and runs.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.node.operator import Operator, commands
from tests.node.test_install import DOCS, WORKLOAD_IMAGE, uninstall


def events_of(cluster: Operator, pod: str) -> str:
    """The pod's events as JSON text (not YAML, which folds long messages and doubles their apostrophes)."""
    return cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={pod}", "-o", "json")


def pod_asking(name: str, scheduler: str, limits: dict[str, str]) -> str:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "cuda",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", "nvidia-smi; exec sleep 3600"],
                    "resources": {"limits": limits},
                }
            ],
        },
    }
    return yaml.safe_dump(pod)


def test_a_pod_hamis_plugin_refuses_fails_at_admission_and_frees_its_gpu(cluster: Operator) -> None:
    install, scheduler = commands(DOCS / "protocols" / "hami.md", "Install in place of hami-scheduler")[:2]
    cluster.device_plugin("hami", refuse=["refused"])
    try:
        cluster.run(install.replace("    # or: kubectl apply -k manifests/cert-manager/", ""))
        cluster.run(scheduler)
        # The whole of a GPU's memory: the pod after it asks the whole of both GPUs, so it runs only if the
        # refused pod's GPU is free again.
        whole = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}
        cluster.kubectl("apply", "-f", "-", input_text=pod_asking("refused", "hami-scheduler", whole))

        def failed_at_admission() -> dict[str, Any] | None:
            pod: dict[str, Any] = cluster.get("pod", "refused")
            status = pod["status"]
            return (
                pod if (status.get("phase"), status.get("reason")) == ("Failed", "UnexpectedAdmissionError") else None
            )

        pod = cluster.wait(failed_at_admission, "the refused pod Failed: UnexpectedAdmissionError")
        assert "Allocate failed" in events_of(cluster, "refused")
        assert pod["metadata"]["annotations"]["hami.io/bind-phase"] == "failed"
        node = cluster.get("node", "gpu-node")
        assert "hami.io/mutex.lock" not in node["metadata"].get("annotations", {}), "the node lock was not released"
        both = {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"}
        cluster.kubectl("apply", "-f", "-", input_text=pod_asking("after", "hami-scheduler", both))
        cluster.wait(lambda: cluster.pod_phase("after") == "Running", "the pod asking both whole GPUs Running")
    finally:
        for name in ("refused", "after"):
            cluster.kubectl("delete", "pod", name, "--ignore-not-found", check=False)
        uninstall(cluster, ["manifests/hami/second-scheduler/", "manifests/hami/"])
        cluster.device_plugin("gpushare")
