"""Operations on a real node with the extender installed as the docs install it (kustomize, `extender certs`, the
second scheduler, gpushare's protocol): a rolling update, the leader's process killed and the leader's container
OOM-killed, each during a burst of GPU pods; kubelet restarted under running GPU pods; the node drained and
uncordoned.

Each ends judged from two sides that do not trust the extender: the API (the GPU every live pod's annotations
name, summed per GPU against its memory) and the device-plugin double's own record of what it gave at kubelet's
`Allocate` (no GPU given over its memory to live pods, no pod served twice, no pod refused or given no GPU), and
with every pod that fits Running.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from devtools.cluster.clients import ctr
from devtools.cluster.layout import NODE_NAME
from tests.node.operator import Operator, commands
from tests.node.test_install import DOCS, WORKLOAD_IMAGE, gpu_share_demo_runs_on_its_gpu, ready, uninstall
from tests.node.test_refusals import events_of, pod_asking

GPUS = 2
GPU_UNITS = 16
"""devtools/deviceplugin/gpus-gpushare.yaml: two GPUs of 16 GiB, as many aliyun.com/gpu-mem units each."""
BURST_LABEL = "gpu-extender.io/node-tier-burst"


@pytest.fixture(scope="module")
def installed(cluster: Operator) -> Iterator[Operator]:
    kustomize = DOCS / "install" / "kustomize.md"
    (extender,) = commands(kustomize, "1. The extender")
    certificates = next(b for b in commands(kustomize, "2. Certificates") if "extender certs" in b)
    cluster.run(extender)
    cluster.run(certificates)
    ready(cluster, "gpu-extender")
    cluster.run(commands(DOCS / "install" / "second-scheduler.md")[0])
    yield cluster
    delete_bursts(cluster)
    uninstall(cluster, ["manifests/second-scheduler/", "manifests/"])


def test_kustomize_without_cert_manager_and_the_second_scheduler(installed: Operator) -> None:
    """The install the operations below run on, as kustomize.md's steps 1 and 2 (`extender certs`) and
    second-scheduler.md give it: the README's example pod Running on its GPU, shown by `extender inspect`."""
    try:
        gpu_share_demo_runs_on_its_gpu(installed)
    finally:
        installed.kubectl("delete", "pod", "gpu-share-demo", "--ignore-not-found", "--wait=true", check=False)


def burst(cluster: Operator, name: str, count: int, units: int) -> list[str]:
    """`count` pods asking `units` of aliyun.com/gpu-mem each, for gpu-scheduler, created in one request."""
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-{number}", "labels": {BURST_LABEL: name}},
            "spec": {
                "schedulerName": "gpu-scheduler",
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
        for number in range(count)
    ]
    cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    return [pod["metadata"]["name"] for pod in pods]


def pods_of(cluster: Operator, name: str) -> list[dict[str, Any]]:
    return list(cluster.get("pods", "-l", f"{BURST_LABEL}={name}")["items"])


def all_running(cluster: Operator, name: str, count: int, timeout: float = 240.0) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        pods = pods_of(cluster, name)
        return pods if len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods) else None

    found: list[dict[str, Any]] = cluster.wait(check, f"the {count} pods of burst {name} Running", timeout)
    return found


def delete_bursts(cluster: Operator) -> None:
    cluster.kubectl("delete", "pods", "-l", BURST_LABEL, "--wait=true", "--timeout=120s", check=False)


