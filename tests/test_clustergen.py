"""The cluster generator: what it writes loads back into a cache with the asked shape, within the invariant."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.clustergen import generate, main, write
from extender.core.cache import Cache
from extender.core.protocols.gpushare import Profile
from extender.sources.file import load_cluster_file

PROFILE = Profile()


def load(path: Path) -> Cache:
    objects = load_cluster_file(path)
    cluster = Cache(PROFILE)
    cluster.replace(objects.nodes, objects.pods)
    return cluster


def fill_of(cluster: Cache) -> float:
    capacity = sum(state.capacity_total for state in cluster.nodes.values())
    return sum(state.used_total for state in cluster.nodes.values()) / capacity


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_written_cluster_loads_with_every_node_and_gpu(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"cluster{suffix}"
    write(generate(50, gpus_per_node=(4, 8), memory_per_gpu=(16, 80), seed=3), path)

    cluster = load(path)

    assert len(cluster.nodes) == 50
    assert all(state.known and state.ready for state in cluster.nodes.values())
    assert {len(state.devices) for state in cluster.nodes.values()} == {4, 8}
    assert {state.devices[0].capacity for state in cluster.nodes.values()} == {16, 80}


def test_node_capacity_is_count_times_memory_per_gpu() -> None:
    # 2 GPUs of 24: capacity says gpu-count 2, gpu-mem 48 (the gpushare plugin's convention)
    (node,) = (item for item in generate(1, gpus_per_node=(2,), memory_per_gpu=(24,)) if item["kind"] == "Node")
    capacity = node["status"]["capacity"]
    assert capacity[PROFILE.count_resource] == "2"
    assert capacity[PROFILE.memory_resource] == "48"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == node["metadata"]["name"]


def test_every_pod_is_counted_by_the_cache(tmp_path: Path) -> None:
    objects = generate(30, seed=5)
    pods = [item for item in objects if item["kind"] == "Pod"]
    write(objects, tmp_path / "cluster.json")

    cluster = load(tmp_path / "cluster.json")

    assert len(cluster.pods) == len(pods)
    assert sum(len(state.holds) for state in cluster.nodes.values()) == len(pods)
    assert all(pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] for pod in pods)


@pytest.mark.parametrize("fill", [0.0, 0.3, 0.7, 1.0])
def test_no_device_is_overcommitted_and_fill_is_as_asked(tmp_path: Path, fill: float) -> None:
    write(generate(200, fill=fill, seed=11), tmp_path / "cluster.json")

    cluster = load(tmp_path / "cluster.json")

    assert cluster.overcommitted() == []
    assert fill_of(cluster) == pytest.approx(fill, abs=0.03)


def test_pod_uids_are_unique() -> None:
    uids = [item["metadata"]["uid"] for item in generate(100, seed=2) if item["kind"] == "Pod"]
    assert len(uids) == len(set(uids))


def test_same_seed_gives_the_same_cluster_and_another_seed_does_not() -> None:
    assert generate(20, seed=7) == generate(20, seed=7)
    assert generate(20, seed=7) != generate(20, seed=8)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"nodes": -1}, "nodes"),
        ({"nodes": 1, "gpus_per_node": (0,)}, "GPUs per node"),
        ({"nodes": 1, "memory_per_gpu": ()}, "memory per GPU"),
        ({"nodes": 1, "fill": 1.5}, "fill"),
    ],
)
def test_impossible_shapes_are_refused(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(**arguments)  # type: ignore[arg-type]


def test_unknown_suffix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="suffix"):
        write(generate(1), tmp_path / "cluster.txt")


def test_command_line_writes_a_loadable_file(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"

    assert main(["--nodes", "12", "--out", str(out), "--gpus", "2", "--memory", "16,40", "--seed", "4"]) == 0

    cluster = load(out)
    assert len(cluster.nodes) == 12
    assert all(len(state.devices) == 2 for state in cluster.nodes.values())
    assert cluster.overcommitted() == []
