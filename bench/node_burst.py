"""`python -m bench.node_burst`: "Burst to Running". A job of GPU pods sharing the one-node cluster's GPUs
(devtools/cluster), created at once, timed from its creation until every pod is Running, through the schedulers
users install: ours as the docs install it, and hami-scheduler (HAMi v2.10.0) as `bench/placement/peers.py` runs it.

    python -m bench.node_burst --protocol hami|gpushare [--peer hami=DIR] [--pods 64] [--runs 3] [--record DIR]

Why it exists: `make bench-e2e` and `make bench-placement` stop at the Binding; a user waits until the pods run.
Here kubelet admits each pod, calls the device-plugin double's `Allocate` (devtools/deviceplugin) and starts its
container, so what the device protocol costs after the Binding is in the figure: in HAMi's, the node lock the
scheduler takes at bind and the device plugin releases at `Allocate`, which serialises the binds of one node.

- **ours** (`--protocol gpushare` or `hami`): installed as tests/node installs it, from the docs' own commands:
  `kubectl apply -k manifests/` (or `manifests/hami/`), `extender certs --secrets`, the second scheduler
  (`manifests/second-scheduler/`, profile `gpu-scheduler`; or `manifests/hami/second-scheduler/`, profile
  `hami-scheduler`), all removed again at the end.
- **hami-scheduler** (`--peer hami=DIR`, with `--protocol hami`), in place of ours: built from HAMi's source in DIR
  by `peers.build`, run by `peers.HamiProcess` (its flags, device configuration and handshake), inside the node's
  network namespace on 127.0.0.1 with the admin's kubeconfig, and a second kube-scheduler there (profile
  `hami-scheduler`, the extender wired exactly as `HamiProcess.config` renders it, `--leader-elect=false`, ports of
  its own). One invocation measures one of them, so ours and it never answer to `hami-scheduler` at once, and the
  cluster's lock is not held for both (a run of hami-scheduler takes minutes: its binds wait for its node lock).

The node gets `GPUS` GPUs of `GPU_MIB` MiB from a GPUs file written here (the default files' two GPUs do not hold
64 pods: gpushare's units are whole GiB, HAMi's split count is 10 a GPU); each pod asks 1 GiB (gpushare: 1 unit of
`aliyun.com/gpu-mem`; HAMi: `nvidia.com/gpu: 1`, `nvidia.com/gpumem: 1024`). Each run waits for the machine to
settle (`SETTLE_LOAD`), then creates its pods by one `kubectl create -f` of a List. A watch on them (stamped on
arrival, `time.monotonic`) gives, per run: the seconds from just before `kubectl create` until every pod is bound
and until every pod is Running, each pod's own seconds from its creation (its ADDED event) to Running (median,
p90), and the FailedScheduling events of its pods. Each run is then judged as tests/node/test_operations.py's
`judge` does, from the API and from the device plugin's own record (adapted to HAMi's annotations), and its pods
deleted.

It holds the cluster's lock throughout (`processes.cluster_lock`), brings the cluster up if it is not (and down
again at the end), and leaves the node as it found it: the device-plugin double it had, and the node's `hami.io/`
annotations as they were. It exits non-zero when a run fails or a judgement finds a problem, never for a time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench import record as recording
from bench.placement import peers
from devtools.harness import die_with_parent, machine, percentile, stop_process

GPUS = 8
GPU_MIB = 16384
"""Each GPU of the node: 16 GiB, as in devtools/deviceplugin/gpus-gpushare.yaml."""
SPLIT_COUNT = 10
"""HAMi's deviceSplitCount (the chart's default): pods a GPU holds at most."""
POD_MIB = 1024
"""What each pod asks: 1 GiB (gpushare: one unit of aliyun.com/gpu-mem, its unit being GiB)."""
SCHEDULER_NAME = {"gpushare": "gpu-scheduler", "hami": "hami-scheduler"}
LABEL = "gpu-extender.io/node-burst"
RUN_TIMEOUT = 900.0
"""Seconds for every pod of a run to be Running before the run is called failed (`--timeout`): hami-scheduler's
binds wait for its node lock, up to kube-scheduler's 30 s for the call, so its runs take minutes on one node."""
SETTLE_LOAD = float(os.cpu_count() or 1)
SETTLE_MAX = 240.0
"""Before each run, wait until the 1-minute load average is below the number of cores (the last run's containers
torn down, the install's pods started), at most `SETTLE_MAX` seconds: runs then begin on a machine about as
quiet, and each run line says the load it began at."""
NODE_WAIT = 60.0
"""Seconds for hami-scheduler to listen and handshake, and for its kube-scheduler to be ready."""
HAMI_LOCK = "hami.io/mutex.lock"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_BIND_PHASE = "hami.io/bind-phase"
GPUSHARE_INDEX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD = "ALIYUN_COM_GPU_MEM_POD"


