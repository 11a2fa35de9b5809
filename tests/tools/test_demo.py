"""`extender demo`: the bundled cluster, the burst, and a whole run over HTTPS with mTLS."""

from __future__ import annotations

import gc
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender import cli
from extender.app import file_service
from extender.core.cache import Cache
from extender.core.devices import Demand, Request
from extender.core.holds import Grant
from extender.core.protocols.hami import encode
from extender.settings import Protocol, load
from extender.tools.demo import run_demo
from extender.tools.demo_burst import HAMI_NEVER_FITS, NEVER_FITS, BurstPod, make_burst, make_hami_burst, pod_object
from extender.tools.demo_report import fill_table, over_capacity, pod_lines, unasked
from extender.tools.demo_scheduler import Decision
from tests.builders import bound_pod, make_hami_node, make_hami_pod, make_node

BUNDLED = resources.files("extender.tools") / "demo_cluster.yaml"
BUNDLED_HAMI = resources.files("extender.tools") / "demo_cluster_hami.yaml"
SETTINGS = load(flags={"insecure_http": True}, env={})
HAMI_SETTINGS = load(flags={"insecure_http": True, "protocol": "hami"}, env={})


def write_cluster(path: Path, *items: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(items)}))
    return str(path)


# --- the bundled cluster ----------------------------------------------------------------------------------


def test_bundled_cluster_loads_with_twelve_nodes_and_no_overcommitted_gpu() -> None:
    with resources.as_file(BUNDLED) as path:
        service = file_service(SETTINGS, str(path))
    cluster = service.cache
    assert sum(1 for state in cluster.nodes.values() if state.known) == 12
    assert cluster.overcommitted() == []
    assert cluster.reserved == {}


def test_bundled_cluster_has_a_node_with_heterogeneous_devices_and_a_failed_one() -> None:
    with resources.as_file(BUNDLED) as path:
        service = file_service(SETTINGS, str(path))
    mixed = service.cache.nodes["gpu-mixed-1"]
    assert [(device.capacity, device.healthy) for device in mixed.devices] == [
        (24, True),
        (24, True),
        (16, True),
        (0, False),
    ]


def test_bundled_cluster_counts_running_pods_and_frees_the_succeeded_one() -> None:
    with resources.as_file(BUNDLED) as path:
        service = file_service(SETTINGS, str(path))
    nodes = service.cache.nodes
    assert nodes["gpu-h100-1"].used[:2] == [80, 80]
    assert nodes["gpu-v100-1"].used == [16, 16, 0, 0]  # one pod over two GPUs: 32 GiB split
    assert nodes["gpu-l4-2"].used_total == 0  # eval-job-41 Succeeded


# --- the burst --------------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_burst() -> None:
    assert make_burst(40, seed=3) == make_burst(40, seed=3)
    assert make_burst(40, seed=3) != make_burst(40, seed=4)


def test_a_burst_holds_pods_that_never_fit_and_one_pod_over_two_gpus() -> None:
    burst = make_burst(30, seed=7)
    assert len({pod.uid for pod in burst}) == 30
    assert sum(1 for pod in burst if pod.memory == NEVER_FITS) == 1
    assert sum(1 for pod in burst if pod.gpus == 2) == 1


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
    assert "placed    10 of 12 pods" in output  # of 12: one never fits, and one asks 2 GPUs, refused in gpushare
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
    # The 4 GiB pod after the 2 GiB one that filled the GPU: that one's bind may not have landed yet, but its
    # filter's assumption counts it (core/assume.py), so the GPU is full, not "largest free is 2 GiB".
    assert "needs 4 GiB on one GPU; all 1 GPUs here are full" in output


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


# --- HAMi: the bundled cluster ----------------------------------------------------------------------------


def hami_cache() -> Cache:
    with resources.as_file(BUNDLED_HAMI) as path:
        service = file_service(HAMI_SETTINGS, str(path))
    return service.cache


def test_bundled_hami_cluster_registers_eight_gpu_nodes_of_mixed_models_split_ten_ways() -> None:
    nodes = hami_cache().nodes
    with_gpus = {name: state for name, state in nodes.items() if state.known and state.devices}
    assert len(with_gpus) == 8 and nodes["cpu-1"].devices == ()
    devices = [device for state in with_gpus.values() for device in state.devices]
    assert {device.model for device in devices} >= {"NVIDIA A100-SXM4-40GB", "NVIDIA L4", "NVIDIA H100 80GB HBM3"}
    assert {device.slots for device in devices} == {10} and {device.cores for device in devices} == {100}


