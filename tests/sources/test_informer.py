"""Informers against the API double: list, watch, relist on 410, retries; after each scenario the cache equals
the API's state and no device is over capacity."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from extender.core.cache import Cache
from extender.sources.kube.client import KubeClient
from extender.sources.kube.informer import NODES, Backoff, Informer, WatchOptions, pods_kind, slim_node
from tests.apidouble import ApiDouble
from tests.builders import PROFILE, bound_pod, make_node, make_pod
from tests.conftest import Running, double_config, eventually, start


def seed(api: ApiDouble) -> None:
    for name in ("n1", "n2", "n3"):
        api.add_node(make_node(name, gpus=2, mem=16))
    api.add_pod(bound_pod("a", "n1", (0,), 8))
    api.add_pod(bound_pod("b", "n1", (1,), 16))
    api.add_pod(bound_pod("c", "n2", (0,), 4))
    api.add_pod(make_pod("pending", gpu_mem=4))
    api.add_pod(make_pod("cpu-only", gpu_mem=None))


async def test_first_list_reads_every_page_into_the_cache(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    assert informers.differences(api) == []
    assert informers.cluster.nodes["n1"].used == [8, 16]
    pages = [path for method, path in api.requests if path.startswith("/api/v1/pods?") and "watch" not in path]
    assert len(pages) == 3  # 5 pods, 2 per page
    assert all("limit=2" in page for page in pages) and "continue=" in pages[1]


async def test_watch_applies_adds_changes_and_deletions(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    api.add_pod(bound_pod("d", "n3", (1,), 12))
    api.add_node(make_node("n4", gpus=1, mem=24))
    api.delete_pod("default", "a")
    api.delete_node("n2")  # its pod c still runs: the node's GPUs are unknown, c's hold stays
    await informers.settled(api)
    assert informers.cluster.nodes["n3"].used == [0, 12]
    assert informers.cluster.nodes["n1"].used == [0, 16]
    assert not informers.cluster.nodes["n2"].known and "uid" in str(informers.cluster.nodes["n2"].holds)
    assert informers.pods.lists == 1 and informers.pods.events >= 2


async def test_a_finished_pod_frees_its_memory(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    pod = api.pod("default", "b")
    assert pod is not None
    pod["status"]["phase"] = "Succeeded"
    api.update_pod(pod)  # leaves the watch's field selector: the server sends DELETED
    await informers.settled(api)
    assert informers.cluster.nodes["n1"].used == [8, 0]


async def test_a_dropped_watch_resumes_from_its_resource_version_without_a_relist(
    api: ApiDouble, informers: Running
) -> None:
    seed(api)
    await start(informers, api)
    version = informers.pods.resource_version
    api.drop_watches()
    api.add_pod(bound_pod("d", "n3", (1,), 12))
    await informers.settled(api)
    assert informers.pods.lists == 1
    assert any(f"resourceVersion={version}" in path and "watch" in path for _, path in api.requests[-6:])


async def test_an_in_stream_410_relists(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    api.expire_watches()
    await eventually(lambda: informers.pods.lists == 2 and informers.nodes.lists == 2, what="both relisted")
    await informers.settled(api)


async def test_deletions_missed_while_disconnected_are_seen_after_the_410_relist(
    api: ApiDouble, informers: Running
) -> None:
    seed(api)
    await start(informers, api)
    api.fail("GET", "/api/v1/pods", status=500, times=2)  # the watch cannot come back at once
    api.drop_watches()
    api.delete_pod("default", "b")  # never seen as an event
    api.add_pod(bound_pod("e", "n2", (1,), 16))
    api.compact()  # and the history that had it is gone: resuming gets 410
    await informers.settled(api)
    assert informers.pods.relists == 1
    assert informers.cluster.nodes["n1"].used == [8, 0]


async def test_list_failures_500_and_timeouts_are_retried(api: ApiDouble, kube: KubeClient) -> None:
    seed(api)
    api.fail("GET", "/api/v1/pods", status=500)
    api.fail("GET", "/api/v1/pods", mode="hang")
    api.fail("GET", "/api/v1/pods", status=429)
    cluster = Cache(PROFILE)
    async with KubeClient(double_config(api), timeout=0.3) as client:
        pods = Informer(
            client,
            pods_kind(PROFILE),
            cluster.apply_record,
            cluster.replace_records,
            WatchOptions(page_size=2),
            Backoff(0.01, 0.05),
        )
        task = asyncio.create_task(pods.run())
        try:
            await asyncio.wait_for(pods.synced.wait(), 5.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert pods.failures == 3
    assert set(cluster.pods) == {pod["metadata"]["uid"] for pod in api.pods()}


async def test_a_410_on_a_list_starts_it_again(api: ApiDouble, informers: Running) -> None:
    seed(api)
    api.fail("GET", "/api/v1/pods", status=410)
    await start(informers, api)
    assert informers.differences(api) == []


async def test_a_quiet_watch_is_opened_again_from_where_it_was_without_a_failure_or_a_warning(
    api: ApiDouble, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing changes, so the API sends nothing (not even a bookmark: the module's docstring): the watch's end is
    routine, as the server's timeout is, and the cache still follows the API."""
    caplog.set_level(logging.DEBUG, "extender.sources.kube.informer")
    seed(api)
    cluster = Cache(PROFILE)
    nodes = Informer(kube, NODES, cluster.apply_node, cluster.replace_nodes, WatchOptions(inactivity=0.2))
    task = asyncio.create_task(nodes.run())
    try:
        await asyncio.wait_for(nodes.synced.wait(), 5.0)
        version = nodes.resource_version
        await eventually(lambda: watches_from(api, version) >= 3, what="the quiet watch opened again, twice")
        assert nodes.current and nodes.failures == 0 and nodes.gap_began is None
        api.add_node(make_node("n9"))
        await eventually(lambda: "n9" in cluster.nodes, what="the watch opened again")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert nodes.lists == 1
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert any("watching again from resourceVersion" in record.getMessage() for record in caplog.records)