class BurstError(RuntimeError):
    """A run could not be made (an install, a scheduler that does not start, pods not Running in time)."""


BEGAN = time.monotonic()


def say(what: str) -> None:
    """A progress line on stderr: seconds since the start, the machine's 1-minute load average, what happens."""
    print(f"[{time.monotonic() - BEGAN:6.0f} s, load {os.getloadavg()[0]:.1f}] {what}", file=sys.stderr, flush=True)


# ---- what is created ---------------------------------------------------------------------------------------


def gpus_file(protocol: str, gpus: int = GPUS) -> str:
    """The device-plugin double's GPUs file (devtools/deviceplugin/gpus.py) for `protocol`: `gpus` GPUs of
    `GPU_MIB`; in HAMi's, its chart's node settings (hami-core mode, split count 10, no scaling)."""
    listed = [
        {"uuid": f"GPU-6f1c2a10-0000-4000-8000-{index:012d}", "index": index, "model": "Tesla V100-SXM2-16GB",
         "memory": GPU_MIB, "numa": 0}
        for index in range(gpus)
    ]  # fmt: skip
    if protocol == "gpushare":
        return yaml.safe_dump({"memoryUnit": "GiB", "gpus": listed}, sort_keys=False)
    hami = {"operatingMode": "hami-core", "deviceSplitCount": SPLIT_COUNT, "deviceMemoryScaling": 1,
            "deviceCoreScaling": 1, "libCudaLogLevel": "1", "enableGetPreferredAllocation": False}  # fmt: skip
    return yaml.safe_dump({"hami": hami, "gpus": listed}, sort_keys=False)


def burst_pods(protocol: str, run: str, count: int, image: str) -> list[dict[str, Any]]:
    """The run's pods: each asks `POD_MIB` of one GPU in the protocol's resources, for its second scheduler."""
    if protocol == "gpushare":
        limits = {"aliyun.com/gpu-mem": str(POD_MIB // 1024)}
    else:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(POD_MIB)}
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{run}-{number:03d}", "labels": {LABEL: run}},
            "spec": {
                "schedulerName": SCHEDULER_NAME[protocol],
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "work",
                        "image": image,
                        "command": ["sh", "-c", "nvidia-smi; exec sleep 3600"],
                        "resources": {"limits": limits},
                    }
                ],
            },
        }
        for number in range(count)
    ]


# ---- what is measured --------------------------------------------------------------------------------------


@dataclass(slots=True)
class PodTimes:
    """When the watch first saw a pod, saw it bound, saw it Running (time.monotonic). Mutable: filled by events."""

    added: float | None = None
    bound: float | None = None
    running: float | None = None


def note(times: dict[str, PodTimes], pod: dict[str, Any], at: float) -> None:
    """One watch event's pod, arrived at `at`: the first time it is seen, bound, Running."""
    seen = times.setdefault(pod["metadata"]["name"], PodTimes())
    if seen.added is None:
        seen.added = at
    if seen.bound is None and pod.get("spec", {}).get("nodeName"):
        seen.bound = at
    if seen.running is None and pod.get("status", {}).get("phase") == "Running":
        seen.running = at


@dataclass(frozen=True, slots=True)
class RunFigures:
    scheduler: str
    protocol: str
    number: int
    pods: int
    create_seconds: float
    """What `kubectl create -f` of the List took."""
    all_bound: float
    all_running: float
    """Seconds from just before `kubectl create` to the last pod bound, and to the last pod Running."""
    to_running: tuple[float, ...]
    """Each pod's seconds from its ADDED event to Running."""
    failed_scheduling: int
    """FailedScheduling events of the run's pods (their counts summed): tries that did not bind."""
    problems: tuple[str, ...] = ()
    load: float = 0.0
    """The machine's 1-minute load average just before the pods were created: other work on its cores."""

    @property
    def p50(self) -> float:
        return percentile(self.to_running, 0.5)

    @property
    def p90(self) -> float:
        return percentile(self.to_running, 0.9)


