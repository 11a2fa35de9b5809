"""Composition: build a Service from settings and a source, and run it until SIGTERM or SIGINT.

The one place that knows both the server and the sources; `cli`, `demo` and the benchmarks start the
service through here, so they run what production runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl

from aiohttp import web

from extender.cluster import Cluster
from extender.ledger import Ledger
from extender.server import Service, build_app
from extender.settings import Settings
from extender.sources.file import FileBinder, load_cluster_file
from extender.tls import server_context

log = logging.getLogger(__name__)


def file_service(settings: Settings, path: str) -> tuple[Service, FileBinder]:
    """A service whose cache is the cluster file at `path` and whose binds update it in memory."""
    objects = load_cluster_file(path)
    cluster = Cluster(settings.profile)
    cluster.replace(objects.nodes, objects.pods)
    binder = FileBinder(cluster, objects.pods)
    service = Service(
        cluster=cluster,
        ledger=Ledger(cluster, settings.reservation_ttl),
        binder=binder,
        policy=settings.policy,
        expiry_interval=settings.expiry_interval,
        max_body_bytes=settings.max_body_bytes,
    )
    log.info(
        "cluster file %s: %d nodes, %d pods, %d GPUs",
        path,
        sum(1 for state in cluster.nodes.values() if state.known),
        len(cluster.pods),
        sum(len(state.devices) for state in cluster.nodes.values()),
    )
    return service, binder


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.insecure_http:
        log.warning("serving plain HTTP (--insecure-http): anyone who reaches this port can bind pods")
        return None
    return server_context(settings.tls_cert, settings.tls_key, settings.client_ca)


async def serve(service: Service, settings: Settings, context: ssl.SSLContext | None) -> None:
    """Serve until SIGTERM/SIGINT, then stop accepting, finish in-flight requests and return."""
    runner = web.AppRunner(build_app(service), handle_signals=False, access_log=None, shutdown_timeout=10.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=context)
    await site.start()
    log.info(
        "serving %s on %s:%d%s",
        settings.scheme,
        settings.host,
        settings.port,
        " with mTLS" if settings.client_ca else "",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        log.info("signal received: shutting down gracefully")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
        log.info("stopped")
