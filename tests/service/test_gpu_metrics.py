"""Per-GPU, per-node and fragmentation metrics: the same figures /inspect shows, in a valid exposition."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from extender.core.cache import Cache
from extender.core.protocols.hami import lock_value
from extender.service.gpu_metrics import RecentDemands, render, stranded
from extender.settings import GpuSeries
from tests.builders import (
    bound_pod,
    learned_of,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_node,
    make_pod,
    running_hami_pod,
)
from tests.conftest import ClientFor, make_service

HAMI_FAMILIES = (
    "extender_gpu_cores_capacity",
    "extender_gpu_cores_used",
    "extender_gpu_slots",
    "extender_gpu_slots_used",
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition by name and labels; parsing it at all proves the text valid."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def cluster_in_use() -> Cache:
    """Two nodes: n1 with 2 x 16 (GPU 0 holds 10 and 4, GPU 1 holds 12), n2 with 1 x 24 (empty)."""
    return make_cluster(
        make_node("n1", gpus=2, mem=16),
        make_node("n2", gpus=1, mem=24),
        pods=(bound_pod("a", "n1", (0,), 10), bound_pod("b", "n1", (0,), 4), bound_pod("c", "n1", (1,), 12)),
    )


async def test_per_gpu_series_are_what_inspect_shows(client_for: ClientFor) -> None:
    client = await client_for(make_service(cluster_in_use()))
    inspection = await (await client.get("/inspect")).json()
    found = samples(await (await client.get("/metrics")).text())
    for node in inspection["nodes"]:
        for device in node["devices"]:
            labels = (("gpu", str(device["index"])), ("node", node["name"]))
            assert found["extender_gpu_memory_capacity", labels] == device["capacity"]
            assert found["extender_gpu_memory_used", labels] == device["used"]
            assert found["extender_gpu_memory_free", labels] == device["free"]
            assert found["extender_gpu_pods", labels] == len(device["pods"])
            assert found["extender_gpu_healthy", labels] == int(device["healthy"])
    assert found["extender_gpus", ()] == 3
    assert found["extender_gpu_memory_used_total", ()] == 26
    assert found["extender_gpu_memory_free_total", ()] == 2 + 4 + 24
    assert found["extender_node_gpu_largest_free", (("node", "n1"),)] == 4


async def test_fragmentation_is_measured_against_the_sizes_recently_asked(client_for: ClientFor) -> None:
    """Free pieces: 2 and 4 on n1, 24 on n2. Filters ask 3, 3, 3, 3, 8 per GPU: the median is 3, the p90 8.
    At 3 only the piece of 2 is stranded; at 8 the pieces of 2 and 4 are (6). The filter of 8 passes n2 alone,
    and its pod's 8 are held there until its bind comes (`core/assume.py`): 22 free in all, so 6 of 22."""
    client = await client_for(make_service(cluster_in_use()))
    for number, size in enumerate((3, 3, 3, 3, 8)):
        body = {"Pod": make_pod(f"p{number}", gpu_mem=size), "NodeNames": ["n1", "n2"]}
        await client.post("/filter", data=orjson.dumps(body))
    found = samples(await (await client.get("/metrics")).text())
    assert found["extender_demand_size", (("quantile", "0.5"),)] == 3
    assert found["extender_demand_size", (("quantile", "0.9"),)] == 8
    assert found["extender_gpu_memory_stranded", (("quantile", "0.5"),)] == 2
    assert found["extender_gpu_memory_stranded", (("quantile", "0.9"),)] == 6
    assert found["extender_gpu_memory_stranded_ratio", (("quantile", "0.9"),)] == pytest.approx(6 / 22)
    assert found["extender_node_gpu_memory_stranded", (("node", "n1"), ("quantile", "0.9"))] == 6
    assert found["extender_node_gpu_memory_stranded", (("node", "n2"), ("quantile", "0.9"))] == 0


def families(cache: Cache, series: GpuSeries, limit: int) -> set[str]:
    return {
        family.name
        for family in text_string_to_metric_families(
            render(cache, learned_of(cache), RecentDemands(), series, limit).decode()
        )
    }


@pytest.mark.parametrize(
    ("series", "limit", "per_gpu", "per_node"),
    [
        (GpuSeries.AUTO, 3, True, True),
        (GpuSeries.AUTO, 2, False, True),  # 3 GPUs is over the limit: per node only
        (GpuSeries.GPU, 0, True, True),
        (GpuSeries.NODE, 100, False, True),
        (GpuSeries.OFF, 100, False, False),
    ],
)
def test_cardinality_is_capped_by_the_setting(series: GpuSeries, limit: int, per_gpu: bool, per_node: bool) -> None:
    names = families(cluster_in_use(), series, limit)
    assert ("extender_gpu_memory_used" in names) is per_gpu
    assert ("extender_node_gpu_memory_free" in names) is per_node
    assert {"extender_gpus", "extender_gpu_memory_stranded_ratio", "extender_gpu_series"} <= names


def test_stranded_counts_only_nonempty_pieces_smaller_than_the_size() -> None:
    assert stranded([0, 2, 4, 8, 24], 8) == 6
    assert stranded([5, 5], 0) == 0


