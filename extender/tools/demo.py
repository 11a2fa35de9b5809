"""`extender demo`: a burst of GPU pods placed through the real service, over HTTPS with mutual TLS.

It demonstrates, on one machine and in a few seconds, what the extender does in a cluster: it starts the
service exactly as `serve` would (the bundled demo cluster as its cache, a certificate made on the spot,
clients required to present a certificate the same CA signed) on a loopback port, then drives it the way
kube-scheduler does. Per pod, one at a time: `POST /filter` with every node name, `POST /prioritize` when more
than one node passed, the best score wins, and `POST /bind` is sent in the background, so binds overlap the
next pods' filters as they do in kube-scheduler. A bind that lost a race for the last room on a GPU is retried
from the filter, as the scheduler requeues such a pod. Pods that fit nowhere are reported with the reasons the
filter gave. It ends with the placement of every pod, the fill of every GPU (from `GET /inspect`), and a check
that no GPU holds more memory than it has: a non-zero exit when one does, or when a request failed.

It talks to the service only over HTTP, as the scheduler would; it never reads or changes the cache directly,
and it never touches a real cluster.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from extender.app import file_service
from extender.service.tls import server_context
from extender.service.verbs import build_server
from extender.settings import load
from extender.tools.certs import CertificateFiles, write_certificates

Raw = dict[str, Any]

NAMESPACE = "demo"
SIZES: tuple[tuple[int, int], ...] = ((2, 18), (4, 18), (8, 18), (12, 12), (16, 12), (24, 8), (40, 4))
"""GiB asked on one GPU, and how often, relatively, pods of the burst ask it."""
SPLIT_SIZES = (16, 24, 40)
"""GiB per GPU of the pods that span two GPUs."""
NEVER_FITS = 96
"""GiB on one GPU: more than the largest GPU of the bundled cluster (80), so such a pod fits nowhere."""
VERBS = ("filter", "prioritize", "bind", "inspect")
MAX_ATTEMPTS = 3
"""Scheduling attempts per pod; a bind that lost its race is retried from the filter, as the scheduler does."""
BAR_WIDTH = 20
WIDTH = 100
"""Columns the report fits in."""


class DemoError(Exception):
    """A request the service should have answered with 200 did not; the message names the verb and the reply."""


# --- the burst --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BurstPod:
    """One pod of the burst: `memory` GiB in total, over `gpus` GPUs."""

    name: str
    uid: str
    memory: int
    gpus: int = 1

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"

    @property
    def size(self) -> str:
        return f"{self.memory} GiB" if self.gpus == 1 else f"{self.gpus}x{self.memory // self.gpus} GiB"


def make_burst(count: int, seed: int) -> list[BurstPod]:
    """`count` pods of mixed sizes, the same for the same seed: mostly one GPU, a few spanning two, and (from
    four pods up) a few asking more than any GPU has."""
    rng = random.Random(seed)
    never = 0 if count < 4 else max(1, count // 30)
    split = 0 if count < 4 else max(1, count // 15)
    special = rng.sample(range(count), never + split)
    sizes, weights = zip(*SIZES, strict=True)
    pods = []
    for number in range(count):
        memory, gpus = rng.choices(sizes, weights)[0], 1
        if number in special[:never]:
            memory = NEVER_FITS
        elif number in special[never:]:
            gpus = 2
            memory = gpus * rng.choice(SPLIT_SIZES)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pods.append(BurstPod(f"burst-{number + 1:03d}", uid, memory, gpus))
    return pods


def pod_object(pod: BurstPod) -> Raw:
    """The pod as kube-scheduler sends it: a pending pod as the API server stores it, with the GPU limits."""
    limits = {"aliyun.com/gpu-mem": str(pod.memory)}
    if pod.gpus > 1:
        limits["aliyun.com/gpu-count"] = str(pod.gpus)
    token_volume = f"kube-api-access-{pod.uid[:5]}"
    return {
        "metadata": {
            "name": pod.name,
            "namespace": NAMESPACE,
            "uid": pod.uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-11-20T09:00:00Z",
            "labels": {"app": "gpu-burst"},
            "managedFields": [
                {
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-20T09:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:resources": {}}}}},
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": token_volume,
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/gpu-burst:latest",
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [
                        {
                            "name": token_volume,
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


# --- playing kube-scheduler -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of scheduling one pod: the node it was bound to, or why none."""

    pod: BurstPod
    node: str = ""
    failed: Mapping[str, str] = field(default_factory=dict)
    """Nodes without room now (FailedNodes): preemption could help."""
    unresolvable: Mapping[str, str] = field(default_factory=dict)
    """Nodes that could never hold the pod (FailedAndUnresolvableNodes)."""
    error: str = ""
    """The last bind's (or filter's) Error, when the pod ended without a node."""
    attempts: int = 1


