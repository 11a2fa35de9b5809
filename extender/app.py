"""Composition: build a Service from settings and a source, and run it until SIGTERM or SIGINT.

The one place that knows both the server and the sources; `cli`, `demo` and the benchmarks start the
service through here, so they run what production runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from extender.core.cache import Cache
from extender.core.groups import listed
from extender.core.ledger import Ledger
from extender.core.placement.learned import Learned
from extender.core.placement.placer import Placer
from extender.core.placement.workload import Workload
from extender.core.quota.book import Quotas
from extender.core.requeue import Requeue
from extender.service.context import Service, Source
from extender.service.limits import Limits
from extender.service.metrics import Metrics
from extender.service.pages import PROBES, build_health_server
from extender.service.tls import ReloadingContext
from extender.service.verbs import build_server
from extender.settings import Settings
from extender.sources.file import FileSource, load_cluster_file
from extender.sources.kube.client import KubeClient
from extender.sources.kube.config import KubeConfig
from extender.sources.kube.informer import WatchOptions
from extender.sources.kube.source import KubeOptions, KubeSource

log = logging.getLogger(__name__)


def build_service(
    settings: Settings, cache: Cache, quotas: Quotas, source: Source, ask: Callable[[str], None] | None
) -> Service:
    """The service over a cache, its quota book and the source that feeds them; `ask` requests kube-scheduler to
    retry the pods it rejected (None where nothing can: `core/requeue.py`). The placement policy starts learning
    the workload here, from the pods the cache already holds."""
    learned = Learned(cache, Workload(settings.workload_half_life))
    return Service(
        cache=cache,
        ledger=Ledger(cache, settings.reservation_ttl, quotas=quotas, group_ttl=settings.group_hold_ttl),
        placer=Placer(cache, settings.policy, learned),
        quotas=quotas,
        source=source,
        requeue=Requeue(cache, ask, quotas=quotas),
        metrics=Metrics(settings.gpu_metrics, settings.gpu_metrics_limit, settings.quota_metrics_limit),
        expiry_interval=settings.expiry_interval,
        http_timeout=settings.http_timeout,
        max_body_bytes=settings.max_body_bytes,
        limits=listener_limits(settings, settings.max_connections),
        health_limits=listener_limits(settings, settings.health_max_connections),
    )


def build_cache(settings: Settings, clock: Callable[[], float] = time.time) -> tuple[Cache, Quotas]:
    """An empty cache for the configured protocol, and the quota book that follows it."""
    cache = Cache(settings.device_protocol, settings.node_lock_timeout, clock)
    return cache, Quotas.following(cache)


def listener_limits(settings: Settings, max_connections: int) -> Limits:
    """One listener's deadlines and caps from the settings (`service/limits.py`)."""
    return Limits(
        max_connections=max_connections,
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        body_min_rate=settings.body_min_rate,
        idle_timeout=settings.idle_timeout,
        write_timeout=settings.write_timeout,
        handshake_timeout=settings.handshake_timeout,
    )


def file_service(settings: Settings, path: str) -> Service:
    """A service whose cache is the cluster file at `path` and whose binds update it in memory (its `source`
    is the `FileSource` that does)."""
    objects = load_cluster_file(path)
    cache, quotas = build_cache(settings)
    cache.replace(objects.nodes, objects.pods)
    cache.podgroups = listed(objects.podgroups)
    if settings.resource_quotas:
        quotas.replace(quotas.read(quota) for quota in objects.quotas)
    source = FileSource(cache, objects.pods)
    del objects
    settle_heap()
    log.info(
        "cluster file %s: %d nodes, %d pods, %d GPUs",
        path,
        sum(1 for state in cache.nodes.values() if state.known),
        len(cache.pods),
        sum(len(state.devices) for state in cache.nodes.values()),
    )
    return build_service(settings, cache, quotas, source, None)


def kube_options(settings: Settings, config: KubeConfig) -> KubeOptions:
    return KubeOptions(
        identity=settings.identity or f"{socket.gethostname()}_{uuid.uuid4()}",
        watch=WatchOptions(settings.list_page_size, settings.watch_timeout, settings.watch_inactivity),
        leader_elect=settings.leader_elect,
        lease_namespace=settings.lease_namespace or config.namespace,
        lease_name=settings.lease_name,
        timings=settings.lease_timings,
        pod_name=settings.pod_name,
        resource_quotas=settings.resource_quotas,
        pod_groups=settings.pod_groups,
    )


def kube_service(settings: Settings, client: KubeClient) -> tuple[Service, KubeSource]:
    """A service whose cache follows the API server through `client`, and the source that feeds it (not yet
    started: `await source.start()`)."""
    cache, quotas = build_cache(settings)
    source = KubeSource(client, cache, quotas, kube_options(settings, client.config))
    service = build_service(settings, cache, quotas, source, source.requeue if source.requeuer is not None else None)
    source.on_freed = service.requeue.freed
    source.on_quotas = service.requeue.quota_changed
    return service, source


