"""`bench/node_burst.py`'s parts that need no cluster: the GPUs file and the pods it creates, the times taken from
the watch's events, the judgements from the API and from the device plugin's record, the node's annotations put
back, and its flags. A run on the one-node cluster (`python -m bench.node_burst`) is what exercises the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import node_burst as burst
from bench.node_burst import PodTimes, RunFigures
from devtools.deviceplugin.gpus import load_gpus

UUID = "GPU-6f1c2a10-0000-4000-8000-{:012d}"


def gpushare_pod(name: str, index: int, units: int, uid: str | None = None) -> dict[str, Any]:
    annotations = {"ALIYUN_COM_GPU_MEM_IDX": str(index), "ALIYUN_COM_GPU_MEM_POD": str(units)}
    return {"metadata": {"name": name, "uid": uid or name, "annotations": annotations}, "status": {"phase": "Running"}}


def hami_pod(name: str, *devices: tuple[int, int], phase: str = "success") -> dict[str, Any]:
    allocated = "".join(f"{UUID.format(index)},NVIDIA,{mib},0:" for index, mib in devices) + ";"
    annotations = {"hami.io/vgpu-devices-allocated": allocated, "hami.io/bind-phase": phase}
    return {"metadata": {"name": name, "uid": name, "annotations": annotations}, "status": {"phase": "Running"}}


def record(uid: str, *gpus: tuple[int, int], accepted: bool = True, reason: str = "") -> dict[str, Any]:
    given = [{"index": index, "uuid": UUID.format(index), "memory": memory} for index, memory in gpus]
    return {"uid": uid, "pod": f"default/{uid}", "accepted": accepted, "reason": reason, "gpus": given}


@pytest.mark.parametrize("protocol", ["gpushare", "hami"])
def test_the_gpus_file_gives_the_plugin_eight_gpus_of_16_gib(protocol: str, tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(burst.gpus_file(protocol))
    gpus = load_gpus(path)
    assert [(gpu.index, gpu.memory) for gpu in gpus.gpus] == [(index, 16384) for index in range(8)]
    assert len({gpu.uuid for gpu in gpus.gpus}) == 8
    assert gpus.memory_unit == "GiB"
    assert gpus.hami.split_count == 10 and gpus.hami.operating_mode == "hami-core"


def test_sixty_four_pods_of_1_gib_fit_the_node_at_once() -> None:
    # gpushare: 64 x 1 unit <= 8 GPUs x 16 units; HAMi: 64 pods <= 8 GPUs x 10 slots, 64 x 1024 MiB <= 8 x 16384 MiB.
    assert 64 * burst.POD_MIB <= burst.GPUS * burst.GPU_MIB
    assert burst.GPUS * burst.SPLIT_COUNT >= 64


def test_the_pods_ask_one_gib_in_their_protocols_resources_for_its_second_scheduler() -> None:
    (gpushare,) = burst.burst_pods("gpushare", "run", 1, "image")
    hami = burst.burst_pods("hami", "run", 3, "image")
    assert gpushare["spec"]["schedulerName"] == "gpu-scheduler"
    assert gpushare["spec"]["containers"][0]["resources"]["limits"] == {"aliyun.com/gpu-mem": "1"}
    assert [pod["metadata"]["name"] for pod in hami] == ["run-000", "run-001", "run-002"]
    assert {pod["spec"]["schedulerName"] for pod in hami} == {"hami-scheduler"}
    assert hami[0]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "1024",
    }
    assert hami[0]["metadata"]["labels"] == {burst.LABEL: "run"}


def test_a_pod_is_stamped_when_first_seen_bound_and_running() -> None:
    times: dict[str, PodTimes] = {}
    pending = {"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Pending"}}
    bound = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}
    running = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}
    for pod, at in ((pending, 1.0), (pending, 1.5), (bound, 2.0), (running, 3.0), (running, 9.0)):
        burst.note(times, pod, at)
    assert times == {"p": PodTimes(added=1.0, bound=2.0, running=3.0)}


def test_the_figures_run_from_the_creation_to_the_last_pod_and_per_pod_from_its_own_creation() -> None:
    # Created from t=10: a added at 10.5, bound 11, Running 13 (2.5 s); b added 11, bound 14, Running 16 (5 s).
    times = {"a": PodTimes(10.5, 11.0, 13.0), "b": PodTimes(11.0, 14.0, 16.0)}
    assert burst.figures(10.0, times, 2) == (4.0, 6.0, (2.5, 5.0))


def test_a_pod_never_seen_running_fails_the_figures() -> None:
    with pytest.raises(burst.BurstError, match="1 of 2 pods seen Running"):
        burst.figures(0.0, {"a": PodTimes(1.0, 2.0, 3.0), "b": PodTimes(1.0, 2.0, None)}, 2)


def test_per_pod_percentiles_are_nearest_rank() -> None:
    run = RunFigures("ours", "hami", 1, 10, 1.0, 2.0, 3.0, tuple(float(n) for n in range(1, 11)), 0)
    assert (run.p50, run.p90) == (5.0, 9.0)


def test_gpushare_judged_sound_when_the_annotations_and_the_plugin_agree_within_each_gpu() -> None:
    pods = [gpushare_pod(f"p{n}", n % 2, 8) for n in range(4)]  # 2 x 8 units on each of GPUs 0 and 1
    records = [record(f"p{n}", (n % 2, 8)) for n in range(4)]
    assert burst.judge_gpushare(pods, records, 16) == []


def test_gpushare_judgement_finds_a_gpu_over_its_memory_a_pod_served_twice_and_a_refusal() -> None:
    pods = [gpushare_pod("a", 0, 10), gpushare_pod("b", 0, 10), gpushare_pod("c", 1, 1)]
    records = [record("a", (0, 10)), record("b", (0, 10)), record("b", (0, 10)), record("c", accepted=False)]
    problems = burst.judge_gpushare(pods, records, 16)
    assert "GPU 0 over its memory by the API: 20" in problems
    assert "GPU 0 over its memory by the plugin: 30" in problems
    assert "a pod allocated 2 times: b" in problems
    assert any(problem.startswith("the device plugin refused or gave no GPU: default/c") for problem in problems)
    assert any(problem.startswith("the plugin gave other GPUs") for problem in problems)


def test_gpushare_judgement_ignores_records_of_pods_gone() -> None:
    assert burst.judge_gpushare([gpushare_pod("a", 0, 4)], [record("a", (0, 4)), record("old", (0, 16))], 16) == []


def test_hami_judged_sound_when_each_gpu_holds_its_memory_and_split_count() -> None:
    pods = [hami_pod(f"p{n}", (n % 8, 1024)) for n in range(64)]
    records = [record(f"p{n}", (n % 8, 1024)) for n in range(64)]
    assert burst.judge_hami(pods, records, 16384, 10) == []


def test_hami_judgement_finds_a_gpu_over_its_split_count_or_memory_and_a_bind_phase_not_success() -> None:
    pods = [hami_pod(f"p{n}", (0, 1024)) for n in range(11)] + [hami_pod("big", (1, 20000), phase="allocating")]
    records = [record(f"p{n}", (0, 1024)) for n in range(11)] + [record("big", (1, 20000))]
    problems = burst.judge_hami(pods, records, 16384, 10)
    assert f"GPU {UUID.format(0)} over its split count: 11" in problems
    assert f"GPU {UUID.format(1)} over its memory by the API: 20000" in problems
    assert f"GPU {UUID.format(1)} over its memory by the plugin: 20000" in problems
    assert "big: hami.io/bind-phase allocating" in problems


def test_hami_judgement_reads_every_container_and_device_of_the_annotation() -> None:
    pod = hami_pod("two", (0, 1000), (1, 2000))  # a first container on GPUs 0 and 1, a second on GPU 0
    pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] += f"{UUID.format(0)},NVIDIA,500,0:;"
    first, second = record("two", (0, 1000), (1, 2000)), record("two", (0, 500))
    assert burst.judge_hami([pod], [first | {"container": "a"}, second | {"container": "b"}], 16384, 10) == []
    assert burst.judge_hami([pod], [first | {"container": "a"}], 16384, 10) == [
        f"the plugin gave other GPUs than the annotations name: {{'{UUID.format(0)}': 1000, '{UUID.format(1)}': 2000}}"
        f" != {{'{UUID.format(0)}': 1500, '{UUID.format(1)}': 2000}}"
    ]


def test_a_run_pod_without_an_allocation_or_a_plugin_record_is_not_running_with_a_gpu() -> None:
    pods = [gpushare_pod("given", 0, 1), gpushare_pod("unrecorded", 0, 1), gpushare_pod("pending", 0, 1)]
    pods[2]["status"]["phase"] = "Pending"
    bare = {"metadata": {"name": "bare", "uid": "bare"}, "status": {"phase": "Running"}}
    records = [record("given", (0, 1)), record("pending", (0, 1)), record("bare", (0, 1))]
    assert burst.without_gpu("gpushare", [*pods, bare], records) == ["unrecorded", "pending", "bare"]


def test_the_nodes_hami_annotations_are_put_back_as_they_were() -> None:
    before = {"hami.io/node-nvidia-register": "old", "other": "x"}
    after = {"hami.io/node-nvidia-register": "new", "hami.io/node-handshake": "Requesting_x", "other": "y"}
    assert burst.annotations_restored(before, after) == {
        "hami.io/node-handshake": None,
        "hami.io/node-nvidia-register": "old",
    }
    assert burst.annotations_restored(before, dict(before)) == {}


def test_the_summary_gives_the_median_and_range_over_runs_and_pooled_per_pod_percentiles() -> None:
    runs = [
        RunFigures("ours", "hami", n, 2, 1.0, 2.0, total, (1.0, float(n)), 0)
        for n, total in ((1, 9.0), (2, 7.0), (3, 8.0))
    ]
    line = burst.summary(runs).splitlines()[-1]
    # pooled per pod: 1, 1, 1, 1, 2, 3 -> p50 1, p90 3
    assert line == "| ours | hami | 3 | 8.00 (7.00 - 9.00) | 1.00 | 3.00 |"


def test_a_run_line_says_whether_the_check_passed() -> None:
    run = RunFigures("hami-scheduler", "hami", 2, 64, 7.5, 8.0, 20.25, (10.0,), 3, ("x",), 0.42)
    assert burst.run_line(run) == (
        "| hami-scheduler | hami | 2 | 64 | 7.50 | 8.00 | 20.25 | 10.00 | 10.00 | 3 | 0.4 | FAILED (1 problems) |"
    )
    assert burst.HEADER.splitlines()[0].count("|") == burst.run_line(run).count("|")


@pytest.mark.parametrize(
    "argv",
    [
        ["--protocol", "gpushare", "--peer", "hami=/src/HAMi"],
        ["--protocol", "hami", "--peer", "gpushare=/src/g"],
        ["--protocol", "hami", "--pods", "81"],
        ["--protocol", "hami", "--runs", "0"],
        ["--protocol", "hami", "--peer-qps", "50"],
        ["--protocol", "hami", "--peer", "hami=/src/HAMi", "--peer-qps", "0"],
        [],
    ],
)
def test_flags_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        burst.parse(argv)


def test_flags_accepted() -> None:
    arguments = burst.parse(["--protocol", "hami", "--peer", "hami=/src/HAMi", "--pods", "80"])
    assert (arguments.peer, arguments.pods, arguments.runs) == ({"hami": Path("/src/HAMi")}, 80, 3)
    assert arguments.peer_qps is None
    raised = burst.parse(["--protocol", "hami", "--peer", "hami=/src/HAMi", "--peer-qps", "50"])
    assert raised.peer_qps == 50