def watches_from(api: ApiDouble, version: str) -> int:
    return sum(1 for _, path in api.requests if "watch=1" in path and f"resourceVersion={version}&" in path + "&")


async def test_a_bookmark_moves_the_resource_version(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    api.add_node(make_node("n4"))
    await eventually(lambda: informers.nodes.resource_version == str(api.resource_version))
    api.add_node(make_node("n5"))  # a node event moves the pods' resourceVersion only by a bookmark
    api.bookmark()
    await eventually(lambda: informers.pods.resource_version == str(api.resource_version), what="bookmark")


async def test_a_huge_pod_is_read_and_only_its_fields_kept(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    pod = bound_pod("huge", "n3", (0,), 4)
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * 300_000
    api.add_pod(pod)
    await informers.settled(api)
    assert informers.cluster.nodes["n3"].used == [4, 0]


async def test_a_requested_relist_replaces_the_cache(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    target = informers.pods.request_relist()
    await eventually(lambda: informers.pods.last_list_started >= target, what="the requested relist")
    assert informers.pods.lists == 2
    await informers.settled(api)


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    backoff = Backoff(0.5, 4.0, random.Random(1))
    waits = [backoff.next() for _ in range(8)]
    assert 0.25 <= waits[0] <= 0.5 and 0.5 <= waits[1] <= 1.0
    assert all(2.0 <= wait <= 4.0 for wait in waits[3:])
    backoff.reset()
    assert backoff.next() <= 0.5


async def test_a_requested_relist_survives_a_failed_list(api: ApiDouble, informers: Running) -> None:
    seed(api)
    await start(informers, api)
    api.fail("GET", "/api/v1/pods", status=500)  # the relist's first attempt
    target = informers.pods.request_relist()
    await eventually(lambda: informers.pods.last_list_started >= target, what="the relist, after a retry")
    assert informers.pods.failures == 1


def test_a_slim_node_keeps_what_the_cache_reads_its_labels_too() -> None:
    """The GPU model is a node label (gpushare's `--model-label`): dropped here, every GPU would have no model
    and pods restricted to models would find none (tests/e2e/test_placement.py found it so)."""
    node = make_node("n1", model="T4")
    node["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    slim = slim_node(node)
    assert slim["metadata"]["labels"]["nvidia.com/gpu.product"] == "T4"
    assert "managedFields" not in slim["metadata"]
    assert slim["status"]["allocatable"] == node["status"]["allocatable"]