def figures(started: float, times: dict[str, PodTimes], count: int) -> tuple[float, float, tuple[float, ...]]:
    """(all bound, all Running, each pod's creation to Running) in seconds; a BurstError when a pod was missed."""
    running = [t for t in times.values() if t.running is not None and t.added is not None and t.bound is not None]
    if len(running) < count:
        raise BurstError(f"{len(running)} of {count} pods seen Running")
    all_bound = max(t.bound for t in running if t.bound is not None) - started
    all_running = max(t.running for t in running if t.running is not None) - started
    each = tuple(sorted(t.running - t.added for t in running if t.running is not None and t.added is not None))
    return all_bound, all_running, each


# ---- judged from the API and from the device plugin's record -----------------------------------------------


def _annotations(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("annotations") or {})


def _records_of(live: list[dict[str, Any]], records: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The problems of the plugin's record for the live pods (refused, no GPU, served twice), and their records."""
    uids = {pod["metadata"]["uid"] for pod in live}
    mine = [record for record in records if record.get("uid") in uids]
    problems = [f"the device plugin refused or gave no GPU: {r['pod']}: {r['reason'] or 'refused'}"
                for r in mine if not r["accepted"] or r["reason"] or not r["gpus"]]  # fmt: skip
    served = Counter((record["uid"], record.get("container")) for record in mine)  # HAMi's: one per container
    problems += [f"a pod allocated {times} times: {uid}" for (uid, _), times in served.items() if times > 1]
    return problems, mine


def judge_gpushare(pods: list[dict[str, Any]], records: list[dict[str, Any]], gpu_units: int) -> list[str]:
    """test_operations.py's `judge`: no GPU over its memory by the pods' annotations nor by the plugin's record,
    the two naming the same GPUs, no pod refused or served twice. `pods`: the live pods on the node."""
    live = [pod for pod in pods if GPUSHARE_INDEX in _annotations(pod)]
    by_api: Counter[int] = Counter()
    for pod in live:
        by_api[int(_annotations(pod)[GPUSHARE_INDEX])] += int(_annotations(pod)[GPUSHARE_POD])
    problems, mine = _records_of(live, records)
    by_plugin: Counter[int] = Counter()
    for record in mine:
        for gpu in record["gpus"]:
            by_plugin[gpu["index"]] += gpu["memory"]
    problems += [f"GPU {gpu} over its memory by the API: {used}" for gpu, used in by_api.items() if used > gpu_units]
    problems += [f"GPU {g} over its memory by the plugin: {used}" for g, used in by_plugin.items() if used > gpu_units]
    if by_plugin != by_api:
        problems.append(f"the plugin gave other GPUs than the annotations name: {dict(by_plugin)} != {dict(by_api)}")
    return problems


def judge_hami(pods: list[dict[str, Any]], records: list[dict[str, Any]], gpu_mib: int, slots: int) -> list[str]:
    """The same in HAMi's protocol: the GPUs of `hami.io/vgpu-devices-allocated` (containers by `;`, devices by `:`,
    a device `uuid,type,memory,cores`), memory in MiB and pods per GPU within its split count, by the annotations
    and by the plugin's record; each pod's `hami.io/bind-phase` success."""
    live = [pod for pod in pods if _annotations(pod).get(HAMI_ALLOCATED)]
    memory: Counter[str] = Counter()
    shares: Counter[str] = Counter()
    problems = []
    for pod in live:
        for entry in _annotations(pod)[HAMI_ALLOCATED].split(";"):
            for device in filter(None, entry.split(":")):
                uuid, _kind, mib, _cores = device.split(",")
                memory[uuid] += int(mib)
                shares[uuid] += 1
        if _annotations(pod).get(HAMI_BIND_PHASE) != "success":
            problems.append(f"{pod['metadata']['name']}: {HAMI_BIND_PHASE} {_annotations(pod).get(HAMI_BIND_PHASE)}")
    more, mine = _records_of(live, records)
    problems += more
    by_plugin: Counter[str] = Counter()
    for record in mine:
        for gpu in record["gpus"]:
            by_plugin[gpu["uuid"]] += gpu["memory"]
    problems += [f"GPU {uuid} over its memory by the API: {mib}" for uuid, mib in memory.items() if mib > gpu_mib]
    problems += [f"GPU {uuid} over its split count: {n}" for uuid, n in shares.items() if n > slots]
    problems += [f"GPU {u} over its memory by the plugin: {mib}" for u, mib in by_plugin.items() if mib > gpu_mib]
    if by_plugin != memory:
        problems.append(f"the plugin gave other GPUs than the annotations name: {dict(by_plugin)} != {dict(memory)}")
    return problems


def without_gpu(protocol: str, pods: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """The run's pods that are not Running with a GPU: not Running, no allocation annotation, or no record of the
    plugin's giving them one."""
    given = {record["uid"] for record in records if record["accepted"] and record["gpus"]}
    key = GPUSHARE_INDEX if protocol == "gpushare" else HAMI_ALLOCATED
    return [
        pod["metadata"]["name"]
        for pod in pods
        if pod["status"].get("phase") != "Running"
        or not _annotations(pod).get(key)
        or pod["metadata"]["uid"] not in given
    ]


def annotations_restored(before: dict[str, str], after: dict[str, str], prefix: str = "hami.io/") -> dict[str, Any]:
    """The merge patch of a Node's annotations that puts back those under `prefix` as they were `before`."""
    keys = {key for key in (*before, *after) if key.startswith(prefix)}
    return {key: before.get(key) for key in sorted(keys) if before.get(key) != after.get(key)}


# ---- the cluster -------------------------------------------------------------------------------------------


class PodWatch:
    """A watch on the pods of one run, from the resourceVersion of a list made before they are created, each event
    stamped on arrival (`note`). Mutable: its thread fills `times` until `stop`."""

    def __init__(self, paths: Any, run: str, timeout: float) -> None:
        from devtools.cluster.clients import admin_token, api_context
        from devtools.cluster.pki import api_url

        selector = urllib.parse.quote(f"{LABEL}={run}")
        base = f"{api_url()}/api/v1/namespaces/default/pods?labelSelector={selector}"
        headers = {"Authorization": f"Bearer {admin_token(paths)}"}
        context = api_context(paths)
        with urllib.request.urlopen(urllib.request.Request(base, headers=headers), context=context) as answer:
            version = orjson.loads(answer.read())["metadata"]["resourceVersion"]
        watch = f"{base}&watch=1&resourceVersion={version}&timeoutSeconds={timeout + 120:.0f}"
        self.times: dict[str, PodTimes] = {}
        self.lock = threading.Lock()
        self._stopped = False
        self._answer = urllib.request.urlopen(urllib.request.Request(watch, headers=headers), context=context)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        """Until `stop` and the next event (deleting the run's pods brings one at once), or the watch's end. The
        answer is closed here: closed from another thread, it would wait for the read in progress to return."""
        with self._answer, contextlib.suppress(OSError, ValueError):
            for line in self._answer:
                at = time.monotonic()
                if self._stopped:
                    return
                event = orjson.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    with self.lock:
                        note(self.times, event["object"], at)

    def running(self) -> int:
        with self.lock:
            return sum(1 for t in self.times.values() if t.running is not None)

    def stop(self) -> None:
        self._stopped = True


def in_node_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 in the node's network namespace (held together while found)."""
    from devtools.cluster.network import in_node

    probe = (
        f"import socket\nheld = [socket.socket() for _ in range({count})]\n"
        "for s in held: s.bind(('127.0.0.1', 0))\nprint(' '.join(str(s.getsockname()[1]) for s in held))"
    )
    done = subprocess.run(in_node(sys.executable, "-c", probe), capture_output=True, text=True, check=True)
    return [int(word) for word in done.stdout.split()]


def listening_in_node(port: int) -> bool:
    from devtools.cluster.network import in_node

    done = subprocess.run(in_node("ss", "-Htln", f"sport = :{port}"), capture_output=True, text=True, check=False)
    return bool(done.stdout.strip())


class NodeHamiScheduler(peers.HamiProcess):
    """`peers.HamiProcess` in the node's network namespace: the same binary, flags and device configuration, on
    ports free there, reached by a kube-scheduler there."""

    def __init__(self, binary: Path, workdir: Path, kubeconfig: Path, extra: Sequence[str] = ()) -> None:
        super().__init__(binary, workdir, kubeconfig)
        self.port, self.metrics_port = in_node_ports(2)
        self.extra = tuple(extra)
        """Further flags, as its chart's `scheduler.extender.extraArgs` adds them."""

    def command(self) -> list[str]:
        from devtools.cluster.network import in_node

        metrics = f"--metrics-bind-address=127.0.0.1:{self.metrics_port}"
        argv = [metrics if arg.startswith("--metrics-bind-address=") else arg for arg in super().command()]
        return in_node(*argv, *self.extra)

    def start(self) -> None:
        self._spawn()
        deadline = time.monotonic() + NODE_WAIT
        while not listening_in_node(self.port):
            if not self.running() or time.monotonic() > deadline:
                self.stop()
                raise BurstError(f"{self.name} not listening on 127.0.0.1:{self.port} in the node; its log: {self.log}")
            time.sleep(0.2)


class Bench:
    """One invocation's runs on the cluster. Mutable: what it installed or started, to remove at the end."""

    def __init__(self, operator: Any, protocol: str, count: int, workdir: Path, timeout: float = RUN_TIMEOUT) -> None:
        self.operator = operator
        self.timeout = timeout
        self.paths = operator.paths
        self.protocol = protocol
        self.count = count
        self.workdir = workdir

    # ---- one run

    def run(self, scheduler: str, number: int) -> RunFigures:
        from tests.node.test_install import WORKLOAD_IMAGE

        name = f"burst-{scheduler}-{self.protocol}-{number}"
        settle = time.monotonic() + SETTLE_MAX
        while os.getloadavg()[0] >= SETTLE_LOAD and time.monotonic() < settle:
            time.sleep(5)
        say(f"{name}: {self.count} pods")
        pods = burst_pods(self.protocol, name, self.count, WORKLOAD_IMAGE)
        watch = PodWatch(self.paths, name, self.timeout)
        try:
            load = os.getloadavg()[0]
            started = time.monotonic()
            self.operator.kubectl("create", "-f", "-", input_text=yaml.safe_dump({"kind": "List", "apiVersion": "v1",
                                                                                   "items": pods}))  # fmt: skip
            create_seconds = time.monotonic() - started
            deadline = started + self.timeout
            while watch.running() < self.count:
                if time.monotonic() > deadline:
                    raise BurstError(f"{watch.running()} of {self.count} pods Running after {self.timeout:.0f} s")
                time.sleep(0.05)
            with watch.lock:
                all_bound, all_running, each = figures(started, dict(watch.times), self.count)
        finally:
            watch.stop()
        problems = self.judge(name)
        line = RunFigures(
            scheduler, self.protocol, number, self.count, create_seconds, all_bound, all_running, each,
            self.failed_scheduling(name), tuple(problems), load,
        )  # fmt: skip
        self.delete(name)
        return line

    def judge(self, run: str) -> list[str]:
        from devtools.cluster.layout import NODE_NAME

        everything = self.operator.get("pods", "-A")["items"]
        live = [
            pod
            for pod in everything
            if pod["spec"].get("nodeName") == NODE_NAME and pod["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        record = self.paths.state / "device-plugin.jsonl"
        records = [orjson.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
        records = [r for r in records if r.get("protocol") == self.protocol]
        mine = [pod for pod in everything if pod["metadata"].get("labels", {}).get(LABEL) == run]
        problems = [f"not Running with a GPU: {name}" for name in without_gpu(self.protocol, mine, records)]
        if self.protocol == "gpushare":
            return problems + judge_gpushare(live, records, GPU_MIB // 1024)
        return problems + judge_hami(live, records, GPU_MIB, SPLIT_COUNT)

    def failed_scheduling(self, run: str) -> int:
        events = self.operator.get("events", "--field-selector", "reason=FailedScheduling")["items"]
        return sum(int(e.get("count") or 1) for e in events if e["involvedObject"]["name"].startswith(f"{run}-"))

    def delete(self, run: str) -> None:
        self.operator.kubectl("delete", "pods", "-l", f"{LABEL}={run}", "--wait=true", "--timeout=180s", check=False)
        if self.protocol == "hami":
            from devtools.cluster.layout import NODE_NAME

            self.operator.wait(
                lambda: HAMI_LOCK not in _annotations(self.operator.get("node", NODE_NAME)),
                "the node lock released",
                60,
            )

    # ---- the schedulers

    @contextlib.contextmanager
    def ours(self) -> Iterator[None]:
        """The extender and its second scheduler, installed with the docs' commands as tests/node does."""
        from tests.node.operator import commands
        from tests.node.test_install import DOCS, ready, uninstall

        if self.protocol == "gpushare":
            kustomize = DOCS / "install" / "kustomize.md"
            (extender,) = commands(kustomize, "1. The extender")
            certificates = next(b for b in commands(kustomize, "2. Certificates") if "extender certs" in b)
            steps = [extender, certificates, commands(DOCS / "install" / "second-scheduler.md")[0]]
            folders = ["manifests/second-scheduler/", "manifests/"]
        else:
            install, scheduler = commands(DOCS / "protocols" / "hami.md", "Install in place of hami-scheduler")[:2]
            steps = [install.replace("    # or: kubectl apply -k manifests/cert-manager/", ""), scheduler]
            folders = ["manifests/hami/second-scheduler/", "manifests/hami/"]
        say(f"installing ours ({self.protocol}) with the docs' commands")
        try:
            for step in steps:
                self.operator.run(step, timeout=300)
            ready(self.operator, "gpu-extender")
            ready(self.operator, "gpu-scheduler")
            yield
        finally:
            say("uninstalling ours")
            self.operator.kubectl("delete", "pods", "-l", LABEL, "--wait=true", "--timeout=180s", check=False)
            uninstall(self.operator, folders)

    @contextlib.contextmanager
    def hami_scheduler(self, built: peers.Built, extra: Sequence[str] = ()) -> Iterator[None]:
        """hami-scheduler and its kube-scheduler in the node's network namespace, stopped at the end."""
        try:
            with (
                hami_extender(self.operator, built, self.workdir, extra) as peer,
                hami_kube_scheduler(self.operator, peer, self.workdir),
            ):
                yield
        finally:
            self.operator.kubectl("delete", "pods", "-l", LABEL, "--wait=true", "--timeout=180s", check=False)


@contextlib.contextmanager
def hami_extender(
    operator: Any, built: peers.Built, workdir: Path, extra: Sequence[str] = ()
) -> Iterator[NodeHamiScheduler]:
    """hami-scheduler (HAMi's extender, as its chart's Deployment runs it, the webhook off) in the node's network
    namespace, once it has shaken hands with the node's device plugin; stopped at the end."""
    from devtools.cluster.layout import NODE_NAME

    peer = NodeHamiScheduler(built.binary, workdir, operator.paths.kubeconfig("admin"), extra)
    say(f"starting hami-scheduler ({built.binary.name}) in the node's network namespace")
    try:
        peer.start()
        operator.wait(lambda: not peer.settled([operator.get("node", NODE_NAME)]),
                      f"{peer.name}'s handshake on {NODE_NAME}", NODE_WAIT)  # fmt: skip
        yield peer
    finally:
        peer.stop()
        if peer.crashes or (peer.popen is not None and peer.popen.returncode not in (0, -signal.SIGTERM)):
            print(f"hami-scheduler exited during the runs: {peer.crashes}; its log: {peer.log}", file=sys.stderr)


@contextlib.contextmanager
def hami_kube_scheduler(operator: Any, peer: NodeHamiScheduler, workdir: Path) -> Iterator[None]:
    """The kube-scheduler of hami-scheduler's Deployment (answering to `hami-scheduler`, calling `peer` as its
    chart wires it) in the node's network namespace, once ready; stopped at the end."""
    from devtools.cluster.network import in_node

    paths = operator.paths
    scheduler: subprocess.Popen[bytes] | None = None
    try:
        config = yaml.safe_load(peer.config(SCHEDULER_NAME["hami"]))
        config["clientConnection"] = {"kubeconfig": str(paths.kubeconfig("scheduler"))}
        config_file = workdir / "hami-kube-scheduler.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        (port,) = in_node_ports(1)
        kubeconfig = paths.kubeconfig("scheduler")
        argv = [
            str(paths.binaries / "kube-scheduler"), f"--config={config_file}", "--leader-elect=false",
            f"--secure-port={port}", "--bind-address=127.0.0.1", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--profiling=false", "--v=1",
        ]  # fmt: skip
        with (workdir / "hami-kube-scheduler.log").open("ab") as log:
            scheduler = subprocess.Popen(in_node(*argv), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)  # fmt: skip
        readyz = in_node("curl", "-sk", "--max-time", "2", f"https://127.0.0.1:{port}/readyz")
        deadline = time.monotonic() + NODE_WAIT
        while subprocess.run(readyz, capture_output=True, text=True, check=False).stdout.strip() != "ok":
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise BurstError(f"hami-scheduler's kube-scheduler not ready; its log: {log.name}")
            time.sleep(0.25)
        yield
    finally:
        if scheduler is not None:
            stop_process(scheduler)


@contextlib.contextmanager
def node_prepared(operator: Any, protocol: str, workdir: Path, gpus_count: int = GPUS) -> Iterator[None]:
    """The device-plugin double of `protocol` with `gpus_count` GPUs, and afterwards the one that ran before (its own
    GPUs file) and the node's `hami.io/` annotations as they were."""
    from devtools.cluster import addons, processes
    from devtools.cluster.layout import NODE_NAME

    paths = operator.paths
    pid = processes.pid_of(paths, "device-plugin")
    before_plugin = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if pid else []
    flags = dict(arg.decode().split("=", 1) for arg in before_plugin if arg.startswith(b"--") and b"=" in arg)
    before = _annotations(operator.get("node", NODE_NAME))
    gpus = workdir / f"gpus-{protocol}-{gpus_count}.yaml"
    gpus.write_text(gpus_file(protocol, gpus_count))
    say(f"device-plugin double: {protocol}, {gpus_count} GPUs ({gpus})")
    try:
        addons.start_device_plugin(paths, protocol, gpus)
        yield
    finally:
        say(f"device-plugin double as it was: {flags.get('--protocol', 'none')} ({flags.get('--gpus', '-')})")
        if "--protocol" in flags:
            addons.start_device_plugin(paths, flags["--protocol"], Path(flags["--gpus"]))
        else:
            processes.stop(paths, "device-plugin")
        patch = annotations_restored(before, _annotations(operator.get("node", NODE_NAME)))
        if patch:
            operator.kubectl("patch", "node", NODE_NAME, "--type=merge", "-p",
                             orjson.dumps({"metadata": {"annotations": patch}}).decode())  # fmt: skip


# ---- the report --------------------------------------------------------------------------------------------

HEADER = (
    "| scheduler | protocol | run | pods | kubectl create, s | all bound, s | all Running, s "
    "| pod to Running p50, s | p90, s | FailedScheduling | load | check |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)


def run_line(run: RunFigures) -> str:
    check = "passed" if not run.problems else f"FAILED ({len(run.problems)} problems)"
    return (
        f"| {run.scheduler} | {run.protocol} | {run.number} | {run.pods} | {run.create_seconds:.2f} "
        f"| {run.all_bound:.2f} | {run.all_running:.2f} | {run.p50:.2f} | {run.p90:.2f} "
        f"| {run.failed_scheduling} | {run.load:.1f} | {check} |"
    )


def as_record(run: RunFigures) -> dict[str, Any]:
    """A run as its record holds it: every figure of its line, and each pod's seconds to Running."""
    return {
        "scheduler": run.scheduler, "protocol": run.protocol, "run": run.number, "pods": run.pods,
        "create_seconds": run.create_seconds, "all_bound": run.all_bound, "all_running": run.all_running,
        "p50": run.p50, "p90": run.p90, "failed_scheduling": run.failed_scheduling, "load": run.load,
        "problems": list(run.problems), "to_running": list(run.to_running),
    }  # fmt: skip


def summary(runs: Sequence[RunFigures]) -> str:
    """Per scheduler and protocol: the median over runs of all Running (its range), and each pod's creation to
    Running over all runs' pods (p50, p90)."""
    lines = [
        "| scheduler | protocol | runs | all Running, s: median (range) | pod to Running p50, s | p90, s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key in dict.fromkeys((run.scheduler, run.protocol) for run in runs):
        kind = [run for run in runs if (run.scheduler, run.protocol) == key]
        totals = [run.all_running for run in kind]
        pooled = [seconds for run in kind for seconds in run.to_running]
        lines.append(
            f"| {key[0]} | {key[1]} | {len(kind)} | {statistics.median(totals):.2f} "
            f"({min(totals):.2f} - {max(totals):.2f}) | {percentile(pooled, 0.5):.2f} | {percentile(pooled, 0.9):.2f} |"
        )
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.node_burst", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--protocol", choices=sorted(SCHEDULER_NAME), required=True)
    parser.add_argument(
        "--peer", action="append", default=[], help="hami=DIR: hami-scheduler built from DIR, in place of ours."
    )
    parser.add_argument(
        "--peer-qps",
        type=int,
        help="hami-scheduler's API client raised to QPS requests a second, bursts of twice that (its flags "
        "--kube-qps and --kube-burst, which its chart sets through scheduler.extender.extraArgs); its chart's "
        "default is client-go's, 5 and 10. Reported as hami-scheduler-qpsQPS.",
    )
    parser.add_argument("--pods", type=int, default=64, help="Pods per run, created at once.")
    parser.add_argument("--runs", type=int, default=3, help="Runs per scheduler.")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help="Seconds for a run's pods to be Running.")
    parser.add_argument("--workdir", type=Path, help="Keep the logs here (default: a temporary directory).")
    recording.add_option(parser)
    arguments = parser.parse_args(argv)
    try:
        arguments.peer = peers.parse(arguments.peer)
    except ValueError as error:
        parser.error(str(error))
    if set(arguments.peer) - {"hami"} or (arguments.peer and arguments.protocol != "hami"):
        parser.error("--peer: only hami=DIR, with --protocol hami")
    if arguments.peer_qps is not None and (not arguments.peer or not 1 <= arguments.peer_qps <= 10_000):
        parser.error("--peer-qps: a number of requests a second, 1 to 10000, with --peer hami=DIR")
    if not 1 <= arguments.pods <= GPUS * SPLIT_COUNT or arguments.runs < 1:
        parser.error(f"--pods between 1 and {GPUS * SPLIT_COUNT} (what {GPUS} GPUs hold), --runs at least 1")
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse(argv)
    recording.settings(arguments, gpus=GPUS, gpu_mib=GPU_MIB, pod_mib=POD_MIB)
    if os.geteuid() != 0:
        print("node-burst: needs root (the cluster's network namespace)", file=sys.stderr)
        return 1
    from devtools.cluster import network, node
    from devtools.cluster.layout import Paths
    from devtools.cluster.processes import ClusterError, cluster_lock
    from tests.node.operator import Operator

    try:
        built = {name: peers.build(peers.PEERS[name], source) for name, source in arguments.peer.items()}
    except peers.PeerError as error:
        print(f"node-burst: {error}", file=sys.stderr)
        return 1
    workdir = arguments.workdir or Path(tempfile.mkdtemp(prefix="node-burst-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; logs in {workdir}", file=sys.stderr, flush=True)
    paths = Paths()
    runs: list[RunFigures] = []
    failures: list[str] = []
    with cluster_lock():
        brought_up = False
        try:
            if not node.is_up(paths):
                if network.exists() or paths.state.exists():
                    node.down(paths)
                node.up(paths, protocol=arguments.protocol)
                brought_up = True
            operator = Operator(paths)
            if operator.kubectl("get", "namespace", "gpu-extender", "--ignore-not-found"):
                raise BurstError("the namespace gpu-extender exists: something of ours is installed already")
            bench = Bench(operator, arguments.protocol, arguments.pods, workdir, arguments.timeout)
            if built and arguments.peer_qps:
                qps = arguments.peer_qps
                client = peers.client_flags(qps)
                schedulers = [(f"hami-scheduler-qps{qps}", bench.hami_scheduler(built["hami"], client))]
            elif built:
                schedulers = [("hami-scheduler", bench.hami_scheduler(built["hami"]))]
            else:
                schedulers = [("ours", bench.ours())]
            print(HEADER, flush=True)
            with node_prepared(operator, arguments.protocol, workdir):
                for scheduler, installed in schedulers:
                    with installed:
                        for number in range(1, arguments.runs + 1):
                            try:
                                run = bench.run(scheduler, number)
                            except (BurstError, AssertionError) as error:
                                failures.append(f"{scheduler}, run {number}: {error}")
                                with contextlib.suppress(AssertionError):
                                    bench.delete(f"burst-{scheduler}-{arguments.protocol}-{number}")
                                continue
                            runs.append(run)
                            failures += [f"{scheduler}, run {number}: {problem}" for problem in run.problems]
                            for problem in run.problems:
                                say(f"{scheduler}, run {number}: {problem}")
                            print(run_line(run), flush=True)
        except (BurstError, ClusterError, AssertionError, peers.PeerError, subprocess.SubprocessError) as error:
            failures.append(str(error))
        finally:
            if brought_up:
                try:
                    node.down(paths)
                except (ClusterError, OSError) as error:  # the report is printed all the same
                    failures.append(f"taking down the cluster brought up here: {error!r}; `make cluster-down` ends it")
    from devtools.cluster.layout import kubernetes_version

    kubelet = kubernetes_version()
    recording.settings({}, kubelet=kubelet)
    recording.result("runs", [as_record(run) for run in runs])
    recording.result("failures", failures)
    print(f"\n## Burst to Running: {arguments.pods} GPU pods created at once on one node (kubelet {kubelet})")
    print(f"\nMachine: {machine()}.\n\nNode: {GPUS} GPUs x {GPU_MIB // 1024} GiB, pods of {POD_MIB} MiB each.\n")
    if runs:
        print(summary(runs))
    if failures:
        print("\nFAILED:\n" + "\n".join(f"- {failure}" for failure in failures))
        print(f"logs in {workdir}")
        return 1
    if arguments.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.node_burst"))
