"""Moving a running cluster from a peer to us and back, on a real node, with the commands of the migration guides
read from their pages.

From gpushare-scheduler-extender (docs/migrate/from-gpushare.md): the peer, built from its source at the commit the
placement bench measures (image/peer-images.sh), runs as its install guide installs it (its
config/gpushare-schd-extender.yaml applied, the image name aside; the cluster's own kube-scheduler restarted with its
config/scheduler-policy-config.yaml, in the v1 API kube-scheduler 1.34 reads) and places GPU pods; the guide's
steps move the cluster to us; we place more; the guide's way back returns it to the peer, which places more again.
The pods are sized so that any scheduler that did not count the others' pods would put a GPU over its memory (and
the last one, which no GPU has room for, must wait). After each phase: nothing over a GPU and no pod refused,
judged from the API and from the device-plugin double's record (tests/node/test_operations.judge), the earlier
pods Running with the same containers, never restarted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import node_burst
from bench.placement import peers
from devtools.cluster.layout import NODE_NAME, REPOSITORY, cache_root
from tests.node.operator import Operator, commands
from tests.node.test_install import DOCS, WORKLOAD_IMAGE, inspect_output, uninstall
from tests.node.test_operations import judge, plugin_records, unschedulable

GUIDE = DOCS / "migrate" / "from-gpushare.md"
PEER_IMAGE = "localhost/gpushare-schd-extender:c0b6141"
PEER_SOURCE = cache_root() / "peers" / "src" / "gpushare-scheduler-extender-c0b6141"
"""image/peer-images.sh's clone of gpushare-scheduler-extender at c0b6141: its config files are applied as they are."""
POLICY_CONFIG = Path("/etc/kubernetes/scheduler-policy-config.yaml")
LABEL = "gpu-extender.io/node-tier-migration"


def gpushare_pod(name: str, units: int) -> dict[str, Any]:
    """A pod of the default scheduler asking `units` GiB of one GPU, as gpushare's users write them."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: "1"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "work",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", "nvidia-smi; exec sleep 3600"],
                    "resources": {"limits": {"aliyun.com/gpu-mem": str(units)}},
                }
            ],
        },
    }


def create(cluster: Operator, *pods: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))


def running(cluster: Operator, names: list[str]) -> dict[str, dict[str, Any]]:
    """Wait until every pod in `names` is Running; each, by name."""

    def check() -> dict[str, dict[str, Any]] | None:
        pods = {pod["metadata"]["name"]: pod for pod in cluster.get("pods", "-l", LABEL)["items"]}
        if all(pods.get(name, {}).get("status", {}).get("phase") == "Running" for name in names):
            return pods
        return None

    found: dict[str, dict[str, Any]] = cluster.wait(check, f"{', '.join(names)} Running", timeout=240)
    return found


def containers(pods: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str, int]]:
    """Each pod's uid, its container's id and restart count: what must not change while the cluster moves."""
    return {
        name: (
            pod["metadata"]["uid"],
            pod["status"]["containerStatuses"][0]["containerID"],
            pod["status"]["containerStatuses"][0]["restartCount"],
        )
        for name, pod in pods.items()
    }


def placed_by(cluster: Operator, names: list[str]) -> dict[str, int]:
    """The GPU each pod's ALIYUN_COM_GPU_MEM_IDX names."""
    pods = {pod["metadata"]["name"]: pod for pod in cluster.get("pods", "-l", LABEL)["items"]}
    return {name: int(pods[name]["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"]) for name in names}


def guide(heading: str) -> list[str]:
    return commands(GUIDE, heading)