class Scheduler:
    """Plays kube-scheduler against the service: pods one at a time, binds in the background. Mutable."""

    def __init__(self, session: aiohttp.ClientSession, url: str, node_names: list[str]) -> None:
        self.session = session
        self.url = url
        self.node_names = node_names
        self.latency: dict[str, list[float]] = {}
        self.overlapped = 0
        """Filters sent while at least one earlier bind was still in flight."""
        self.lost_races = 0
        self.filter_errors: list[str] = []
        """Filter replies with a non-empty Error: the service refused to judge (not ready, bad pod)."""
        self._binds: set[asyncio.Task[None]] = set()
        self._queue: deque[tuple[BurstPod, int]] = deque()
        self.decisions: dict[str, Decision] = {}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        started = time.perf_counter()
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        async with self.session.request(method, self.url + path, data=data, headers=headers) as response:
            payload = await response.read()
        self.latency.setdefault(path.strip("/"), []).append(time.perf_counter() - started)
        if response.status != 200:
            raise DemoError(f"{method} {path}: HTTP {response.status}: {payload[:300].decode(errors='replace')}")
        return orjson.loads(payload)

    async def run(self, burst: list[BurstPod]) -> dict[str, Decision]:
        self._queue.extend((pod, 1) for pod in burst)
        try:
            while self._queue or self._binds:
                while self._queue:
                    pod, attempt = self._queue.popleft()
                    await self._schedule(pod, attempt)
                if self._binds:
                    await asyncio.gather(*self._binds)  # a failed bind puts its pod back in the queue
        finally:
            for task in self._binds:
                task.cancel()
            await asyncio.gather(*self._binds, return_exceptions=True)
        return self.decisions

    async def _schedule(self, pod: BurstPod, attempt: int) -> None:
        if any(not task.done() for task in self._binds):
            self.overlapped += 1
        args = {"Pod": pod_object(pod), "Nodes": None, "NodeNames": self.node_names}
        reply = await self.call("POST", "/filter", args)
        passed: list[str] = reply.get("NodeNames") or []
        decision = Decision(
            pod,
            failed=reply.get("FailedNodes") or {},
            unresolvable=reply.get("FailedAndUnresolvableNodes") or {},
            error=reply.get("Error") or "",
            attempts=attempt,
        )
        self.decisions[pod.uid] = decision
        if decision.error:
            self.filter_errors.append(f"filter of {pod.key} answered Error: {decision.error}")
            return
        if not passed:
            return
        node = passed[0]
        if len(passed) > 1:
            scores = await self.call("POST", "/prioritize", args)
            best = max(entry["Score"] for entry in scores)
            node = min(entry["Host"] for entry in scores if entry["Score"] == best)
        task = asyncio.create_task(self._bind(decision, node), name=f"bind {pod.key}")
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)

    async def _bind(self, decision: Decision, node: str) -> None:
        pod = decision.pod
        body = {"PodName": pod.name, "PodNamespace": NAMESPACE, "PodUID": pod.uid, "Node": node}
        error = (await self.call("POST", "/bind", body)).get("Error") or ""
        if not error:
            self.decisions[pod.uid] = Decision(pod, node, attempts=decision.attempts)
            return
        self.decisions[pod.uid] = Decision(pod, error=f"bind to {node}: {error}", attempts=decision.attempts)
        if decision.attempts < MAX_ATTEMPTS:
            # The scheduler requeues the pod; its queue orders by priority, then age, so it comes before later pods.
            self.lost_races += 1
            self._queue.appendleft((pod, decision.attempts + 1))


