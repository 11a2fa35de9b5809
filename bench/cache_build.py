"""Benchmark: the live cache's first list, its memory, and the cost of one watch event.

A separate process plays the API server for a cluster of 5,000 nodes with 8 GPUs each and 100,000 pods
(by default): it serves pre-encoded list pages (`limit`/`continue`, 500 per page, what kube-apiserver serves
from its watch cache) and then holds the watches open. Each pod is a full object of the size a real one has
(labels, owner references, managedFields, volumes, tolerations, status conditions and container statuses:
about 3 KB of JSON), so decoding costs what it costs against a real cluster.

In this process, the real informers (our client, list, slim, `Cache.replace_*`) fill a real cache. Printed:
- the time from the first request to both informers synced, against the target (15 s);
- the process's resident memory before and after, against the target (500 MB for the cache);
- the time to apply one watch event (decoded line -> cache), mean and p99, against "well under 1 ms".

Run: `make bench` (after the request benchmark) or `python bench/cache_build.py --nodes 5000 --pods 100000`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import multiprocessing
import os
import random
import resource
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from bench import record as recording
from devtools.clustergen import generate
from devtools.harness import percentile
from extender.app import kube_service
from extender.core.cache import Cache
from extender.core.pods import PodRecord
from extender.core.protocols.gpushare import Profile
from extender.service.context import Service
from extender.service.metrics import Metrics
from extender.settings import GpuSeries, Settings
from extender.sources.kube.client import KubeClient
from extender.sources.kube.config import KubeConfig
from extender.sources.kube.informer import Informer

PAGE = 500
LIST_TARGET_SECONDS = 15.0
MEMORY_TARGET_MB = 500.0
PROFILE = Profile()


def realistic(pod: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Dress a generated pod in the fields a real one carries, so it is as big as one on the wire."""
    meta, spec = pod["metadata"], pod["spec"]
    name = meta["name"]
    owner = f"{name.rsplit('-', 1)[0]}-{rng.randrange(16**10):010x}"
    meta.update(
        {
            "generateName": owner + "-",
            "resourceVersion": str(rng.randrange(10**8)),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {"app": owner, "pod-template-hash": f"{rng.randrange(16**10):010x}", "team": "ml"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": owner,
                    "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-01T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                        "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}}},
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-01T10:00:05Z",
                    "fieldsType": "FieldsV1",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:phase": {}}},
                },
            ],
        }
    )
    container = spec["containers"][0]
    container.update(
        {
            "command": ["python", "-m", "train", "--epochs", "100"],
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "JOB", "value": name}],
            "volumeMounts": [
                {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                {"name": "data", "mountPath": "/data"},
            ],
            "terminationMessagePath": "/dev/termination-log",
            "imagePullPolicy": "IfNotPresent",
        }
    )
    spec.update(
        {
            "restartPolicy": "Always",
            "serviceAccountName": "default",
            "dnsPolicy": "ClusterFirst",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "volumes": [
                {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{name}"}},
            ],
        }
    )
    pod["status"] = {
        "phase": pod["status"]["phase"],
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": "2026-11-01T10:00:05Z"}
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": "10.0.0.1",
        "podIP": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
        "startTime": "2026-11-01T10:00:01Z",
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": 0,
                "image": container["image"],
                "imageID": "registry.example/gpu-job@sha256:" + "0" * 64,
                "containerID": "containerd://" + f"{rng.getrandbits(256):064x}",
                "started": True,
                "state": {"running": {"startedAt": "2026-11-01T10:00:04Z"}},
            }
        ],
        "qosClass": "Burstable",
    }
    return pod