def install_the_peer(cluster: Operator) -> str:
    """gpushare-scheduler-extender as its docs/install.md installs it: the Deployment of its
    config/gpushare-schd-extender.yaml (its image built here; its nodeSelector asks for a control-plane node,
    which this one node is, so it carries the label kubeadm's control planes had), and kube-scheduler restarted
    with its scheduler-policy-config.yaml. Returns the manifest, as the user's file the way back applies."""
    manifest = (PEER_SOURCE / "config" / "gpushare-schd-extender.yaml").read_text()
    manifest = re.sub(r"image: \S+k8s-gpushare-schd-extender:\S+", f"image: {PEER_IMAGE}", manifest)
    assert PEER_IMAGE in manifest, "config/gpushare-schd-extender.yaml names no k8s-gpushare-schd-extender image"
    cluster.kubectl("label", "node", NODE_NAME, "node-role.kubernetes.io/master=", "--overwrite")
    cluster.kubectl("create", "-f", "-", input_text=manifest)
    cluster.kubectl("-n", "kube-system", "rollout", "status", "deployment/gpushare-schd-extender", "--timeout=180s")
    # Its file says kubescheduler.config.k8s.io/v1beta2, which kube-scheduler read until 1.27; from 1.28 only v1,
    # the same fields: what its users on 1.28 and later run.
    policy = (PEER_SOURCE / "config" / "scheduler-policy-config.yaml").read_text()
    assert "kubescheduler.config.k8s.io/v1beta2" in policy and "127.0.0.1:32766/gpushare-scheduler" in policy
    POLICY_CONFIG.write_text(policy.replace("kubescheduler.config.k8s.io/v1beta2", "kubescheduler.config.k8s.io/v1"))
    cluster.restart_scheduler(POLICY_CONFIG)
    return manifest


def peer_log(cluster: Operator) -> str:
    return cluster.kubectl("-n", "kube-system", "logs", "deployment/gpushare-schd-extender", check=False)


