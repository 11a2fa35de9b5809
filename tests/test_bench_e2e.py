"""`make bench-e2e`'s arithmetic, without a control plane: the pace from bind times, CPU from /proc samples, the
end check over pods and nodes, the issue's table, and the floor's wiring (its kube-scheduler configuration, its
name on the command line and in the report). The runs themselves need the e2e tier's binaries and minutes; these
check in milliseconds (the configuration: an `extender scheduler-config` process each) that what they print and
configure is right."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.e2e import cores_busy, extender_lines, label, pace_table, parse
from bench.e2e_figures import (
    POD_MIX,
    EndCheck,
    Pace,
    condition_time,
    cpu_ms_per_pod,
    cpu_seconds,
    end_check,
    pace,
    pod_sizes,
)
from bench.e2e_run import ALONE, RunResult, connections_opened, scheduler_config
from tests.builders import bound_pod, make_node, make_pod
from tests.e2e.extender_process import TLSFiles

STEADY = [index * 0.01 for index in range(100)]
"""100 binds, one every 10 ms: 100 pods/s."""


# ---- pace ----------------------------------------------------------------------------------------------


def test_pace_counts_binds_between_the_5th_and_95th_percentile_over_their_time() -> None:
    # nearest ranks of 100 binds: the 5th is index 4 (0.04 s), the 95th index 94 (0.94 s): 90 binds / 0.9 s
    measured = pace(STEADY)
    assert round(measured.pods_per_second, 6) == 100.0
    assert round(measured.gap_p50_ms, 6) == 10.0
    assert round(measured.gap_max_ms, 6) == 10.0
    assert measured.bound == 100


def test_pace_leaves_out_a_slow_start_and_a_long_tail() -> None:
    times = [-50.0, *STEADY[1:99], 500.0]
    measured = pace(times)
    assert round(measured.pods_per_second, 6) == 100.0
    assert round(measured.gap_max_ms, 6) == 10.0
    assert measured.first_to_last == 550.0


def test_pace_sorts_the_bind_times_it_is_given() -> None:
    assert pace(reversed(STEADY)) == pace(STEADY)


def test_pace_of_fewer_than_two_binds_is_zero() -> None:
    assert pace([3.0]) == Pace(0.0, 0.0, 0.0, 1, 0.0)
    assert pace([]) == Pace(0.0, 0.0, 0.0, 0, 0.0)


def test_pace_of_binds_all_in_one_instant_is_zero_not_infinite() -> None:
    assert pace([7.0] * 10).pods_per_second == 0.0


def test_condition_time_reads_the_pod_scheduled_transition_in_unix_seconds() -> None:
    pod = make_pod()
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-01-01T00:00:01Z"}
    ]
    assert condition_time(pod) == 1_735_689_601.0


def test_condition_time_is_none_for_a_pod_not_scheduled() -> None:
    pod = make_pod()
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "lastTransitionTime": "2025-01-01T00:00:01Z"}
    ]
    assert condition_time(pod) is None
    assert condition_time(make_pod()) is None


# ---- CPU -----------------------------------------------------------------------------------------------


def stat_line(command: str, utime: int, stime: int) -> bytes:
    """/proc/<pid>/stat: pid, (comm), then fields 3 to 52; utime is field 14, stime field 15."""
    fields = ["S", *(["0"] * 49)]
    fields[14 - 3], fields[15 - 3] = str(utime), str(stime)
    return f"4242 ({command}) {' '.join(fields)}\n".encode()


def test_cpu_seconds_adds_user_and_system_ticks() -> None:
    # (250 + 50) ticks at 100 per second
    assert cpu_seconds(stat_line("etcd", 250, 50), 100) == 3.0


def test_cpu_seconds_reads_past_a_command_name_with_spaces_and_parentheses() -> None:
    assert cpu_seconds(stat_line("kube apiserver) S 1 2", 100, 0), 100) == 1.0


def test_cpu_per_pod_is_the_difference_over_the_pods_in_milliseconds() -> None:
    # etcd: (2.5 - 1.0) s / 1,000 pods = 1.5 ms; kube-scheduler started in the window: 3.0 s / 1,000 = 3.0 ms
    assert cpu_ms_per_pod({"etcd": 1.0}, {"etcd": 2.5, "kube-scheduler": 3.0}, 1000) == {
        "etcd": 1.5,
        "kube-scheduler": 3.0,
    }


def test_cpu_per_pod_of_no_pods_is_empty() -> None:
    assert cpu_ms_per_pod({"etcd": 1.0}, {"etcd": 2.0}, 0) == {}


# ---- end check -----------------------------------------------------------------------------------------

NODES = [make_node("node-a", gpus=2, mem=16), make_node("node-b", gpus=2, mem=16)]


def test_end_check_passes_annotated_pods_within_capacity_and_counts_bound_and_pending() -> None:
    pods = [
        bound_pod("p1", "node-a", (0,), 10),
        bound_pod("p2", "node-a", (0,), 6),
        bound_pod("p3", "node-a", (1,), 16),
        make_pod("p4", gpu_mem=4),
        make_pod("plain", gpu_mem=None, node="node-b"),
    ]
    assert end_check(pods, NODES, with_extender=True) == EndCheck(bound=3, pending=1, problems=())


def test_end_check_finds_a_gpu_over_capacity_by_the_annotations() -> None:
    # GPU 0 of node-a: 10 + 10 = 20 GiB of 16
    pods = [bound_pod("p1", "node-a", (0,), 10), bound_pod("p2", "node-a", (0,), 10)]
    check = end_check(pods, NODES, with_extender=True)
    assert check.problems == ("node-a GPU 0 holds 20 GiB, more than its 16",)
    assert not check.passed


def test_end_check_finds_a_gpu_pod_bound_without_its_allocation_when_the_extender_binds() -> None:
    pods = [make_pod("p1", gpu_mem=4, node="node-a")]
    (problem,) = end_check(pods, NODES, with_extender=True).problems
    assert problem.startswith("p1 bound to node-a without its allocation")


def test_end_check_accepts_unannotated_pods_when_kube_scheduler_ran_alone() -> None:
    pods = [make_pod("p1", gpu_mem=16, node="node-a"), make_pod("p2", gpu_mem=16, node="node-a")]
    assert end_check(pods, NODES, with_extender=False).passed


def test_end_check_finds_a_node_over_its_total_when_kube_scheduler_ran_alone() -> None:
    # node-a: 2 x 16 = 32 GiB; 16 + 16 + 4 = 36
    pods = [make_pod(f"p{n}", gpu_mem=size, node="node-a") for n, size in enumerate((16, 16, 4))]
    assert end_check(pods, NODES, with_extender=False).problems == (
        "node-a holds 36 GiB of GPU memory, more than its 32",
    )


def test_end_check_finds_a_pod_given_other_memory_than_it_asked() -> None:
    pod = bound_pod("p1", "node-a", (0,), 4)
    pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] = "2"
    assert end_check([pod], NODES, with_extender=True).problems == ("p1 asks 4 GiB but was given 2",)


def test_end_check_finds_a_gpu_index_the_node_does_not_have() -> None:
    pod = bound_pod("p1", "node-a", (5,), 4)
    assert end_check([pod], NODES, with_extender=True).problems == ("p1 on GPU 5, which node-a does not have",)


# ---- workload and report -------------------------------------------------------------------------------


def test_pod_sizes_are_the_same_every_time_and_follow_the_mix() -> None:
    sizes = pod_sizes(10_000)
    assert sizes == pod_sizes(10_000)
    counts = Counter(sizes)
    assert set(counts) == {size for size, _ in POD_MIX}
    # weights 30:30:20:15:5 of 100: within a few points of their share of 10,000
    for size, weight in POD_MIX:
        assert abs(counts[size] - weight * 100) < 300, (size, counts[size])


def result(wiring: str, pods_per_second: float) -> RunResult:
    return RunResult(
        wiring=wiring,
        pace=Pace(pods_per_second, 1.0, 5.0, 1000, 10.0),
        condition_pace=Pace(pods_per_second, 1000.0, 1000.0, 1000, 10.0),
        cpu_ms_per_pod={},
        check=EndCheck(1000, 0, ()),
        setup_seconds=5.0,
        scheduling_seconds=10.0,
        window_seconds=11.0,
    )


def test_the_table_shows_the_range_of_each_run_kind_and_the_ratio_within_each_round() -> None:
    # round 1: 100 / 200 = 0.50; round 2: 90 / 300 = 0.30
    results = [(1, result(ALONE, 200)), (1, result("full", 100)), (2, result(ALONE, 300)), (2, result("full", 90))]
    assert pace_table(1000, 3000, results, ["full"]).splitlines()[-1] == (
        "| 1,000, 3,000 | 200 - 300 pods/s | 90 - 100 pods/s | 0.30 - 0.50 |"
    )


def test_cores_busy_is_the_cpu_of_every_process_over_the_window() -> None:
    # (1.5 + 0.5) ms per pod x 1,000 pods = 2 s of CPU over an 11 s window
    measured = dataclasses.replace(result(ALONE, 100), cpu_ms_per_pod={"etcd": 1.5, "bench": 0.5})
    assert round(cores_busy(measured), 6) == round(2 / 11, 6)


# ---- the floor -----------------------------------------------------------------------------------------

TLS = TLSFiles(*(Path("/certs") / name for name in ("ca.crt", "tls.crt", "tls.key", "client.crt", "client.key")))
FLOOR_URL = "https://127.0.0.1:9443"


def rendered(wiring: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(scheduler_config("v1.34.1", FLOOR_URL, TLS, wiring))
    return config


@pytest.mark.parametrize(
    ("floor", "verbs"),
    [
        ("floor-full", {"filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind"}),
        ("floor-filter-bind", {"filterVerb": "filter", "bindVerb": "bind"}),
    ],
)
def test_the_floor_is_called_for_filter_bind_and_prioritize_when_its_wiring_has_it(
    floor: str, verbs: dict[str, str]
) -> None:
    entry, aside = rendered(floor)["extenders"]  # aside: the default scheduler's entry of pods asking no GPU
    assert {key: value for key, value in entry.items() if key.endswith("Verb")} == verbs
    assert {key: value for key, value in aside.items() if key.endswith("Verb")} == {"filterVerb": "filter"}
    assert aside["ignorable"] is True
    assert entry["urlPrefix"] == FLOOR_URL
    assert entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {
        "caFile": "/certs/ca.crt",
        "certFile": "/certs/client.crt",
        "keyFile": "/certs/client.key",
    }
    assert entry["nodeCacheCapable"] is True


def test_kube_scheduler_counts_the_gpu_memory_the_floor_manages() -> None:
    # the floor counts nothing, so NodeResourcesFit must: ignoredByScheduler false, as when it runs alone
    entry, _ = rendered("floor-full")["extenders"]
    assert {"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False} in entry["managedResources"]
    assert not any(item["ignoredByScheduler"] for item in entry["managedResources"])
    assert entry["weight"] == 5


@pytest.mark.parametrize(("floor", "ours"), [("floor-full", "full"), ("floor-filter-bind", "filter-bind")])
def test_a_floor_wiring_is_ours_without_preempt(floor: str, ours: str) -> None:
    # the profile (filter-bind's NodeResourcesFit scoring), timeout, weight and TLS: all ours, so only the
    # extender differs between the two runs
    expected = rendered(ours)
    del expected["extenders"][0]["preemptVerb"]
    expected["extenders"][1]["filterVerb"] = (
        "filter"  # the floor's filter passes every node, as /filter-cpu a GPU pod's
    )
    assert rendered(floor) == expected


def test_the_floor_wirings_are_chosen_with_the_wiring_flag() -> None:
    arguments = parse(["--wiring", "full", "--wiring", "floor-full", "--wiring", "floor-filter-bind"])
    assert arguments.wiring == ["full", "floor-full", "floor-filter-bind"]
    assert parse([]).wiring == ["full"]


def test_a_floor_run_is_labelled_apart_from_the_extender() -> None:
    assert label("floor-full") == "with a do-nothing Go binder (floor-full)"
    assert label("full") == "with the extender (full)"
    assert label(ALONE) == "kube-scheduler alone"


def test_the_connections_opened_are_the_floor_s_conn_lines() -> None:
    log = (
        b"2025/11/24 04:01:00.000001 serving HTTP/1.1 on 127.0.0.1:9443\n"
        b"2025/11/24 04:01:02.000002 conn 1\n"
        b"2025/11/24 04:01:02.000003 http: TLS handshake error from 127.0.0.1:5000: EOF\n"
        b"2025/11/24 04:01:02.000004 conn 2\n"
    )
    assert connections_opened(log) == 2
    assert connections_opened(b"") == 0


def test_the_report_gives_a_floor_run_s_connections_and_our_run_s_handler_times() -> None:
    floor = dataclasses.replace(result("floor-full", 100), connections=1234)
    ours = dataclasses.replace(result("full", 90), verb_ms={"filter": 0.25}, extender_counts={"bind bound": 3000})
    counted = dataclasses.replace(ours, connections=12)
    assert extender_lines([(1, result(ALONE, 200)), (1, floor), (1, ours), (2, counted)]) == [
        "- round 1, floor-full: 1,234 connections opened to the floor",
        "- round 1, full: mean time in the handler: filter 0.25 ms; bind bound 3,000",
        "- round 2, full: mean time in the handler: filter 0.25 ms; bind bound 3,000; 12 connections opened",
    ]