# --- what /inspect shows ----------------------------------------------------------------------------------


def placements(inspection: Raw) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Pod UID -> (node, device indexes), from GET /inspect."""
    found: dict[str, tuple[str, list[int]]] = {}
    for node in inspection["nodes"]:
        for device in node["devices"]:
            for holder in device["pods"]:
                found.setdefault(holder["uid"], (node["name"], []))[1].append(device["index"])
    return {uid: (node, tuple(sorted(indexes))) for uid, (node, indexes) in found.items()}


def over_capacity(inspection: Raw) -> list[str]:
    """Every GPU holding more than its capacity (or memory on a GPU the node lacks), as messages."""
    problems = []
    for node in inspection["nodes"]:
        for device in node["devices"]:
            if device["used"] > device["capacity"]:
                problems.append(f"{node['name']} GPU {device['index']}: used {device['used']} > {device['capacity']}")
        if node.get("stray"):
            problems.append(f"{node['name']}: {node['stray']} held on GPUs it does not have")
    return problems


def _bar(used: int, capacity: int) -> str:
    filled = round(BAR_WIDTH * used / capacity) if capacity else 0
    if used and not filled:
        filled = 1
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def fill_table(inspection: Raw) -> list[str]:
    unit = inspection.get("unit", "GiB")
    fill = "fill"
    lines = [f"  {'node':<13} {'GPU':>3} {'capacity':>9} {'used':>5} {'free':>5}  {fill:<{BAR_WIDTH + 7}} {'pods':>4}"]
    for node in inspection["nodes"]:
        if not node["known"]:
            continue
        name = node["name"]
        if not node["devices"]:
            lines.append(f"  {name:<13} {'-':>3}  no GPUs{': ' + node['problem'] if node['problem'] else ''}")
            continue
        for position, device in enumerate(node["devices"]):
            label = name if position == 0 else ""
            capacity, used, free = device["capacity"], device["used"], device["free"]
            if not device["healthy"]:
                lines.append(f"  {label:<13} {device['index']:>3} {'-':>9} {'-':>5} {'-':>5}  unhealthy")
                continue
            percent = f"{100 * used // capacity}%" if capacity else "-"
            lines.append(
                f"  {label:<13} {device['index']:>3} {capacity:>5} {unit} {used:>5} {free:>5}  "
                f"{_bar(used, capacity)} {percent:>4} {len(device['pods']):>4}"
            )
    return [_fit(line) for line in lines]


# --- the report -------------------------------------------------------------------------------------------


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _why_not(decision: Decision, nodes: int) -> list[str]:
    """Why a pod has no node: the filter's verdict over all nodes, then the most common reason."""
    attempt = f"attempt {decision.attempts}: " if decision.attempts > 1 else ""
    if decision.error:
        return ["NOT PLACED", f"{attempt}{decision.error}"]
    if len(decision.unresolvable) == nodes:
        verdict = f"unresolvable on all {_count(nodes, 'node')} (preemption cannot help)"
    else:
        no_room = len(set(decision.failed) - set(decision.unresolvable))
        verdict = f"no room now on {_count(no_room, 'node')}, unresolvable on {len(decision.unresolvable)}"
    # The nodes without room now are the ones that could take the pod later: their reasons matter most.
    no_room_now = {node: why for node, why in decision.failed.items() if node not in decision.unresolvable}
    reasons = Counter((no_room_now or decision.unresolvable).values())
    if not reasons:
        return [f"NOT PLACED: {verdict}"]
    reason, count = min(reasons.items(), key=lambda pair: (-pair[1], pair[0]))
    return [f"NOT PLACED: {verdict}", f"{attempt}{_count(count, 'node')} {'says' if count == 1 else 'say'}: {reason}"]


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def pod_lines(
    burst: list[BurstPod],
    decisions: Mapping[str, Decision],
    where: Mapping[str, tuple[str, tuple[int, ...]]],
    nodes: int,
) -> list[str]:
    lines = []
    for pod in burst:
        decision = decisions[pod.uid]
        head = f"  {pod.key:<16} {pod.size:>9}  "
        if decision.node:
            node, indexes = where.get(pod.uid, (decision.node, ()))
            gpus = ",".join(map(str, indexes)) or "?"
            retried = f"  (bound on attempt {decision.attempts})" if decision.attempts > 1 else ""
            lines.append(_fit(f"{head}-> {node:<13} GPU {gpus}{retried}"))
            continue
        first, *rest = _why_not(decision, nodes)
        lines.append(_fit(f"{head}{first}"))
        lines.extend(_fit(" " * 8 + line) for line in rest)
    return lines