def see_and_install_beside(cluster: Operator, page: Path, placed: list[str], peer: str) -> None:
    """A guide's first two steps, as its page gives them: the pods `peer` placed are listed, then the extender is
    installed beside it and `extender inspect` shows them on their GPUs."""
    (see,) = commands(page, "1. See where you stand")
    listed = cluster.run(see)
    assert all(name in listed for name in placed), listed
    (install,) = commands(page, "2. Install the extender beside it")
    cluster.run(install)
    held = inspect_output(cluster)
    assert all(name in held for name in placed), f"extender inspect does not show {peer}'s pods:\n{held}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def test_from_gpushare_to_us_and_back(cluster: Operator, workdir: Path) -> None:
    try:
        manifest = install_the_peer(cluster)
        (workdir / "gpushare-schd-extender.yaml").write_text(manifest)

        # Phase 1, gpushare's extender: three pods of 5 GiB (of two GPUs of 16).
        create(cluster, *(gpushare_pod(f"by-gpushare-{n}", 5) for n in range(3)))
        first = ["by-gpushare-0", "by-gpushare-1", "by-gpushare-2"]
        before = containers(running(cluster, first))
        assert "by-gpushare-0" in peer_log(cluster), "gpushare's extender did not place the first pods"
        judge(cluster)

        # The guide, in: see, install beside, point kube-scheduler at us, remove gpushare's extender.
        see_and_install_beside(cluster, GUIDE, first, "gpushare's extender")
        files, check = guide("3. Point kube-scheduler at it")
        cluster.run(files)
        cluster.restart_scheduler(Path("/etc/kubernetes/kube-scheduler-config.yaml"))  # the static pod's edit
        cluster.run(check.replace("manifests/examples/gpu-pod.yaml", str(example(workdir))))
        (remove,) = guide("4. Remove gpushare's extender")
        cluster.run(remove)

        # Phase 2, ours: three more of 5 GiB. Had we not counted gpushare's, a GPU would hold more than 16.
        create(cluster, *(gpushare_pod(f"by-us-{n}", 5) for n in range(3)))
        second = ["by-us-0", "by-us-1", "by-us-2"]
        pods = running(cluster, first + second)
        assert containers({name: pods[name] for name in first}) == before, "a running pod was touched"
        assert all("ALIYUN_COM_GPU_MEM_IDX" in pods[name]["metadata"]["annotations"] for name in second), (
            "ours wrote no ALIYUN_COM_GPU_MEM_IDX"
        )
        judge(cluster)

        # The guide, back: the check passes (no pod on several GPUs), gpushare's extender again, kube-scheduler
        # back to its file, ours removed.
        (can_count,) = guide("1. Check that gpushare's extender can count every pod")
        # What `gpushare_several_gpus: bind` leaves: a pod whose GPUs only our annotation records. The check names
        # it and fails while it exists (its scheduler does not exist, so it stays Pending and never runs).
        several = gpushare_pod("on-two-gpus", 2)
        several["metadata"]["annotations"] = {"gpu-extender.io/device-indexes": "0,1"}
        several["spec"]["schedulerName"] = "nobody"
        create(cluster, several)
        with pytest.raises(AssertionError, match="on several GPUs: default/on-two-gpus"):
            cluster.run(can_count)
        cluster.kubectl("delete", "pod", "on-two-gpus", "--wait=true")
        cluster.run(can_count)
        (again,) = guide("2. Put gpushare's extender back")
        cluster.run(again.replace("gpushare-schd-extender.yaml", str(workdir / "gpushare-schd-extender.yaml")))
        cluster.restart_scheduler(POLICY_CONFIG)  # step 3: the static pod's edit undone
        (ours_removed,) = guide("4. Remove the extender")
        cluster.run(ours_removed)

        # Phase 3, gpushare's again: each GPU has 1 GiB left. Two pods of 1 GiB fit; one of 2 GiB must wait, unless
        # gpushare's extender ignored what we placed.
        create(cluster, gpushare_pod("back-0", 1), gpushare_pod("back-1", 1))
        third = ["back-0", "back-1"]
        pods = running(cluster, first + second + third)
        assert containers({name: pods[name] for name in first}) == before, "a running pod was touched"
        assert "back-0" in peer_log(cluster), "gpushare's extender did not place the pods after the move back"
        create(cluster, gpushare_pod("back-too-big", 2))
        cluster.wait(
            lambda: unschedulable(cluster.get("pod", "back-too-big")),
            "the 2 GiB pod Unschedulable (no GPU has 2 GiB left once what we placed is counted)",
            timeout=120,
        )
        judge(cluster)
        used = placed_by(cluster, first + second + third)
        assert sorted(used.values()).count(0) == sorted(used.values()).count(1) == 4, used
    finally:
        cluster.kubectl("delete", "pods", "-l", LABEL, "--wait=true", "--timeout=120s", check=False)
        cluster.restart_scheduler()
        cluster.kubectl(
            "-n", "kube-system", "delete", "deployment/gpushare-schd-extender", "service/gpushare-schd-extender",
            "clusterrolebinding/gpushare-schd-extender", "clusterrole/gpushare-schd-extender",
            "serviceaccount/gpushare-schd-extender", "--ignore-not-found", check=False,
        )  # fmt: skip
        cluster.kubectl("label", "node", NODE_NAME, "node-role.kubernetes.io/master-", check=False)
        cluster.run(f"rm -f {POLICY_CONFIG} /etc/kubernetes/kube-scheduler-config.yaml", check=False)
        cluster.run("rm -rf /etc/kubernetes/gpu-extender", check=False)
        uninstall(cluster, ["manifests/"])


def example(workdir: Path) -> Path:
    """manifests/examples/gpu-pod.yaml with the workload image (no registry here): 4 GiB, so it fits beside the
    three pods of 5 GiB gpushare placed only on a GPU they leave room on."""
    pod = yaml.safe_load((REPOSITORY / "manifests" / "examples" / "gpu-pod.yaml").read_text())
    for container in pod["spec"]["containers"]:
        container["image"] = WORKLOAD_IMAGE
    path = workdir / "gpu-pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


# ---- from hami-scheduler ------------------------------------------------------------------------------------

HAMI_GUIDE = DOCS / "migrate" / "from-hami.md"
HAMI_SOURCE = cache_root() / "peers" / "src" / "HAMi-v2.10.0"
"""image/peer-images.sh's clone of HAMi at v2.10.0: hami-scheduler is built from it as the placement bench builds it
(`peers.build`, cached by a digest of its Go files)."""


def hami_pod(name: str, mib: int) -> dict[str, Any]:
    """A pod asking `mib` MiB of one GPU, as HAMi's admission webhook leaves it (schedulerName hami-scheduler,
    nvidia.com/gpu: 1): the webhook is off here, so the pod says both itself."""
    pod = gpushare_pod(name, 0)
    pod["spec"]["schedulerName"] = "hami-scheduler"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}}
    return pod