async def serve_live(settings: Settings, tls: ReloadingContext | None, config: KubeConfig) -> None:
    """Serve from the API server until SIGTERM/SIGINT: the HTTP server stops first (binds under way finish),
    then the lease is given up and the watches end."""
    log.info("API server %s (%s)", config.server, config.source)
    async with KubeClient(config, timeout=settings.api_timeout) as client:
        service, source = kube_service(settings, client)
        await source.start()
        settle = asyncio.create_task(_settle_when_synced(source))
        try:
            await serve(service, settings, tls)
        finally:
            settle.cancel()
            await source.stop()


async def _settle_when_synced(source: KubeSource) -> None:
    await source.synced()
    settle_heap()


def settle_heap() -> None:
    """Collect what loading left behind, then freeze the survivors (the cache) out of the collector's scans.

    Measured with `make bench`: at 5,000 nodes and 80,000 pods a full collection of the unfrozen heap paused
    the service for 0.4-0.5 s in the middle of filter requests; after `gc.freeze()` such pauses vanish.
    """
    gc.collect()
    gc.freeze()


def keep_collections_short() -> None:
    """Freeze the survivors of every full collection out of the next ones' scans (for the serving process).

    Why. The cache grows after it settles (pods bound, pods created, records replaced), and CPython's full
    collection scans every object not frozen: in `make loadtest` (1,000 nodes, 300 pods/s) they came every few
    seconds and held the event loop 40 to 280 ms each, growing as the run went on; every request waiting
    meanwhile waited as long. What survives a full collection is, nearly all of it, the cache itself, alive for
    as long as its nodes and pods are: frozen, it costs the next full collections nothing, so each scans only
    what was made since the last one (a few ms).

    What it costs: an object frozen while alive that later becomes part of a reference cycle is never freed
    (refcounting still frees everything else). The code keeps its long-lived objects out of cycles for that
    reason (a connection lets go of its transport when it closes: `service/connection.py`).
    """

    if _freeze_after_full not in gc.callbacks:
        gc.callbacks.append(_freeze_after_full)


def _freeze_after_full(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


COLLECT_EVERY = 0.5
"""Seconds between the full collections `collect_often` makes: each scans only what was made since the last
(`keep_collections_short`), so at 300 pods/s it pauses the loop a few ms, where one left to come by itself, after
some thousands of pods, took 30 ms."""


async def collect_often() -> None:
    """Make the full collections small and frequent instead of rare and long (the serving process's chore)."""
    while True:
        await asyncio.sleep(COLLECT_EVERY)
        gc.collect()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop where installed (about 50 microseconds less per request, measured), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def server_tls(settings: Settings) -> ReloadingContext | None:
    """The serving TLS context from the settings' files (raises `TLSConfigError` at once if they are unusable),
    or None for plain HTTP."""
    if settings.insecure_http:
        log.warning("serving plain HTTP (--insecure-http): anyone who reaches this port can bind pods")
        return None
    return ReloadingContext(settings.tls_cert, settings.tls_key, settings.client_ca)


@dataclass(frozen=True, slots=True)
class Listeners:
    """The ports `serving` listens on (useful when the settings asked for port 0: any free one)."""

    port: int
    """The verbs' port (HTTPS unless --insecure-http)."""
    health_port: int
    """The plain-HTTP probes' port; 0 when `settings.health_port` asked for no such listener."""


@contextlib.asynccontextmanager
async def serving(service: Service, settings: Settings, tls: ReloadingContext | None) -> AsyncIterator[Listeners]:
    """Listen as `extender serve` does while the block runs: the health listener first (when
    `settings.health_port`), then the verbs' listener; on exit stop accepting, finish in-flight requests and
    close. With TLS, the files are checked for new contents every `tls_reload_interval` seconds meanwhile."""
    health = build_health_server(service) if settings.health_port else None
    if health is not None:  # first: the verbs' port never listens without it
        await health.start(settings.host, settings.health_port)
        paths = ", ".join(path for path, _ in PROBES)
        log.info("serving %s over plain http on %s:%d", paths, settings.host, health.port)
    server = build_server(service)
    if _freeze_after_full in gc.callbacks:  # the serving process (`keep_collections_short`), not a test's
        server.background = (*server.background, collect_often)
    if tls is not None:

        async def reload_tls_files() -> None:
            await tls.watch(settings.tls_reload_interval)

        server.background += (reload_tls_files,)
    try:
        await server.start(settings.host, settings.port, tls.listening if tls is not None else None)
    except BaseException:
        if health is not None:
            await health.stop(grace=0.0)
        raise
    log.info(
        "serving %s on %s:%d%s", settings.scheme, settings.host, server.port, " with mTLS" if settings.client_ca else ""
    )
    if tls is not None:
        log.info("serving certificate %s; files checked every %g s", tls.describe(), settings.tls_reload_interval)
    try:
        yield Listeners(server.port, health.port if health is not None else 0)
    finally:
        await server.stop(grace=10.0)
        if health is not None:
            await health.stop(grace=1.0)
        log.info("stopped")


async def serve(service: Service, settings: Settings, tls: ReloadingContext | None) -> None:
    """Serve (see `serving`) until SIGTERM/SIGINT, then shut down gracefully and return."""
    async with serving(service, settings, tls):
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
