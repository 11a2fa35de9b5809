"""`extender demo`: a burst of GPU pods placed through the real service, over HTTPS with mutual TLS.

It demonstrates, on one machine and in a few seconds, what the extender does in a cluster: it starts the
service through `extender.app.serving`, as `extender serve` does (the bundled demo cluster as its cache, a
certificate made on the spot, clients required to present a certificate the same CA signed) on a loopback
port, then drives it the way kube-scheduler does (`demo_scheduler`) with a reproducible burst of pods
(`demo_burst`). Pods that fit nowhere are reported with the reasons the filter gave. It ends with the
placement of every pod, the fill of every GPU (from `GET /inspect`), and a check that no GPU holds more memory
than it has (`demo_report`): a non-zero exit when one does, or when a request failed.

With `protocol=hami` it serves HAMi's protocol over a HAMi cluster (`demo_cluster_hami.yaml`, nodes as HAMi's
device plugin registers them) and plays a HAMi burst (memory in MiB or a share, compute, several GPUs, a GPU
model); the fill and the check then cover compute and pod slots too, and every bound pod must hold what it
asked, on a GPU of the model it chose.

This module only starts the service, runs the burst and prints; it talks to the service only over HTTP, as
the scheduler would, never reads or changes the cache directly, never builds a server of its own, and never
touches a real cluster.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import aiohttp

from extender.app import file_service, server_tls, serving
from extender.settings import Protocol, load
from extender.tools.certs import CertificateFiles, write_certificates
from extender.tools.demo_burst import make_burst, make_hami_burst
from extender.tools.demo_report import (
    dimension_lines,
    fill_table,
    fit,
    latency_lines,
    misplaced,
    never_fits,
    over_capacity,
    placements,
    pod_lines,
    unasked,
)
from extender.tools.demo_scheduler import DemoError, Scheduler

BUNDLED = {Protocol.GPUSHARE: "demo_cluster.yaml", Protocol.HAMI: "demo_cluster_hami.yaml"}
"""The cluster each protocol's demo plays on (in this package)."""


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


async def _play(
    pods: int, seed: int, cluster_path: Path, cluster_label: str, certificates: Path, protocol: Protocol
) -> int:
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
            "protocol": protocol.value,
        },
        env={},
    )
    tls = server_tls(settings)
    service = file_service(settings, str(cluster_path))
    async with serving(service, settings, tls) as listeners:
        connector = aiohttp.TCPConnector(ssl=_client_context(files))
        async with aiohttp.ClientSession(connector=connector) as session:
            url = f"https://{settings.host}:{listeners.port}"
            return await _drive(session, url, pods, seed, cluster_label, started, protocol)


async def _drive(
    session: aiohttp.ClientSession,
    url: str,
    count: int,
    seed: int,
    cluster_label: str,
    started: float,
    protocol: Protocol,
) -> int:
    hami = protocol is Protocol.HAMI
    scheduler = Scheduler(session, url)
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
    if hami:
        print("  protocol  hami: HAMi's device plugin, memory, compute and pods per GPU (its split count)")
    print("  per pod   POST /filter, /prioritize if more than one node fits, /bind in the background")
    print()

    burst = make_hami_burst(count, seed) if hami else make_burst(count, seed)
    burst_started = time.perf_counter()
    decisions = await scheduler.run(burst)
    burst_seconds = time.perf_counter() - burst_started
    after = await scheduler.call("GET", "/inspect")
    where = placements(after)

    legend = "; GPUs x memory on each, compute on each, use-gputype" if hami else ""
    print(f"Pods ({len(burst)}{legend}):")
    print("\n".join(pod_lines(burst, decisions, where, len(known))))
    print()
    print("GPUs after the burst:")
    print("\n".join(fill_table(after)))
    print()

    problems = over_capacity(after) + scheduler.filter_errors + misplaced(burst, decisions, where)
    if hami:
        problems += unasked(burst, decisions, after)
    placed = [decision for decision in decisions.values() if decision.node]
    unplaced = [decision for decision in decisions.values() if not decision.node]
    never = sum(1 for decision in unplaced if never_fits(decision, len(known)))
    split = sum(1 for decision in placed if decision.pod.gpus > 1)
    used_after = sum(node["used"] for node in after["nodes"] if node["known"])
    requests = sum(len(times) for times in scheduler.latency.values())
    print("Summary:")
    spread = f", {split} of them on more than one GPU" if hami else ""
    print(f"  placed    {len(placed)} of {len(burst)} pods{spread}")
    print(f"  unplaced  {len(unplaced)}: {never} fit no node ever, {len(unplaced) - never} found no room now")
    binds = len(scheduler.latency.get("bind", ()))
    print(f"  binds     {binds} sent, {scheduler.lost_races} retried after losing a race for the last room on a GPU")
    print(f"            {scheduler.overlapped} filters went out while an earlier bind was still in flight")
    percent = 100 * used_after // max(capacity, 1)
    print(f"  GPU mem   {used_after} of {capacity} {unit} in use ({percent}%), {used_before} {unit} before")
    for line in dimension_lines(before, after):  # none where GPUs track memory alone
        print(line)
    print(f"  requests  {requests} over HTTPS with mTLS:")
    print("\n".join(" " * 12 + line for line in latency_lines(scheduler.latency)))
    rate = len(burst) / max(burst_seconds, 1e-9)
    total = time.perf_counter() - started
    print(f"  time      burst {burst_seconds:.2f} s ({rate:.0f} pods/s); demo {total:.2f} s in all")
    if problems:
        print(f"  CHECK     FAILED: {len(problems)} problems")
        print("\n".join(fit(f"    {problem}") for problem in problems))
        return 1
    if hami:
        print("  check     no GPU holds more memory, compute or pods than it has; every bound pod is where /inspect")
        print("            shows it, with the memory and compute it asked, on a GPU of the model it chose")
        return 0
    print("  check     no GPU holds more memory than it has; every bound pod is where /inspect shows it")
    return 0


def run_demo(
    pods: int = 100, seed: int = 7, cluster_file: str | None = None, protocol: Protocol = Protocol.GPUSHARE
) -> int:
    """Play the burst and print the report; 0 when the invariant held and every request succeeded."""
    if pods < 1:
        print("extender demo: --pods must be at least 1")
        return 2
    with _quiet_service_logs(), tempfile.TemporaryDirectory(prefix="extender-demo-") as certificates:
        try:
            if cluster_file:
                return asyncio.run(_play(pods, seed, Path(cluster_file), cluster_file, Path(certificates), protocol))
            bundled = resources.files("extender.tools") / BUNDLED[protocol]
            label = "bundled HAMi demo cluster" if protocol is Protocol.HAMI else "bundled demo cluster"
            with resources.as_file(bundled) as path:
                return asyncio.run(_play(pods, seed, path, label, Path(certificates), protocol))
        except (DemoError, aiohttp.ClientError) as error:
            print(f"extender demo failed: {error}")
            return 1