def plugin_records(cluster: Operator) -> list[dict[str, Any]]:
    record = cluster.paths.state / "device-plugin.jsonl"
    return [orjson.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def judge(cluster: Operator) -> None:
    """Nothing allocated twice or over a GPU, from the API and from the plugin's record; no pod refused."""
    live = [
        pod
        for pod in cluster.get("pods", "-A")["items"]
        if pod["spec"].get("nodeName") == NODE_NAME
        and pod["status"].get("phase") not in ("Succeeded", "Failed")
        and "ALIYUN_COM_GPU_MEM_IDX" in pod["metadata"].get("annotations", {})
    ]
    by_api: Counter[int] = Counter()
    for pod in live:
        annotations = pod["metadata"]["annotations"]
        by_api[int(annotations["ALIYUN_COM_GPU_MEM_IDX"])] += int(annotations["ALIYUN_COM_GPU_MEM_POD"])
    assert all(used <= GPU_UNITS for used in by_api.values()), f"over a GPU by the API: {dict(by_api)}"
    live_uids = {pod["metadata"]["uid"] for pod in live}
    records = [record for record in plugin_records(cluster) if record["uid"] in live_uids]
    refused = [record for record in records if not record["accepted"] or record["reason"]]
    assert not refused, f"the device plugin refused or gave no GPU: {refused}"
    served = Counter(record["uid"] for record in records)
    assert all(times == 1 for times in served.values()), f"a pod allocated twice: {served}"
    by_plugin: Counter[int] = Counter()
    for record in records:
        for gpu in record["gpus"]:
            by_plugin[gpu["index"]] += gpu["memory"]
    assert all(used <= GPU_UNITS for used in by_plugin.values()), f"over a GPU by the plugin: {dict(by_plugin)}"
    assert by_plugin == by_api, "the plugin gave other GPUs than the pods' annotations name"


def unschedulable(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return pod["status"].get("phase") == "Pending" and any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def leader(cluster: Operator) -> str:
    lease = cluster.get("lease", "gpu-extender", "-n", "gpu-extender")
    return str(lease["spec"].get("holderIdentity") or "")


def trickle(cluster: Operator, name: str, during: Callable[[], None], limit: int = 30) -> tuple[int, int]:
    """Pods of one unit of aliyun.com/gpu-mem created one every half second while `during()` runs in another thread
    (a rollout, a failover), so that filters and binds meet the extender mid-change; at least four, at most `limit`
    (what the node's GPUs hold). Each is created by a kubectl of its own, up to four at once: on a busy machine a
    kubectl takes seconds, and one at a time the pods would come too slowly to meet a failover that kubelet ends
    in a few seconds. Returns how many were made, and how many of them were in the API before `during()` ended."""
    done = threading.Event()
    failure: list[BaseException] = []
    counted = threading.Lock()
    meanwhile = 0

    def run() -> None:
        try:
            during()
        except BaseException as error:  # reported in the test's thread
            failure.append(error)
        finally:
            done.set()

    def create(number: int) -> None:
        nonlocal meanwhile
        burst(cluster, f"{name}-{number}", 1, 1)
        with counted:
            meanwhile += not done.is_set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    made = 0
    with ThreadPoolExecutor(max_workers=4) as creating:
        created = []
        while made < limit and (made < 4 or not done.is_set()):
            created.append(creating.submit(create, made))
            made += 1
            done.wait(0.5)
        for each in created:
            each.result()  # a kubectl that failed fails the test
    worker.join(300)
    if failure:
        raise failure[0]
    return made, meanwhile


def running_prefixed(cluster: Operator, prefix: str, count: int) -> None:
    def check() -> bool:
        pods = [p for p in cluster.get("pods")["items"] if p["metadata"]["name"].startswith(prefix)]
        return len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods)

    cluster.wait(check, f"the {count} pods {prefix}* Running", 240)


def rolled_out(cluster: Operator) -> bool:
    """The Deployment's new ReplicaSet alone runs, both replicas Ready: no pod of the old template is left."""
    deployment = cluster.get("deployment", "gpu-extender", "-n", "gpu-extender")
    status = deployment["status"]
    pods = cluster.get("pods", "-n", "gpu-extender", "-l", "app.kubernetes.io/component=extender")["items"]
    return (
        status.get("observedGeneration") == deployment["metadata"]["generation"]
        and status.get("updatedReplicas") == status.get("readyReplicas") == status.get("replicas") == 2
        and len(pods) == 2
    )


def test_a_rolling_update_during_a_burst(installed: Operator) -> None:
    def rollout() -> None:
        installed.kubectl("-n", "gpu-extender", "rollout", "restart", "deployment/gpu-extender")
        installed.wait(lambda: not rolled_out(installed), "the rollout started", 30, 0.2)
        installed.wait(lambda: rolled_out(installed), "the rollout done: two new replicas Ready, no old one", 180)

    made, meanwhile = trickle(installed, "rolling", rollout)
    assert meanwhile >= 4, f"{meanwhile} pods made during the rollout: it did not overlap the burst"
    running_prefixed(installed, "rolling-", made)
    judge(installed)
    delete_bursts(installed)


def test_the_leaders_process_killed_during_a_burst(installed: Operator) -> None:
    """SIGKILL to the leader's process (a crash: no lease given up, no label removed), through containerd."""
    killed = leader(installed)
    (status,) = installed.get("pod", killed, "-n", "gpu-extender")["status"]["containerStatuses"]
    container = status["containerID"].removeprefix("containerd://")

    def restarted() -> bool:
        (now,) = installed.get("pod", killed, "-n", "gpu-extender")["status"]["containerStatuses"]
        return bool(now["restartCount"] >= 1 and now.get("ready"))

    def kill() -> None:
        ctr(["tasks", "kill", "--signal", "SIGKILL", container])
        # kubelet starts the container again; the Lease goes to whichever replica takes it first (the restarted
        # one too: its identity is its pod's name), and the burst goes on meanwhile.
        installed.wait(restarted, f"{killed}'s extender restarted by kubelet and Ready", 120)

    made, meanwhile = trickle(installed, "kill", kill)
    assert meanwhile >= 4, f"{meanwhile} pods made during the failover: it did not overlap the burst"
    running_prefixed(installed, "kill-", made)
    ready(installed, "gpu-extender")
    judge(installed)
    delete_bursts(installed)


FILLER = """
import os, sys, time
# Join the container's memory cgroup (what it fills is charged to the container's limit), then fill 2 GiB.
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
filled = "x" * (2 << 30)
time.sleep(600)
"""


def memory_cgroup(container: str) -> Path:
    """The memory cgroup of a container (cgroup v1: /sys/fs/cgroup/memory/kubepods/.../<id>; v2: the unified tree)."""
    for root in (Path("/sys/fs/cgroup/memory/kubepods"), Path("/sys/fs/cgroup/kubepods.slice"), Path("/sys/fs/cgroup")):
        found = sorted(root.glob(f"**/*{container}*")) if root.is_dir() else []
        found = [path for path in found if (path / "cgroup.procs").exists()]
        if found:
            return found[0]
    raise AssertionError(f"no memory cgroup for container {container}")


def test_the_leader_oom_killed_during_a_burst(installed: Operator) -> None:
    """The leader's container over its memory limit (manifests/base/deployment.yaml's 1Gi), and the kernel's OOM
    killer ending the extender, as when the extender itself grows past it. A process from the host joins the
    container's memory cgroup and fills 2 GiB charged to the container. The OOM killer ends the process of the
    highest score in the cgroup: its resident memory plus its oom_score_adj in thousandths of the limit. Where
    memory.oom.group is not set (cgroup v1, as on this machine) that would be the filler, so the extender's
    oom_score_adj is raised to 1000 first (the filler's is the host's 0; lowering one needs CAP_SYS_RESOURCE,
    which this machine's root lacks): its score then passes the limit, which the filler's cannot. kubelet reports
    the container OOMKilled and starts it again; the burst goes on meanwhile."""
    killed = leader(installed)
    (status,) = installed.get("pod", killed, "-n", "gpu-extender")["status"]["containerStatuses"]
    container = status["containerID"].removeprefix("containerd://")
    cgroup = memory_cgroup(container)
    (pid,) = [line.split()[1] for line in ctr(["tasks", "ls"]).stdout.splitlines() if line.startswith(container)]

    def oom_killed() -> bool:
        (now,) = installed.get("pod", killed, "-n", "gpu-extender")["status"]["containerStatuses"]
        last = (now.get("lastState") or {}).get("terminated") or {}
        return bool(last.get("reason") == "OOMKilled" and now["restartCount"] >= 1 and now.get("ready"))

    def fill() -> None:
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
        filler = subprocess.Popen([sys.executable, "-c", FILLER, str(cgroup)])
        try:
            # The kernel ends the extender, then the filler too if it is still short of its 2 GiB (it is then the
            # cgroup's only process); the container stops either way.
            installed.wait(oom_killed, f"{killed}'s extender OOMKilled, restarted by kubelet and Ready", 120)
        finally:
            filler.kill()
            filler.wait()

    made, meanwhile = trickle(installed, "oom", fill)
    assert meanwhile >= 4, f"{meanwhile} pods made during the OOM kill: it did not overlap the burst"
    running_prefixed(installed, "oom-", made)
    ready(installed, "gpu-extender")
    judge(installed)
    delete_bursts(installed)


def test_kubelet_restarted_under_running_gpu_pods(installed: Operator) -> None:
    burst(installed, "kubelet", 6, 4)
    before = {pod["metadata"]["name"]: pod for pod in all_running(installed, "kubelet", 6)}
    restarted_at = time.time()
    installed.restart_kubelet()
    # The device plugin registers again on the new kubelet.sock; the Node advertises its GPUs again.
    installed.wait(
        lambda: (
            installed.get("node", NODE_NAME)["status"]["allocatable"].get("aliyun.com/gpu-mem") == str(GPUS * GPU_UNITS)
        ),
        "the device plugin registered again (aliyun.com/gpu-mem allocatable)",
    )
    after = {pod["metadata"]["name"]: pod for pod in all_running(installed, "kubelet", 6)}
    for name, pod in before.items():
        (was,) = pod["status"]["containerStatuses"]
        (now,) = after[name]["status"]["containerStatuses"]
        assert (now["containerID"], now["restartCount"]) == (was["containerID"], 0), f"{name} was restarted"
    # Room for two more pods of 4 GiB: they are placed beside the running ones, which kept their GPUs.
    burst(installed, "after-kubelet", 2, 4)
    all_running(installed, "after-kubelet", 2)
    assert all(record["time"] < restarted_at for record in plugin_records(installed) if record["pod"] in before)
    judge(installed)
    delete_bursts(installed)


def test_the_node_drained_and_uncordoned(installed: Operator) -> None:
    burst(installed, "drain", 4, 4)
    all_running(installed, "drain", 4)
    try:
        installed.kubectl(
            "drain", NODE_NAME, f"--pod-selector={BURST_LABEL}=drain", "--force", "--ignore-daemonsets",
            "--delete-emptydir-data", "--timeout=120s",
        )  # fmt: skip
        assert not pods_of(installed, "drain")
        burst(installed, "cordoned", 2, 4)
        installed.wait(
            lambda: all(unschedulable(pod) for pod in pods_of(installed, "cordoned")),
            "the pods made while the node is cordoned Pending, unschedulable",
        )
    finally:
        installed.kubectl("uncordon", NODE_NAME)
    all_running(installed, "cordoned", 2)
    judge(installed)
    delete_bursts(installed)


def test_a_pod_asking_two_gpus_waits_saying_why(installed: Operator) -> None:
    """gpushare's device plugin gives a pod one GPU at most, so such a pod is never bound: it waits Pending, and
    its events say why (tests/node/test_refusals.py has the other protocol's refusals)."""
    limits = {"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-count": "2"}
    installed.kubectl("apply", "-f", "-", input_text=pod_asking("two-gpus", "gpu-scheduler", limits))
    try:
        installed.wait(
            lambda: "gpushare's device plugin gives a pod one GPU at most" in events_of(installed, "two-gpus"),
            "FailedScheduling with the reason in the pod's events",
        )
        assert installed.pod_phase("two-gpus") == "Pending"
        assert not installed.get("pod", "two-gpus")["spec"].get("nodeName")
    finally:
        installed.kubectl("delete", "pod", "two-gpus", "--ignore-not-found", check=False)
