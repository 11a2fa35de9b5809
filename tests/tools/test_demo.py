"""`extender demo`: the bundled cluster, the burst, and a whole run over HTTPS with mTLS."""

from __future__ import annotations

import gc
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.app import file_service
from extender.core.devices import Demand
from extender.settings import load
from extender.tools.demo import run_demo
from extender.tools.demo_burst import NEVER_FITS, make_burst, pod_object
from extender.tools.demo_report import fill_table
from tests.builders import bound_pod, make_node

BUNDLED = resources.files("extender.tools") / "demo_cluster.yaml"
SETTINGS = load(flags={"insecure_http": True}, env={})


def write_cluster(path: Path, *items: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(items)}))
    return str(path)


# --- the bundled cluster ----------------------------------------------------------------------------------


def test_bundled_cluster_loads_with_twelve_nodes_and_no_overcommitted_gpu() -> None:
    with resources.as_file(BUNDLED) as path:
        service, _ = file_service(SETTINGS, str(path))
    cluster = service.cache
    assert sum(1 for state in cluster.nodes.values() if state.known) == 12
    assert cluster.overcommitted() == []
    assert cluster.reserved == {}


def test_bundled_cluster_has_a_node_with_heterogeneous_devices_and_a_failed_one() -> None:
    with resources.as_file(BUNDLED) as path:
        service, _ = file_service(SETTINGS, str(path))
    mixed = service.cache.nodes["gpu-mixed-1"]
    assert [(device.capacity, device.healthy) for device in mixed.devices] == [
        (24, True),
        (24, True),
        (16, True),
        (0, False),
    ]


def test_bundled_cluster_counts_running_pods_and_frees_the_succeeded_one() -> None:
    with resources.as_file(BUNDLED) as path:
        service, _ = file_service(SETTINGS, str(path))
    nodes = service.cache.nodes
    assert nodes["gpu-h100-1"].used[:2] == [80, 80]
    assert nodes["gpu-v100-1"].used == [16, 16, 0, 0]  # one pod over two GPUs: 32 GiB split
    assert nodes["gpu-l4-2"].used_total == 0  # eval-job-41 Succeeded


# --- the burst --------------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_burst() -> None:
    assert make_burst(40, seed=3) == make_burst(40, seed=3)
    assert make_burst(40, seed=3) != make_burst(40, seed=4)


def test_a_burst_holds_pods_that_never_fit_and_pods_over_two_gpus() -> None:
    burst = make_burst(30, seed=7)
    assert len({pod.uid for pod in burst}) == 30
    assert sum(1 for pod in burst if pod.memory == NEVER_FITS) == 1
    assert sum(1 for pod in burst if pod.gpus == 2) == 2


def test_a_burst_pod_object_asks_what_the_pod_says() -> None:
    for pod in make_burst(30, seed=7):
        assert SETTINGS.profile.pod_demand(pod_object(pod)) == Demand(memory=pod.memory, devices=pod.gpus)


# --- the report -------------------------------------------------------------------------------------------


def one_gpu_report(used: int, capacity: int) -> dict[str, Any]:
    """What GET /inspect answers for a cluster of one node with one GPU holding `used` GiB."""
    device = {"index": 0, "healthy": True, "capacity": capacity, "used": used, "free": capacity - used, "pods": []}
    node = {"name": "n1", "known": True, "problem": "", "devices": [device]}
    return {"unit": "GiB", "nodes": [node]}


def test_the_fill_table_draws_any_use_as_inspect_does() -> None:
    row = fill_table(one_gpu_report(used=1, capacity=16))[1]
    assert "[##" + "." * 18 + "]" in row  # ceil(1 * 20 / 16) = 2, the rounding of `extender inspect`


# --- a whole run ------------------------------------------------------------------------------------------


def test_demo_places_pods_and_exits_zero(capsys: pytest.CaptureFixture[str], recwarn: pytest.WarningsRecorder) -> None:
    assert run_demo(pods=12, seed=7) == 0
    output = capsys.readouterr().out
    assert "-> gpu-" in output
    assert "placed    11 of 12 pods" in output
    assert "no GPU holds more memory than it has" in output
    gc.collect()
    assert [str(warning.message) for warning in recwarn if issubclass(warning.category, ResourceWarning)] == []


def test_demo_reports_a_pod_that_never_fits_with_the_filters_reason(capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(pods=12, seed=7)
    lines = capsys.readouterr().out.splitlines()
    never = next(number for number, line in enumerate(lines) if f"{NEVER_FITS} GiB  NOT PLACED" in line)
    assert "unresolvable on all 12 nodes" in lines[never]
    assert f"needs {NEVER_FITS} GiB on one GPU; the largest GPU here has" in lines[never + 1]


def test_demo_output_fits_in_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(pods=40, seed=2)
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100


def test_demo_reports_pods_that_find_no_room_once_the_cluster_is_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write_cluster(tmp_path / "small.yaml", make_node("small", gpus=1, mem=16))
    assert run_demo(pods=20, seed=7, cluster_file=cluster) == 0
    output = capsys.readouterr().out
    assert "NOT PLACED: no room now on 1 node," in output
    assert "largest free is" in output


def test_demo_exits_non_zero_when_a_gpu_holds_more_than_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write_cluster(
        tmp_path / "over.yaml",
        make_node("over", gpus=1, mem=16),
        bound_pod("a", "over", (0,), 12),
        bound_pod("b", "over", (0,), 12),
    )
    assert run_demo(pods=4, seed=7, cluster_file=cluster) == 1
    assert "over GPU 0: used 24 > 16" in capsys.readouterr().out