def latency_lines(latency: Mapping[str, list[float]]) -> list[str]:
    lines = []
    for verb, times in sorted(latency.items(), key=lambda pair: VERBS.index(pair[0]) if pair[0] in VERBS else 9):
        ordered = sorted(times)
        median, slowest = ordered[len(ordered) // 2] * 1000, ordered[-1] * 1000
        lines.append(f"{verb:<11} {len(ordered):>4}   median {median:5.1f} ms   max {slowest:5.1f} ms")
    return lines


# --- running it -------------------------------------------------------------------------------------------


@contextmanager
def _quiet_service_logs() -> Iterator[None]:
    """The demo reports lost bind races itself; the service's warnings about them would only interleave."""
    logger = logging.getLogger("extender")
    previous = logger.level
    if previous == logging.NOTSET:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _client_context(files: CertificateFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca_certificate))
    context.load_cert_chain(files.client_certificate, files.client_key)
    return context


async def _play(pods: int, seed: int, cluster_path: Path, cluster_label: str, certificates: Path) -> int:
    started = time.perf_counter()
    files = write_certificates(certificates, dns_names=["localhost"], ips=["127.0.0.1"])
    settings = load(
        flags={
            "host": "127.0.0.1",
            "port": 0,
            "tls_cert": str(files.server_certificate),
            "tls_key": str(files.server_key),
            "client_ca": str(files.ca_certificate),
            "cluster": str(cluster_path),
        },
        env={},
    )
    service, _ = file_service(settings, str(cluster_path))
    server = build_server(service)
    try:
        context = server_context(settings.tls_cert, settings.tls_key, settings.client_ca)
        await server.start(settings.host, settings.port, context)
        port = server.port
        connector = aiohttp.TCPConnector(ssl=_client_context(files))
        async with aiohttp.ClientSession(connector=connector) as session:
            return await _drive(session, f"https://127.0.0.1:{port}", pods, seed, cluster_label, started)
    finally:
        await server.stop(grace=2.0)