def judge_hami(cluster: Operator) -> None:
    """bench/node_burst.py's judge in HAMi's protocol: no GPU over its memory or split count by the pods' annotations
    nor by the plugin's record, the two naming the same GPUs, every pod bind-phase success, none refused or served
    twice."""
    pods = [
        pod
        for pod in cluster.get("pods", "-A")["items"]
        if pod["spec"].get("nodeName") == NODE_NAME and pod["status"].get("phase") not in ("Succeeded", "Failed")
    ]
    problems = node_burst.judge_hami(pods, plugin_records(cluster), node_burst.GPU_MIB, node_burst.SPLIT_COUNT)
    assert not problems, problems


def hami_guide(heading: str) -> list[str]:
    return commands(HAMI_GUIDE, heading)


def test_from_hami_scheduler_to_us_and_back(cluster: Operator, workdir: Path) -> None:
    """Two GPUs of 16 GiB (HAMi's device-plugin double, its chart's node settings). hami-scheduler, built from
    source, runs as its chart's Deployment does (the webhook off; its kube-scheduler a process beside it, which
    the guide's `helm upgrade ... kubeScheduler.enabled=false|true` stops and starts) and places three pods of
    5 GiB; the guide moves the cluster to us (three more, created while no scheduler answers to hami-scheduler,
    wait and are placed); the way back returns it to hami-scheduler, which must count ours: two pods of 1 GiB fit,
    one of 2 GiB must wait."""
    built = peers.build(peers.HAMI, HAMI_SOURCE)
    first, second, third = [f"by-hami-{n}" for n in range(3)], [f"by-us-{n}" for n in range(3)], ["back-0", "back-1"]
    with (
        node_burst.node_prepared(cluster, "hami", workdir, gpus_count=2),
        node_burst.hami_extender(cluster, built, workdir) as peer,
    ):
        try:
            with node_burst.hami_kube_scheduler(cluster, peer, workdir):
                create(cluster, *(hami_pod(name, 5120) for name in first))
                before = containers(running(cluster, first))
                judge_hami(cluster)

                see_and_install_beside(cluster, HAMI_GUIDE, first, "hami-scheduler")
                (stop,) = hami_guide("3. Stop hami-scheduler's kube-scheduler")
                assert "--set scheduler.kubeScheduler.enabled=false" in stop
            # Step 3 done (its kube-scheduler stopped): pods created now wait, no scheduler answers to hami-scheduler.
            create(cluster, *(hami_pod(name, 5120) for name in second))
            (ours,) = hami_guide("4. Run a kube-scheduler answering to hami-scheduler")
            cluster.run(ours)
            pods = running(cluster, first + second)
            assert containers({name: pods[name] for name in first}) == before, "a running pod was touched"
            judge_hami(cluster)

            (stop_ours,) = hami_guide("1. Stop the extender's scheduler")
            cluster.run(stop_ours)
            (start_theirs,) = hami_guide("2. Start hami-scheduler's kube-scheduler again")
            assert "--set scheduler.kubeScheduler.enabled=true" in start_theirs
            with node_burst.hami_kube_scheduler(cluster, peer, workdir):
                (removed,) = hami_guide("3. Remove the extender")
                cluster.run(removed)
                create(cluster, *(hami_pod(name, 1024) for name in third))
                pods = running(cluster, first + second + third)
                assert containers({name: pods[name] for name in first}) == before, "a running pod was touched"
                create(cluster, hami_pod("back-too-big", 2048))
                cluster.wait(
                    lambda: unschedulable(cluster.get("pod", "back-too-big")),
                    "the 2 GiB pod Unschedulable (no GPU has 2 GiB left once what we placed is counted)",
                    timeout=120,
                )
                judge_hami(cluster)
        finally:
            cluster.kubectl("delete", "pods", "-l", LABEL, "--wait=true", "--timeout=120s", check=False)
            uninstall(cluster, ["manifests/hami/second-scheduler/", "manifests/hami/"])