def cluster_objects(nodes: int, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`nodes` 8-GPU nodes and `pods` pods: the GPU pods clustergen places (30% fill), topped up with CPU pods."""
    objects = generate(nodes, gpus_per_node=(8,), fill=0.3, seed=3)
    node_objects = [obj for obj in objects if obj["kind"] == "Node"]
    pod_objects = [obj for obj in objects if obj["kind"] == "Pod"][:pods]
    rng = random.Random(5)
    template = copy.deepcopy(pod_objects[0]) if pod_objects else None
    while template is not None and len(pod_objects) < pods:
        extra = copy.deepcopy(template)
        number = len(pod_objects) + 1
        extra["metadata"] = {"name": f"web-{number:07d}", "namespace": "web", "uid": str(uuid.UUID(int=number))}
        extra["spec"]["nodeName"] = node_objects[number % len(node_objects)]["metadata"]["name"]
        extra["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
        pod_objects.append(extra)
    return node_objects, [realistic(pod, rng) for pod in pod_objects]


def pages(kind: str, items: list[dict[str, Any]], version: str) -> list[bytes]:
    chunks = [items[start : start + PAGE] for start in range(0, len(items), PAGE)] or [[]]
    encoded = []
    for number, chunk in enumerate(chunks):
        meta: dict[str, Any] = {"resourceVersion": version}
        if number + 1 < len(chunks):
            meta["continue"] = str(number + 1)
        encoded.append(orjson.dumps({"kind": kind, "apiVersion": "v1", "metadata": meta, "items": chunk}))
    return encoded


def serve_pages(port: int, nodes: int, pods: int, ready: Any) -> None:
    """The API server's part, in its own process: pre-encoded list pages, then watches held open."""
    node_objects, pod_objects = cluster_objects(nodes, pods)
    served = {
        "/api/v1/nodes": pages("NodeList", node_objects, "1000"),
        "/api/v1/pods": pages("PodList", pod_objects, "1000"),
        # No quotas, as in a cluster without any; readiness waits for their first list too, so without this
        # page the cache never counts as filled and the bench waits forever.
        "/api/v1/resourcequotas": pages("ResourceQuotaList", [], "1000"),
    }
    size = sum(len(page) for page in served["/api/v1/pods"])
    del node_objects, pod_objects

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await asyncio.sleep(3600)
            return response
        number = int(request.query.get("continue") or 0)
        return web.Response(body=served[request.path][number], content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/nodes", handle)
    app.router.add_get("/api/v1/pods", handle)
    app.router.add_get("/api/v1/resourcequotas", handle)
    ready.put(size)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def build(port: int) -> tuple[float, Service, Informer[PodRecord]]:
    """The cache as `extender serve` builds it (`kube_service`: the source's informers and what they call)."""
    config = KubeConfig(server=f"http://127.0.0.1:{port}", source="bench API server")
    settings = Settings(insecure_http=True, leader_elect=False, identity="bench", list_page_size=PAGE).check()
    async with KubeClient(config, timeout=60.0) as client:
        service, source = kube_service(settings, client)
        started = time.perf_counter()
        await source.start()
        await source.synced()
        elapsed = time.perf_counter() - started
        await source.stop()
    return elapsed, service, source.pods


def event_costs(cluster: Cache, informer: Informer[PodRecord], count: int) -> tuple[list[float], list[float]]:
    """Per event, seconds to apply a decoded MODIFIED pod event, and to decode its line first."""
    rng = random.Random(9)
    _, sample = cluster_objects(20, 400)
    gpu_pods = [pod for pod in sample if "annotations" in pod["metadata"]]
    names = [state.name for state in cluster.nodes.values() if state.known]
    lines = []
    for number in range(count):
        pod = copy.deepcopy(rng.choice(gpu_pods))
        pod["metadata"]["uid"] = f"bench-event-{number % 2000}"
        pod["spec"]["nodeName"] = rng.choice(names)
        lines.append(orjson.dumps({"type": "MODIFIED", "object": pod}))
    applied, decoded = [], []
    for line in lines:
        started = time.perf_counter()
        event = orjson.loads(line)
        middle = time.perf_counter()
        informer._handle(event)
        ended = time.perf_counter()
        applied.append(ended - middle)
        decoded.append(ended - started)
    return applied, decoded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=20_000)
    recording.add_option(parser)
    arguments = parser.parse_args(argv)
    recording.settings(arguments)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    server = context.Process(target=serve_pages, args=(port, arguments.nodes, arguments.pods, ready), daemon=True)
    server.start()
    try:
        wire = ready.get(timeout=600)
        time.sleep(0.5)
        gc.collect()
        before = rss_mb()
        elapsed, service, informer = asyncio.run(build(port))
        cluster = service.cache
        gc.collect()
        after = rss_mb()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        known = sum(1 for state in cluster.nodes.values() if state.known)
        gpus = sum(len(state.devices) for state in cluster.nodes.values())
        holds = sum(len(state.holds) for state in cluster.nodes.values())
        listed = len(cluster.pods)
        applied, decoded = event_costs(cluster, informer, arguments.events)
        scrapes = scrape_costs(service)
    finally:
        server.kill()  # no graceful stop: its open watches would only print their cancellation
        server.join(10)
    cache = after - before
    recording.result(
        "cache",
        {
            "nodes": known, "gpus": gpus, "pods": listed, "holding_gpu_memory": holds, "wire_bytes": wire,
            "first_list_seconds": elapsed, "rss_before_mb": before, "rss_after_mb": after, "cache_mb": cache,
            "peak_mb": peak, "event_apply_seconds": applied, "event_decode_apply_seconds": decoded,
            "scrapes": {series: dict(zip(("seconds", "longest_hold", "bytes"), costs, strict=True))
                        for series, costs in scrapes.items()},
        },
    )  # fmt: skip
    print("\n## live cache: first list, memory, watch events\n")
    print(f"cluster: {known} nodes, {gpus} GPUs, {listed} pods ({holds} holding GPU memory)")
    print(f"pods list on the wire: {wire / 2**20:.0f} MB in {-(-arguments.pods // PAGE)} pages of {PAGE}")
    verdict = "met" if elapsed < LIST_TARGET_SECONDS else "MISSED"
    print(
        f"first list of nodes and pods into the cache: {elapsed:.1f} s "
        f"(target < {LIST_TARGET_SECONDS:.0f} s: {verdict})"
    )
    verdict = "met" if cache < MEMORY_TARGET_MB else "MISSED"
    print(
        f"resident memory: {before:.0f} MB before, {after:.0f} MB after (cache: {cache:.0f} MB, target < "
        f"{MEMORY_TARGET_MB:.0f} MB: {verdict}); peak while listing {peak:.0f} MB"
    )
    for label, samples in (("apply a decoded event", applied), ("decode and apply", decoded)):
        p99 = percentile(samples, 0.99)
        print(
            f"watch event, {label}: mean {statistics.fmean(samples) * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us "
            f"over {len(samples)} MODIFIED pod events"
        )
    for series, (seconds, longest, size) in scrapes.items():
        print(
            f"/metrics scrape with --gpu-metrics {series}: {seconds * 1e3:.0f} ms in all, the event loop held at most "
            f"{longest * 1e3:.1f} ms at a time; {size / 2**20:.1f} MB of text"
        )
    return 0


def scrape_costs(service: Service, repeats: int = 3) -> dict[str, tuple[float, float, int]]:
    """Per GPU series setting (every GPU's series, per node only, and the default: auto, per node beyond
    10,000 GPUs), the best of `repeats` of: seconds for one /metrics exposition over the service's cache, its
    quotas and the workload its placement learned from the pods listed, the longest
    stretch between two of its yields to the event loop (what a verb may wait behind), and its bytes."""
    costs = {}
    for series in (GpuSeries.GPU, GpuSeries.NODE, GpuSeries.AUTO):
        metrics = Metrics(series)
        for size in (2, 4, 4, 8, 16, 40):
            metrics.demands.record(size)
        best, shortest_longest, text = float("inf"), float("inf"), b""
        for _ in range(repeats):
            started = time.perf_counter()
            text, longest = asyncio.run(_timed_render(metrics, service))
            best = min(best, time.perf_counter() - started)
            shortest_longest = min(shortest_longest, longest)
        costs[series.value] = (best, shortest_longest, len(text))
    return costs


async def _timed_render(metrics: Metrics, service: Service) -> tuple[bytes, float]:
    """The exposition as /metrics renders it, and the longest time the loop went without a turn meanwhile."""
    longest, last = 0.0, time.perf_counter()
    rendering = asyncio.ensure_future(metrics.render_yielding(service.cache, service.quotas, service.placer.learned))
    while not rendering.done():
        await asyncio.sleep(0)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return rendering.result(), longest


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.cache_build"))