async def _drive(
    session: aiohttp.ClientSession, url: str, count: int, seed: int, cluster_label: str, started: float
) -> int:
    scheduler = Scheduler(session, url, [])
    before = await scheduler.call("GET", "/inspect")
    known = [node for node in before["nodes"] if node["known"]]
    scheduler.node_names = [node["name"] for node in known]
    unit = before["unit"]
    gpus = sum(1 for node in known for device in node["devices"] if device["healthy"])
    capacity, used_before = sum(node["capacity"] for node in known), sum(node["used"] for node in known)
    print(f"extender demo: {count} GPU pods (seed {seed}), scheduled the way kube-scheduler does it")
    print(
        f"  cluster   {cluster_label}: {len(known)} nodes, {gpus} GPUs, {capacity} {unit}, {used_before} {unit} in use"
    )
    print(f"  extender  {url} with mTLS (client certificate CN=kube-scheduler from a demo CA)")
    print("  per pod   POST /filter, /prioritize if more than one node fits, /bind in the background")
    print()

    burst = make_burst(count, seed)
    burst_started = time.perf_counter()
    decisions = await scheduler.run(burst)
    burst_seconds = time.perf_counter() - burst_started
    after = await scheduler.call("GET", "/inspect")
    where = placements(after)

    print(f"Pods ({len(burst)}):")
    print("\n".join(pod_lines(burst, decisions, where, len(known))))
    print()
    print("GPUs after the burst:")
    print("\n".join(fill_table(after)))
    print()

    problems = over_capacity(after) + scheduler.filter_errors
    for pod in burst:
        node = decisions[pod.uid].node
        shown = where.get(pod.uid, ("nowhere",))[0]
        if node and shown != node:
            problems.append(f"{pod.key} was bound to {node} but /inspect shows it on {shown}")
    placed = [decision for decision in decisions.values() if decision.node]
    unplaced = [decision for decision in decisions.values() if not decision.node]
    never = sum(1 for decision in unplaced if len(decision.unresolvable) == len(known))
    split = sum(1 for decision in placed if decision.pod.gpus > 1)
    used_after = sum(node["used"] for node in after["nodes"] if node["known"])
    requests = sum(len(times) for times in scheduler.latency.values())
    print("Summary:")
    print(f"  placed    {len(placed)} of {len(burst)} pods, {split} of them on 2 GPUs each")
    print(f"  unplaced  {len(unplaced)}: {never} fit no node ever, {len(unplaced) - never} found no room now")
    binds = len(scheduler.latency.get("bind", ()))
    print(f"  binds     {binds} sent, {scheduler.lost_races} retried after losing a race for the last room on a GPU")
    print(f"            {scheduler.overlapped} filters went out while an earlier bind was still in flight")
    percent = 100 * used_after // max(capacity, 1)
    print(f"  GPU mem   {used_after} of {capacity} {unit} in use ({percent}%), {used_before} {unit} before")
    print(f"  requests  {requests} over HTTPS with mTLS:")
    print("\n".join(" " * 12 + line for line in latency_lines(scheduler.latency)))
    rate = len(burst) / max(burst_seconds, 1e-9)
    total = time.perf_counter() - started
    print(f"  time      burst {burst_seconds:.2f} s ({rate:.0f} pods/s); demo {total:.2f} s in all")
    if problems:
        print(f"  CHECK     FAILED: {len(problems)} problems")
        print("\n".join(_fit(f"    {problem}") for problem in problems))
        return 1
    print("  check     no GPU holds more memory than it has; every bound pod is where /inspect shows it")
    return 0


def run_demo(pods: int = 100, seed: int = 7, cluster_file: str | None = None) -> int:
    """Play the burst and print the report; 0 when the invariant held and every request succeeded."""
    if pods < 1:
        print("extender demo: --pods must be at least 1")
        return 2
    with _quiet_service_logs(), tempfile.TemporaryDirectory(prefix="extender-demo-") as certificates:
        try:
            if cluster_file:
                return asyncio.run(_play(pods, seed, Path(cluster_file), cluster_file, Path(certificates)))
            bundled = resources.files("extender.tools") / "demo_cluster.yaml"
            with resources.as_file(bundled) as path:
                return asyncio.run(_play(pods, seed, path, "bundled demo cluster", Path(certificates)))
        except (DemoError, aiohttp.ClientError) as error:
            print(f"extender demo failed: {error}")
            return 1