def test_recent_demands_are_bounded_and_give_nearest_rank_quantiles() -> None:
    demands = RecentDemands(limit=4)
    for size in (100, 1, 2, 3, 4):
        demands.record(size)
    demands.record(0)  # a pod without GPU memory is no demand size
    assert len(demands) == 4 and (demands.quantile(0.5), demands.quantile(0.9)) == (2, 4)
    assert RecentDemands().quantile(0.5) == 0


def test_a_node_without_gpus_is_left_out_and_label_values_are_escaped() -> None:
    cache = make_cluster(make_node('odd"name', gpus=1, mem=8), make_node("cpu-only", gpus=0, mem=0))
    text = render(cache, learned_of(cache), RecentDemands(), GpuSeries.GPU, 10).decode()
    assert 'node="odd\\"name"' in text and "cpu-only" not in text
    found: dict[Any, float] = samples(text)
    assert found["extender_gpu_memory_free", (("gpu", "0"), ("node", 'odd"name'))] == 8


# --- what only HAMi's plugin tracks: compute, slots, the model, the node lock -----------------------------


def hami_cluster_in_use() -> Cache:
    """gpu-1: 2 A100s, locked now for default/waiting; GPU 0 holds a (10240 MiB, 30 %) and b (4096 MiB, 20 %).
    gpu-2: 1 L4, empty, not locked."""
    return make_hami_cluster(
        make_hami_node("gpu-1", gpus=2, **{"hami.io/mutex.lock": lock_value(time.time(), "default", "waiting")}),
        make_hami_node("gpu-2", gpus=1, mem=23034, model="NVIDIA L4"),
        pods=(running_hami_pod("a", "gpu-1", 0, 10240, 30), running_hami_pod("b", "gpu-1", 0, 4096, 20)),
    )


async def test_hami_series_are_what_inspect_shows(client_for: ClientFor) -> None:
    client = await client_for(make_service(hami_cluster_in_use()))
    inspection = await (await client.get("/inspect")).json()
    found = samples(await (await client.get("/metrics")).text())
    for node in inspection["nodes"]:
        assert found["extender_node_locked", (("node", node["name"]),)] == int("lock" in node)
        for device in node["devices"]:
            labels = (("gpu", str(device["index"])), ("model", device["model"]), ("node", node["name"]))
            assert found["extender_gpu_cores_capacity", labels] == device["cores"]
            assert found["extender_gpu_cores_used", labels] == device["used_cores"]
            assert found["extender_gpu_slots", labels] == device["slots"]
            assert found["extender_gpu_slots_used", labels] == device["used_slots"]
            memory_labels = (("gpu", str(device["index"])), ("node", node["name"]))
            assert found["extender_gpu_memory_used", memory_labels] == device["used"]
    gpu0 = (("gpu", "0"), ("model", "NVIDIA A100-SXM4-40GB"), ("node", "gpu-1"))
    assert (found["extender_gpu_cores_used", gpu0], found["extender_gpu_slots_used", gpu0]) == (30 + 20, 2)
    assert found["extender_node_locked", (("node", "gpu-1"),)] == 1
    assert found["extender_node_locked", (("node", "gpu-2"),)] == 0


def test_a_stale_node_lock_counts_as_not_held() -> None:
    """HAMi's lock is taken over after the cache's lock timeout (300 s): it no longer holds the node."""
    stale = lock_value(time.time() - 301, "default", "gone")
    cache = make_hami_cluster(make_hami_node("gpu-1", gpus=1, **{"hami.io/mutex.lock": stale}))
    found = samples(render(cache, learned_of(cache), RecentDemands(), GpuSeries.GPU, 10).decode())
    assert found["extender_node_locked", (("node", "gpu-1"),)] == 0


def test_gpushare_gpus_have_no_compute_slot_or_lock_series() -> None:
    names = families(cluster_in_use(), GpuSeries.GPU, 10)
    assert not names & {*HAMI_FAMILIES, "extender_node_locked"}
    assert "extender_gpu_memory_used" in names


@pytest.mark.parametrize(
    ("series", "per_gpu", "per_node"),
    [(GpuSeries.GPU, True, True), (GpuSeries.NODE, False, True), (GpuSeries.OFF, False, False)],
)
def test_hami_series_follow_the_same_cardinality_cap(series: GpuSeries, per_gpu: bool, per_node: bool) -> None:
    names = families(hami_cluster_in_use(), series, 100)
    assert all((family in names) is per_gpu for family in HAMI_FAMILIES)
    assert ("extender_node_locked" in names) is per_node


async def test_the_placement_policys_measure_and_workload_are_on_metrics(client_for: ClientFor) -> None:
    """Two GPUs of 16 GiB, one holding 10: the 6 GiB left on it is fragment for both shapes the cluster runs (8 and
    10 GiB, a half each), so 6/16 GPU; the empty GPU takes either."""
    pods = (bound_pod("a", "n1", (0,), 10), make_pod("b", gpu_mem=8))
    client = await client_for(make_service(make_cluster(make_node("n1", gpus=2), pods=pods)))
    text = await (await client.get("/metrics")).text()
    assert "extender_workload_shapes 2" in text
    assert "extender_fragmentation_gpus 0.375" in text