def test_bundled_hami_cluster_has_one_cordoned_gpu_and_one_unhealthy_gpu() -> None:
    devices = [(name, device) for name, state in hami_cache().nodes.items() for device in state.devices]
    assert [(name, device.index) for name, device in devices if device.cordoned] == [("gpu-a100-2", 3)]
    assert [(name, device.index) for name, device in devices if not device.healthy] == [("gpu-l4-2", 2)]


def test_bundled_hami_cluster_counts_hamis_running_pods_and_frees_the_succeeded_one() -> None:
    cluster = hami_cache()
    nodes = cluster.nodes
    assert cluster.overcommitted() == [] and cluster.reserved == {}
    assert nodes["gpu-h100-1"].used[:4] == [81559] * 4  # one pod on four whole GPUs
    assert nodes["gpu-h100-1"].used_cores[:4] == [100] * 4
    assert (nodes["gpu-a100-1"].used[0], nodes["gpu-a100-1"].used_cores[0]) == (10240 + 8192, 30 + 20)
    assert nodes["gpu-a100-2"].used[3] == 20480  # still running on the GPU cordoned since
    assert nodes["gpu-t4-1"].used_slots == [6]
    assert nodes["gpu-h100-2"].used_total == 0  # eval-job-41 Succeeded


# --- HAMi: the burst --------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_hami_burst() -> None:
    assert make_hami_burst(40, seed=3) == make_hami_burst(40, seed=3)
    assert make_hami_burst(40, seed=3) != make_hami_burst(40, seed=4)


def test_a_hami_burst_mixes_every_kind_of_ask() -> None:
    burst = make_hami_burst(100, seed=7)
    limits = [pod_object(pod)["spec"]["containers"][0]["resources"]["limits"] for pod in burst]
    for resource in ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"):
        assert any(resource in asked for asked in limits), resource
    assert any(pod.gpus > 1 for pod in burst)
    assert any(pod.gpu_type for pod in burst)
    assert sum(1 for pod in burst if pod.memory == HAMI_NEVER_FITS) == 3


def test_a_hami_burst_pod_object_asks_what_the_pod_says() -> None:
    protocol = HAMI_SETTINGS.device_protocol
    for pod in make_hami_burst(100, seed=7):
        demand = protocol.pod_demand(pod_object(pod))
        memory = pod.memory // pod.gpus
        assert demand.requests == (Request(pod.gpus, memory, 0 if memory else pod.percent, pod.cores),)
        assert demand.selectors.use_models == ((pod.gpu_type,) if pod.gpu_type else ())


# --- HAMi: the report -------------------------------------------------------------------------------------


def hami_gpu(**overrides: Any) -> dict[str, Any]:
    """One GPU as GET /inspect shows a HAMi GPU: 40960 MiB, 100 % compute, 10 slots; overrides change it."""
    device = {
        "index": 0,
        "healthy": True,
        "capacity": 40960,
        "used": 0,
        "free": 40960,
        "cores": 100,
        "used_cores": 0,
        "slots": 10,
        "used_slots": 0,
        "model": "NVIDIA A100-SXM4-40GB",
        "uuid": "GPU-0",
        "cordoned": False,
        "pods": [],
    }
    return device | overrides


def hami_report(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"unit": "MiB", "nodes": [{"name": "n1", "known": True, "problem": "", "devices": list(devices)}]}


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"used": 40961}, "n1 GPU 0: used 40961 > 40960"),
        ({"used_cores": 130}, "n1 GPU 0: compute used 130 % > 100 %"),
        ({"used_slots": 11}, "n1 GPU 0: 11 pods > its 10 slots"),
    ],
    ids=["memory", "compute", "slots"],
)
def test_every_dimension_over_capacity_is_a_problem(overrides: dict[str, Any], problem: str) -> None:
    assert over_capacity(hami_report(hami_gpu(**overrides))) == [problem]
    assert over_capacity(hami_report(hami_gpu(used=40960, used_cores=100, used_slots=10))) == []


def test_the_hami_fill_table_draws_memory_compute_and_slots_with_the_model() -> None:
    table = fill_table(hami_report(hami_gpu(used=10240, used_cores=30, used_slots=2), hami_gpu(index=1, cordoned=True)))
    assert "compute %" in table[0] and "pods" in table[0]
    # memory 10240 of 40960: 3 of 10 (rounded up); compute 30 of 100: 3 of 10
    assert "A100-SXM4-40GB  10240/40960 [###.......]   30/100 [###.......]   2/10" in table[1]
    assert table[2].endswith("0/10  cordoned")


def placed(pod: BurstPod) -> dict[str, Decision]:
    return {pod.uid: Decision(pod, node="n1")}


