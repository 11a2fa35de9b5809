"""`python -m bench.scale` (the last part of `make bench`): the extender at 5,000 nodes each filled differently,
with the cluster changing under it, and how long it ever holds its event loop.

Why it exists: issue 26. The other benchmarks run over a cluster file, where nothing changes but what the bench
binds, and over nodes that are alike; a big cluster is neither. Here:

- An API server double in a process of its own (`tests/apidouble.py`: lists, watches and bindings as
  kube-apiserver serves them) holds 5,000 nodes of 8 GPUs of 40 GiB, each GPU filled to a different level by
  running pods (`devtools.clustergen`, about 80,000 pods with their allocation annotations), 14 running pods per
  node that ask no GPU (daemonsets, services: 70,000 more, so the cache holds 150,000 pods), and the pods the
  bench schedules. With `--churn N`, N times a second it deletes a running pod and starts another, bound with
  its annotations, elsewhere: what finishing jobs and other schedulers do to a cluster, so the nodes change
  between requests and what the policy remembers of them goes cold.
- `extender serve` runs against it as it runs against a cluster (list, watch, bind through the API), with the
  defaults (the fragmentation policy, the filter narrowing to one node).
- This process plays kube-scheduler, one pod at a time: creates the pod (pending) in the API, filters it over
  every node's name (kube-scheduler's most: `--nodes-to-score 100`), binds it where the filter passed it. Pods
  of three repeating shapes (4, 8 and 16 GiB) or of shapes as varied as real requests are (1 to 39 GiB, cpu and
  memory drawn at random).
- Meanwhile a thread asks `/healthz` every 20 ms: how long a request that has nothing to do with placement
  waits behind one that has.

Printed per scenario: filter and bind p50/p99/max; `/healthz` p99/max; the longest the server's event loop was
held (its own probe, `extender_event_loop_lag_max_seconds`); server CPU per pod (filter and bind, and the watch
events meanwhile); resident memory. Numbers only: it never fails on a figure, only when a request fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import random
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from bench import record as recording
from bench.bench import Connection
from devtools.clustergen import generate
from devtools.harness import HOST, die_with_parent, free_port, machine, percentile
from extender.core.devices import Device
from extender.core.holds import Allocation
from extender.core.protocols.gpushare import Profile
from tests.apidouble import ApiDouble

PROFILE = Profile()
GPUS, GPU_GIB = 8, 40
THREE_SHAPES = ((4, "2", "8Gi"), (8, "4", "16Gi"), (16, "8", "32Gi"))
PING_EVERY = 0.02


# --- the API server double, in its own process ------------------------------------------------------------


class BenchDouble(ApiDouble):
    """The test double, with one route more: the bench creates its pending pods through it (`POST /bench/pods`)."""

    def _routes(self, router: web.UrlDispatcher) -> None:
        super()._routes(router)
        router.add_post("/bench/pods", self._bench_pod)

    async def _bench_pod(self, request: web.Request) -> web.Response:
        self.add_pod(orjson.loads(await request.read()))
        return web.Response(status=201)


def churned_pod(rng: random.Random, node: str, index: int, gib: int) -> dict[str, Any]:
    uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    name = f"churn-{uid[:8]}"
    allocation = Allocation.uniform(uid, f"default/{name}", node, (index,), gib)
    annotations = PROFILE.allocation_annotations(allocation, (Device(index, GPU_GIB),), 1_700_000_000.0)
    annotations[PROFILE.assigned_annotation] = "true"
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": {PROFILE.memory_resource: str(gib)}}}],
        },
        "status": {"phase": "Running"},
    }


def other_pod(node: str, number: int) -> dict[str, Any]:
    """A Running pod asking no GPU, bound to `node`: what daemonsets and services add to every node."""
    name = f"other-{node}-{number}"
    return {
        "metadata": {"name": name, "namespace": "kube-system", "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name))},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Running"},
    }


async def _serve_api(pipe: Pipe, nodes: int, churn: float, seed: int, others: int) -> None:
    double = BenchDouble(token=None, history=20_000)
    double.requests = _Discard()  # the double's request log would grow for hours
    objects = generate(nodes, gpus_per_node=(GPUS,), memory_per_gpu=(GPU_GIB,), fill=0.3, seed=seed)
    running: list[tuple[str, str, int, int]] = []  # (name, node, gpu, GiB) of the pods churn may delete
    used: dict[tuple[str, int], int] = {}
    for obj in objects:
        if obj["kind"] == "Node":
            double.add_node(obj)
            for number in range(others):
                double.add_pod(other_pod(obj["metadata"]["name"], number))
            continue
        double.add_pod(obj)
        node = obj["spec"]["nodeName"]
        gib = int(obj["spec"]["containers"][0]["resources"]["limits"][PROFILE.memory_resource])
        index = int(obj["metadata"]["annotations"][PROFILE.index_annotation])
        running.append((obj["metadata"]["name"], node, index, gib))
        used[node, index] = used.get((node, index), 0) + gib
    del objects
    url = await double.start()
    pipe.send((url, len(running) + nodes * others))
    rng = random.Random(f"churn-{seed}")  # a stream of its own: pod UIDs drawn from it must not repeat another's
    names = sorted({node for node, _ in used})
    while True:
        await asyncio.sleep(1.0 / churn if churn else 3600.0)
        if not churn:
            continue
        position = rng.randrange(len(running))
        name, node, index, gib = running[position]
        running[position] = running[-1]
        running.pop()
        with contextlib.suppress(KeyError):
            double.delete_pod("default", name)
        used[node, index] -= gib
        for _ in range(20):  # start another where it fits
            node, index, gib = rng.choice(names), rng.randrange(GPUS), rng.randint(1, 12)
            if used.get((node, index), 0) + gib <= GPU_GIB:
                pod = churned_pod(rng, node, index, gib)
                double.add_pod(pod)
                used[node, index] = used.get((node, index), 0) + gib
                running.append((pod["metadata"]["name"], node, index, gib))
                break


class _Discard(list[Any]):
    def append(self, item: Any) -> None:
        pass


def serve_api(pipe: Pipe, nodes: int, churn: float, seed: int, others: int) -> None:
    die_with_parent()
    asyncio.run(_serve_api(pipe, nodes, churn, seed, others))


# --- the extender ---------------------------------------------------------------------------------------------


@dataclass
class Extender:
    process: Any
    port: int

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}{path}", timeout=60) as response:
            return bytes(response.read())

    def cpu_seconds(self) -> float:
        total = 0
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metric(self, name: str) -> float:
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return float("nan")


def start_extender(api: str, workdir: Path) -> Extender:
    import subprocess

    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: bench\n"
        f"clusters: [{{name: bench, cluster: {{server: '{api}'}}}}]\n"
        "users: [{name: bench, user: {}}]\n"
        "contexts: [{name: bench, context: {cluster: bench, user: bench, namespace: default}}]\n"
    )
    port = free_port()
    command = [
        sys.executable, "-m", "extender", "serve", "--kubeconfig", str(kubeconfig), "--insecure-http",
        "--no-leader-elect", "--host", HOST, "--port", str(port), "--log-level", "WARNING",
    ]  # fmt: skip
    log = (workdir / "extender.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    extender = Extender(process, port)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"extender exited: {(workdir / 'extender.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            if b"ready" in extender.get("/readyz"):
                return extender
        time.sleep(0.2)
    raise SystemExit("extender not ready in 10 minutes")


# --- kube-scheduler's part ----------------------------------------------------------------------------------


def pod_of(number: int, shapes: str, rng: random.Random, run: str) -> dict[str, Any]:
    if shapes == "three":
        gib, cpu, memory = THREE_SHAPES[number % 3]
    else:
        gib, cpu, memory = (
            rng.randint(1, 39),
            rng.choice(("500m", "1", "2", "4", "8")),
            rng.choice(("1Gi", "4Gi", "16Gi")),
        )
    uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return {
        "metadata": {"name": f"{run}-{number:05d}", "namespace": "default", "uid": uid},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {PROFILE.memory_resource: str(gib)},
                        "requests": {"cpu": cpu, "memory": memory},
                    },
                }
            ]
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class Pinger:
    """Asks /healthz every PING_EVERY seconds on a connection of its own, and keeps how long each took."""

    port: int
    seconds: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        connection = Connection(self.port)
        request = f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
        while not self.stop.is_set():
            started = time.perf_counter()
            connection.exchange(request)
            self.seconds.append(time.perf_counter() - started)
            time.sleep(PING_EVERY)


@dataclass
class Scenario:
    label: str
    filter: list[float] = field(default_factory=list)
    bind: list[float] = field(default_factory=list)
    ping: list[float] = field(default_factory=list)
    lag_max: float = 0.0
    cpu_per_pod_ms: float = 0.0
    rss_mib: float = 0.0
    placed: int = 0
    refused: int = 0


def schedule(extender: Extender, api: str, pods: int, shapes: str, seed: int, label: str) -> Scenario:
    # A stream of its own: one seeded like the cluster's generator (devtools.clustergen) drew the UIDs of the
    # running pods, and a pod scheduled here under one of them was refused at its bind as the other pod.
    rng = random.Random(f"schedule-{shapes}-{seed}")
    scenario = Scenario(label)
    nodes = orjson.loads(urllib.request.urlopen(f"{api}/api/v1/nodes", timeout=60).read())["items"]
    names = [node["metadata"]["name"] for node in nodes]
    connection = Connection(extender.port)
    pinger = Pinger(extender.port)
    thread = threading.Thread(target=pinger.run, daemon=True)
    thread.start()
    extender.get("/metrics")  # starts the loop's longest hold over (`service/lag.py`)
    cpu_before = extender.cpu_seconds()
    for number in range(pods):
        pod = pod_of(number, shapes, rng, label.split()[0])
        urllib.request.urlopen(urllib.request.Request(f"{api}/bench/pods", data=orjson.dumps(pod)), timeout=60)
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        started = time.perf_counter()
        status, reply = connection.exchange(_post("/filter", body, extender.port))
        scenario.filter.append(time.perf_counter() - started)
        passed = orjson.loads(reply).get("NodeNames") or []
        if status != 200:
            raise SystemExit(f"filter answered {status}: {reply[:300]!r}")
        if not passed:
            scenario.refused += 1
            continue
        meta = pod["metadata"]
        binding = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": passed[0]}
        started = time.perf_counter()
        status, reply = connection.exchange(_post("/bind", orjson.dumps(binding), extender.port))
        scenario.bind.append(time.perf_counter() - started)
        if status != 200 or orjson.loads(reply).get("Error"):
            raise SystemExit(f"bind answered {status}: {reply[:300]!r}")
        scenario.placed += 1
    scenario.cpu_per_pod_ms = (extender.cpu_seconds() - cpu_before) / pods * 1e3
    pinger.stop.set()
    thread.join(5)
    scenario.ping = pinger.seconds
    scenario.lag_max = extender.metric("extender_event_loop_lag_max_seconds")
    scenario.rss_mib = extender.rss_mib()
    return scenario


def _post(path: str, body: bytes, port: int) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def ms(values: list[float], fraction: float) -> str:
    return f"{percentile(values, fraction) * 1e3:.1f}" if values else "-"


def report(scenarios: list[Scenario], nodes: int, churn: float) -> None:
    print(f"\n## scale: {nodes:,} nodes of {GPUS} x {GPU_GIB} GiB, each filled differently; churn {churn:g} pods/s\n")
    print(f"Machine: {machine()}. One pod at a time: created, filtered over every node's name, bound.\n")
    print(
        "| scenario | pods placed | refused (no node fits) | filter p50 ms | p99 | max | bind p50 ms | p99 | max "
        "| /healthz p99 ms | max | loop held at most, ms | server CPU ms/pod | RSS MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in scenarios:
        print(
            f"| {s.label} | {s.placed:,} | {s.refused:,} "
            f"| {ms(s.filter, 0.5)} | {ms(s.filter, 0.99)} | {ms(s.filter, 1.0)} "
            f"| {ms(s.bind, 0.5)} | {ms(s.bind, 0.99)} | {ms(s.bind, 1.0)} | {ms(s.ping, 0.99)} | {ms(s.ping, 1.0)} "
            f"| {s.lag_max * 1e3:.1f} | {s.cpu_per_pod_ms:.2f} | {s.rss_mib:,.0f} |"
        )
    print(
        "\nThe loop's longest hold is the server's own probe (`extender_event_loop_lag_max_seconds`, over the "
        "scenario: the first includes the first requests after the start). Target (DESIGN §8): no request holds "
        "the loop more than 50 ms."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=300, help="pods scheduled per scenario")
    parser.add_argument("--churn", type=float, default=20.0, help="running pods replaced per second meanwhile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--other-pods", type=int, default=14, help="running pods asking no GPU per node (150,000 pods in all at 5,000)"
    )
    recording.add_option(parser)
    arguments = parser.parse_args(argv)
    recording.settings(arguments)
    print(f"machine: {machine()}", file=sys.stderr, flush=True)
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    api_process = context.Process(
        target=serve_api,
        args=(theirs, arguments.nodes, arguments.churn, arguments.seed, arguments.other_pods),
        daemon=True,
    )
    api_process.start()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir:
        try:
            started = time.perf_counter()
            url, running = ours.recv()
            took = time.perf_counter() - started
            print(f"API double: {arguments.nodes:,} nodes, {running:,} running pods, in {took:.0f} s", file=sys.stderr)
            recording.result("running_pods", running)  # the pods in the cache besides the bench's own
            started = time.perf_counter()
            extender = start_extender(url, Path(workdir))
            print(f"extender ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
            scenarios = [
                schedule(extender, url, arguments.pods, "three", arguments.seed, "three shapes"),
                schedule(extender, url, arguments.pods, "varied", arguments.seed + 1, "varied shapes"),
            ]
            extender.process.terminate()
            extender.process.wait(10)
        finally:
            api_process.terminate()
    recording.result("scenarios", scenarios)
    report(scenarios, arguments.nodes, arguments.churn)
    return 0


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.scale"))