@pytest.mark.parametrize(
    ("holder", "overrides", "problem"),
    [
        ({"memory": 4096, "cores": 30}, {}, ""),
        ({"memory": 2048, "cores": 30}, {}, "demo/p holds 2048 and 30 % on GPU 0, asked 4096 and 30 %"),
        (
            {"memory": 4096, "cores": 30},
            {"model": "NVIDIA L4"},
            "demo/p asked for a A100 GPU and holds GPU 0, a NVIDIA L4",
        ),
    ],
    ids=["as-asked", "less-memory", "other-model"],
)
def test_a_hami_pod_holding_other_than_it_asked_is_a_problem(
    holder: dict[str, Any], overrides: dict[str, Any], problem: str
) -> None:
    pod = BurstPod("p", "uid-p", 4096, cores=30, gpu_type="A100", protocol=Protocol.HAMI)
    report = hami_report(hami_gpu(pods=[{"uid": "uid-p", **holder}], **overrides))
    assert unasked([pod], placed(pod), report) == ([problem] if problem else [])


def test_a_share_of_memory_is_checked_against_each_gpus_own_capacity() -> None:
    pod = BurstPod("p", "uid-p", 0, percent=25, cores=10, protocol=Protocol.HAMI)
    report = hami_report(hami_gpu(capacity=23034, pods=[{"uid": "uid-p", "memory": 5758, "cores": 10}]))
    assert unasked([pod], placed(pod), report) == []  # 23034 * 25 // 100 = 5758, rounded down as HAMi does


def test_a_long_reason_is_wrapped_not_cut() -> None:
    pod = BurstPod("p", "uid-p", HAMI_NEVER_FITS, protocol=Protocol.HAMI)
    reason = "needs 98304 MiB on one GPU; the largest GPU here has 81559 MiB and 100 % compute, so it never fits"
    decision = Decision(pod, unresolvable={"n1": reason})
    lines = pod_lines([pod], {pod.uid: decision}, {}, 1)
    assert max(len(line) for line in lines) <= 100
    assert " ".join(line.strip() for line in lines).endswith(f"1 node says: {reason}")


# --- HAMi: a whole run ------------------------------------------------------------------------------------


def test_hami_demo_places_pods_within_memory_compute_and_slots_and_exits_zero(
    capsys: pytest.CaptureFixture[str], recwarn: pytest.WarningsRecorder
) -> None:
    assert run_demo(pods=100, seed=7, protocol=Protocol.HAMI) == 0
    output = capsys.readouterr().out
    assert "bundled HAMi demo cluster: 9 nodes" in output
    assert "-> gpu-a100-" in output and "-> gpu-h100-" in output and "-> gpu-l4-" in output
    assert "check     no GPU holds more memory, compute or pods than it has" in output
    assert "  compute   " in output and "  slots     " in output
    gc.collect()
    assert [str(warning.message) for warning in recwarn if issubclass(warning.category, ResourceWarning)] == []


def test_the_cli_plays_the_hami_demo_with_protocol_hami(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--protocol", "hami", "--pods", "12"]) == 0
    assert "bundled HAMi demo cluster" in capsys.readouterr().out


def test_hami_demo_says_why_pods_were_not_placed(capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(pods=100, seed=7, protocol=Protocol.HAMI)
    output = " ".join(line.strip() for line in capsys.readouterr().out.splitlines())
    assert ": 3 fit no node ever," in output
    assert f"needs {HAMI_NEVER_FITS} MiB on one GPU; the largest GPU here has" in output
    # The pods that ask for the T4 find it taken: the one node they may use is named with what it has left.
    assert "T4    NOT PLACED: no room now on 1 node, unresolvable on 8" in output
    assert "1 node says: needs 512 MiB on one GPU; largest free is" in output


def test_hami_demo_output_fits_in_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(pods=60, seed=2, protocol=Protocol.HAMI)
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100


def test_hami_demo_exits_non_zero_when_a_gpu_holds_more_compute_than_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def running(name: str, cores: int) -> dict[str, Any]:
        pod = make_hami_pod(name, mem=1024, cores=cores)
        pod["spec"]["nodeName"], pod["status"]["phase"] = "over", "Running"
        allocated = encode(((Grant(0, 1024, cores, "GPU-over-0"),),), {})
        pod["metadata"]["annotations"] |= {"hami.io/vgpu-node": "over", "hami.io/vgpu-devices-allocated": allocated}
        return pod

    cluster = write_cluster(tmp_path / "over.yaml", make_hami_node("over", gpus=1), running("a", 70), running("b", 60))
    assert run_demo(pods=4, seed=7, cluster_file=cluster, protocol=Protocol.HAMI) == 1
    assert "over GPU 0: compute used 130 % > 100 %" in capsys.readouterr().out
