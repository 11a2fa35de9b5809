"""`make bench-placement`'s parts that need no control plane: the trace and its arrival sequence, the objects it
becomes, the model of kube-scheduler's cycle, the fast mode, and the figures. The real mode's agreement with the
fast one is held by tests/e2e/test_placement.py."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.placement import __main__ as cli
from bench.placement import fast, mig, report
from bench.placement.kube_model import ExtenderAnswer, ModelNode, ModelPod, SchedulerModel
from bench.placement.outcome import NodeUse, Outcome, ReplayResult
from bench.placement.real import unschedulable_reasons
from bench.placement.trace import (
    MODEL_LABEL,
    TraceError,
    TraceNode,
    TracePod,
    Workload,
    arrivals,
    load,
    node_object,
    pod_object,
    synthetic,
    synthetic_workload,
)
from extender.core.protocols.gpushare import SeveralGpus
from extender.core.resources import parse_count, parse_milli, pod_request, required_values

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn-0,96000,393216,8,G2\nn-1,104000,524288,2,T4\nn-2,32000,131072,0,\n"
PODS_CSV = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    "p-0,12000,16384,1,1000,,LS,Running,0,1,0\n"
    "p-1,3152,12288,1,810,,LS,Running,0,1,0\n"
    "p-2,88000,327680,8,1000,,LS,Running,0,1,0\n"
    "p-3,12500,24576,0,0,,LS,Running,0,1,0\n"
    "p-4,4000,8192,1,470,T4|V100M16,LS,Running,0,1,0\n"
)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES_CSV)
    (tmp_path / "openb_pod_list_default.csv").write_text(PODS_CSV)
    return tmp_path


# ---- the trace ------------------------------------------------------------------------------------------


def test_the_trace_is_read_with_its_gpu_nodes_shares_and_model_sets(trace: Path) -> None:
    workload = load(trace, "default", seed=42, ratio=1.0)
    assert [node.name for node in workload.nodes] == ["n-0", "n-1"]  # the CPU node is no GPU node
    assert workload.gpu_capacity == 10 * 1000
    by_name = {pod.name: pod for pod in workload.trace_pods}
    assert by_name["p-1"].gpu_demand == 810 and by_name["p-1"].kind == "share"
    assert by_name["p-2"].kind == "multi" and by_name["p-3"].kind == "cpu"
    assert by_name["p-4"].models == ("T4", "V100M16")


def test_the_repositorys_folder_is_found_from_its_parent(trace: Path) -> None:
    parent = trace.parent / "cluster-trace-gpu-v2023"
    (parent / "csv").mkdir(parents=True)
    for file in trace.iterdir():
        (parent / "csv" / file.name).write_text(file.read_text())
    assert len(load(parent, "default").nodes) == 2


@pytest.mark.parametrize(
    ("pods_csv", "message"),
    [
        ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", "no column gpu_milli"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,lots,1,0,0\n", ":2: cpu_milli 'lots' is not a number"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n", ":2: 2 GPUs of 500 milli each"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n", ":2: num_gpu 1 with gpu_milli 0"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods"),
    ],
)
def test_a_malformed_pod_list_is_refused_naming_the_file_and_line(trace: Path, pods_csv: str, message: str) -> None:
    (trace / "openb_pod_list_default.csv").write_text(pods_csv)
    with pytest.raises(TraceError, match=message):
        load(trace, "default")


def test_a_missing_workload_names_those_the_trace_has(trace: Path) -> None:
    with pytest.raises(TraceError, match=r"no such file .*gpushare100"):
        load(trace, "nope")


def test_a_directory_without_the_node_list_says_what_trace_must_be(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="TRACE must be the trace's csv directory"):
        load(tmp_path, "default")


def test_arrivals_are_the_trace_shuffled_then_draws_until_the_demand_reaches_the_ratio() -> None:
    nodes, pods = synthetic(seed=3)
    capacity = sum(node.gpus for node in nodes) * 1000
    sequence = arrivals(pods, nodes, seed=42, ratio=1.3)
    assert sorted(pod.name for pod in sequence[: len(pods)]) == sorted(pod.name for pod in pods)
    assert all("-tuned-" in pod.name for pod in sequence[len(pods) :])
    demand = sum(pod.gpu_demand for pod in sequence)
    assert demand <= 1.3 * capacity < demand + max(pod.gpu_demand for pod in pods)
    assert arrivals(pods, nodes, seed=42, ratio=1.3) == sequence
    assert arrivals(pods, nodes, seed=43, ratio=1.3) != sequence


def test_arrivals_drop_random_pods_when_the_trace_alone_asks_more() -> None:
    nodes, pods = synthetic(seed=3)
    capacity = sum(node.gpus for node in nodes) * 1000
    fewer = arrivals(pods, nodes, seed=1, ratio=0.5)
    assert sum(pod.gpu_demand for pod in fewer) <= 0.5 * capacity
    assert {pod.name for pod in fewer} <= {pod.name for pod in pods}


def test_the_synthetic_workload_has_every_kind_of_pod_the_trace_has() -> None:
    nodes, pods = synthetic(seed=7)
    assert set(Counter(pod.kind for pod in pods)) == {"cpu", "share", "whole", "multi"}
    assert any(pod.models for pod in pods) and len({node.model for node in nodes}) > 1
    assert synthetic(seed=7) == (nodes, pods)


# ---- the objects ----------------------------------------------------------------------------------------


def test_a_node_is_its_cpu_memory_and_gpus_in_gpushares_units_with_its_model_label() -> None:
    node = node_object(TraceNode("n", 96000, 393216, 8, "G2"))
    allocatable = node["status"]["allocatable"]
    assert parse_milli(allocatable["cpu"]) == 96000 and parse_count(allocatable["memory"]) == 393216 << 20
    assert (allocatable["aliyun.com/gpu-count"], allocatable["aliyun.com/gpu-mem"]) == ("8", "8000")
    assert node["metadata"]["labels"][MODEL_LABEL] == "G2"


def test_a_pod_asks_its_share_its_gpus_and_its_models() -> None:
    pod = pod_object(TracePod("P-1", 4000, 8192, 2, 1000, ("T4", "V100M16")), "gpu-scheduler")
    assert pod["metadata"]["name"] == "p-1" and pod["spec"]["schedulerName"] == "gpu-scheduler"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["aliyun.com/gpu-mem"], limits["aliyun.com/gpu-count"]) == ("2000", "2")
    assert pod_request(pod, "cpu", scale=3) == 4000
    assert required_values(pod, MODEL_LABEL) == ("T4", "V100M16")
    share = pod_object(TracePod("s", 1000, 1024, 1, 470))
    assert "aliyun.com/gpu-count" not in share["spec"]["containers"][0]["resources"]["limits"]


# ---- the model of kube-scheduler ------------------------------------------------------------------------


def config(**profile: Any) -> str:
    import yaml

    document = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "default-scheduler", **profile}],
        "extenders": [
            {
                "urlPrefix": "https://x",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 5,
                "managedResources": [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}],
            }
        ],
    }
    return yaml.safe_dump(document)


@pytest.mark.parametrize(
    ("nodes", "percentage", "found"), [(1213, 0, 497), (5000, 0, 500), (50, 0, 50), (1213, 100, 1213), (300, 10, 100)]
)
def test_the_nodes_kube_scheduler_looks_for_follow_percentage_of_nodes_to_score(
    nodes: int, percentage: int, found: int
) -> None:
    """numFeasibleNodesToFind: adaptive 50 - n/125 % (at least 5 %), never below 100 nodes."""
    assert SchedulerModel(percentage=percentage).feasible_to_find(nodes) == found


def test_the_configuration_is_read_for_the_profile_and_the_extender() -> None:
    model = SchedulerModel.parse(config(plugins={"score": {"disabled": [{"name": "*"}]}}, percentageOfNodesToScore=70))
    assert (model.percentage, model.fit_weight, model.balanced_weight) == (70, 0, 0)
    assert (model.extender_weight, model.extender_filter, model.managed) == (5, True, frozenset({"aliyun.com/gpu-mem"}))


def test_a_pod_reaches_the_extender_when_it_asks_a_managed_resource_or_when_it_manages_none() -> None:
    model = SchedulerModel.parse(config())
    assert model.interested(ModelPod("g", {"cpu": 1, "aliyun.com/gpu-mem": 500}))
    assert not model.interested(ModelPod("c", {"cpu": 1}))
    model.managed = frozenset()
    assert model.interested(ModelPod("c", {"cpu": 1}))


def node(name: str, cpu: int = 8000, gpu: int = 2000) -> ModelNode:
    return ModelNode(name, {"cpu": cpu, "memory": 16 << 30, "pods": 110, "aliyun.com/gpu-mem": gpu}, {})


def test_the_scheduler_refuses_in_its_own_words_and_counts_the_reasons() -> None:
    model = SchedulerModel.parse(config())
    pod = ModelPod("p", {"cpu": 4000, "memory": 1 << 30, "aliyun.com/gpu-mem": 3000}, ((MODEL_LABEL, ("T4",)),))
    nodes = [ModelNode("a", {"cpu": 8000, "memory": 1 << 40, "pods": 9}, {MODEL_LABEL: "T4"}), node("b")]
    decision = model.schedule(pod, nodes, None)
    assert decision.node == "" and decision.reasons == {
        "Insufficient aliyun.com/gpu-mem": 1,
        "node(s) didn't match Pod's node affinity/selector": 1,
    }


def test_one_node_left_by_the_extender_is_chosen_without_scoring() -> None:
    model = SchedulerModel.parse(config())
    calls: list[str] = []

    def extender(verb: str, pod: ModelPod, names: list[str]) -> Any:
        calls.append(verb)
        return ExtenderAnswer(["b"], {})

    pod = ModelPod("p", {"cpu": 1000, "aliyun.com/gpu-mem": 500})
    assert model.schedule(pod, [node("a"), node("b")], extender).node == "b"
    assert calls == ["filter"]


def test_the_total_score_adds_the_extenders_ten_times_its_weight() -> None:
    """LeastAllocated on cpu and memory (1) + balanced allocation (1) + extender 0-10 x 5 x 10."""
    model = SchedulerModel.parse(config())

    def extender(verb: str, pod: ModelPod, names: list[str]) -> Any:
        if verb == "filter":
            return ExtenderAnswer(names, {})
        return [{"Host": "busy", "Score": 1}]

    busy, idle = node("busy"), node("idle")
    busy.requested = {"cpu": 6000, "memory": 12 << 30}
    pod = ModelPod("p", {"cpu": 1000, "memory": 1 << 30, "aliyun.com/gpu-mem": 500})
    # idle: least (87 + 93) / 2 = 90, balanced 100 - |0.125 - 0.0625| / 2 x 100 = 96 -> 186
    # busy: least (12 + 18) / 2 = 15, balanced 100 - |0.875 - 0.8125| / 2 x 100 = 96 -> 111, + 1 x 5 x 10 = 161
    assert model.score(pod, idle) == 186 and model.score(pod, busy) == 111
    assert model.schedule(pod, [busy, idle], extender).node == "idle"


def test_equal_totals_are_broken_at_random_each_as_likely() -> None:
    model = SchedulerModel(seed=1)
    picks = Counter(model.select([5, 7, 7, 7, 1]) for _ in range(3000))
    assert set(picks) == {1, 2, 3} and min(picks.values()) > 900


def test_the_search_starts_where_the_last_one_stopped() -> None:
    model = SchedulerModel(percentage=50)
    nodes = [node(f"n{number:03d}") for number in range(400)]
    pod = ModelPod("p", {"cpu": 1000})
    model.schedule(pod, nodes, None)
    assert model.next_start == 200  # 50 % of 400 visited, all feasible


# ---- the fast mode and the figures ----------------------------------------------------------------------


def fast_run(seed: int = 5, *flags: str) -> ReplayResult:
    """The fast mode as `python -m bench.placement --synthetic --mode fast` runs it: the multi-GPU pods bound."""
    workload = synthetic_workload(seed)
    served, _ = cli.command_settings("serve", [*cli.GPUSHARE_FLAGS, "--scheduler-name=gpu-scheduler", *flags])
    return fast.replay(workload, served, cli.config_text(["--scheduler-name=gpu-scheduler", *flags]), seed)


def test_the_fast_mode_places_a_synthetic_workload_within_every_gpu_and_node() -> None:
    result = fast_run()
    assert result.problems == []
    assert 0.5 < result.allocated / result.workload.gpu_capacity <= 1.0
    assert [outcome.node for outcome in result.outcomes] == [outcome.node for outcome in fast_run().outcomes]


def test_the_fast_mode_runs_the_fill_policy_too() -> None:
    result = fast_run(5, "--placement=fill")
    assert result.problems == [] and result.allocated > 0


def toy_workload() -> Workload:
    nodes = (TraceNode("n", 16000, 65536, 2, "T4"),)
    pods = (
        TracePod("a", 4000, 1024, 1, 1000),  # 50 % of the capacity arrived
        TracePod("b", 4000, 1024, 1, 500),  # 75 %
        TracePod("c", 4000, 1024, 1, 1000),  # 125 %, refused
    )
    return Workload("toy", nodes, pods, pods)


def toy_result() -> ReplayResult:
    workload = toy_workload()
    a, b, c = workload.pods
    outcomes = [Outcome(a, "n"), Outcome(b, "n"), Outcome(c, "", {"needs 1000 milli-GPU on one GPU; largest free": 1})]
    return ReplayResult("fast", workload, outcomes, {"n": NodeUse(workload.nodes[0], [1000, 500], 8000, 2048)}, 1.0)


def test_the_curve_reads_the_allocation_when_each_tenth_of_the_capacity_has_arrived() -> None:
    points = report.curve(toy_workload(), [True, True, False])
    assert points[50] == 50.0 and points[70] == 75.0 and points[120] == 75.0 and points[130] == 75.0
    assert points[10] == 50.0  # 10 % was crossed by the first pod already


def test_fragmentation_counts_the_free_gpu_each_typical_pod_cannot_use() -> None:
    """Typical shapes: two whole (2/3) and one half (1/3). 500 free on one GPU: fragment for the wholes (2/3 x
    0.5), none for the half; stranded: none (a half can use it)."""
    free, fragmented, stranded = report.fragmentation(toy_result(), report.typical_shapes(toy_workload().pods))
    assert free == pytest.approx(25.0) and fragmented == pytest.approx(100 * (2 / 3) * 0.5 / 2)
    assert stranded == 0.0


def test_refusals_are_classified_by_the_reasons_their_nodes_gave() -> None:
    assert report.refusals(toy_result()) == Counter({"gpu-device": 1})
    assert report.reason_kind("Insufficient cpu") == "cpu"
    assert report.reason_kind("Insufficient aliyun.com/gpu-mem") == "gpu-total"
    assert report.reason_kind("node(s) didn't match Pod's node affinity/selector") == "model"


def test_the_end_check_finds_a_gpu_over_capacity_and_a_demand_that_does_not_add_up() -> None:
    result = toy_result()
    result.nodes["n"].gpu_used = [1200, 500]
    assert any("GPU 0: 1200 of 1000" in problem for problem in result.check())
    assert any("GPUs hold 1700 milli-GPU, but the pods bound asked 1500" in problem for problem in result.check())


def test_the_report_prints_the_figures_of_record() -> None:
    text = report.render(toy_result())
    assert "GPU allocated at the end: 75.0 %" in text and "130:75.0" in text and "end check: ok" in text


def test_kube_schedulers_refusal_message_is_read_as_reasons_per_node() -> None:
    message = (
        "0/1213 nodes are available: 3 Insufficient cpu, 1208 needs 810 milli-GPU on one GPU; largest free is "
        "700 milli-GPU (GPU 3 of 8), 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/1213 "
        "nodes are available: 1213 Preemption is not helpful for scheduling."
    )
    assert unschedulable_reasons(message) == {
        "Insufficient cpu": 3,
        "needs 810 milli-GPU on one GPU; largest free is 700 milli-GPU (GPU 3 of 8)": 1208,
        "node(s) didn't match Pod's node affinity/selector": 2,
    }


def test_without_a_trace_the_command_says_how_to_get_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.arguments(["--mode", "fast"])
    assert "clusterdata" in capsys.readouterr().err


def test_the_extender_binds_pods_asking_several_gpus_in_gpushare_as_the_figures_were_measured() -> None:
    """Every mode (fast, real, burst, churn) serves with these flags; a flag of the run's own comes after them."""
    parsed = cli.arguments(["--synthetic", "--mode", "fast", "--extender-flag=--placement=fill"])
    assert parsed.extender_flag == [
        "--gpushare-several-gpus=bind",
        "--scheduler-name=gpu-scheduler",
        "--placement=fill",
    ]
    served, _ = cli.command_settings("serve", parsed.extender_flag)
    assert served.gpushare_several_gpus is SeveralGpus.BIND
    measured = cli.arguments(["--synthetic", "--mode", "fast", "--extender-flag=--gpushare-several-gpus=refuse"])
    served, _ = cli.command_settings("serve", measured.extender_flag)
    assert served.gpushare_several_gpus is SeveralGpus.REFUSE


@pytest.mark.parametrize("protocol", [["--protocol", "hami"], ["--mig"]], ids=["hami", "mig"])
def test_the_gpushare_flags_are_not_given_in_hamis_protocol(protocol: list[str]) -> None:
    parsed = cli.arguments(["--synthetic", "--mode", "real", *protocol])
    assert not any(flag.startswith("--gpushare") for flag in parsed.extender_flag)


def test_the_fast_mode_with_the_shipped_default_places_no_pod_asking_several_gpus() -> None:
    """What `--extender-flag=--gpushare-several-gpus=refuse` measures: no multi-GPU pod placed, those that reach
    the extender (kube-scheduler's own filters leave it a node) refused by gpushare's reason."""
    workload = synthetic_workload(5)
    flags = ["--scheduler-name=gpu-scheduler"]
    served, _ = cli.command_settings("serve", flags)
    result = fast.replay(workload, served, cli.config_text(flags), 5)
    several = [outcome for outcome in result.outcomes if outcome.pod.gpus > 1]
    assert several and not any(outcome.node for outcome in several)
    said = [reason for outcome in several for reason in outcome.reasons if "gpushare's device plugin" in reason]
    assert said and result.problems == []


def test_a_sample_of_the_trace_keeps_the_papers_ratio_for_its_own_capacity(trace: Path) -> None:
    parsed = cli.arguments(["--trace", str(trace), "--nodes", "1", "--mode", "fast", "--ratio", "1.0"])
    sampled = cli.workload(parsed, 42)
    assert len(sampled.nodes) == 1
    assert sum(pod.gpu_demand for pod in sampled.pods) <= sampled.gpu_capacity
    random.Random(0)  # the sample is drawn from the seed, not the global generator


# ---- the MIG workload -----------------------------------------------------------------------------------


def mig_runs(seed: int = 5) -> tuple[mig.MigResult, mig.MigResult]:
    workload = mig.synthetic_mig(seed)
    flags = ["--scheduler-name=gpu-scheduler", "--protocol=hami"]
    served, _ = cli.command_settings("serve", flags)
    return mig.replay_ours(workload, served, cli.config_text(flags), seed), mig.replay_hami(workload, seed)


def test_the_mig_workload_runs_both_policies_within_every_gpus_slices_and_the_same_for_a_seed() -> None:
    ours, hami = mig_runs()
    again = mig_runs()
    for result, repeated in zip((ours, hami), again, strict=True):
        assert result.problems == []
        figures = mig.figures(result)
        assert figures["placed"] > 0 and 0 < figures["slices"] <= 100 and figures["memory"] <= figures["slices"]
        assert mig.figures(repeated) == figures
        kept = mig.entry(result, 5)  # what a run record keeps: the page's MIG table
        assert (kept["scheduler"], kept["seed"], kept["placed"], kept["problems"]) == (
            result.policy,
            5,
            figures["placed"],
            [],
        )
        assert all(kept[key] == round(float(figures[key]), 3) for key in mig.RECORDED)


@pytest.mark.parametrize(
    ("milli", "memory"), [(110, 9856), (230, 19968), (470, 40192), (490, 40192), (500, 80384), (1000, 80384)]
)
def test_a_share_asks_the_memory_of_the_smallest_profile_that_holds_it_of_an_80_gib_gpu(
    milli: int, memory: int
) -> None:
    """0.49 x 81920 = 40141 MiB: a 3g.40gb (40192); 0.5 x 81920 = 40960: only the 7g holds it."""
    assert mig.gpu_memory(TracePod("p", 1000, 1024, 1, milli)) == memory


def test_a_mig_profiles_core_is_the_ceiling_hami_registers() -> None:
    """ceil(SMs x 100 / 98): 14 SMs -> 15, 28 -> 29, 42 -> 43, 56 -> 58, 98 -> 100."""
    assert [profile.cores for profile in mig.PROFILES] == [15, 15, 29, 43, 58, 100]


def test_hamis_greedy_takes_the_fullest_node_and_there_the_emptiest_gpu_from_the_end() -> None:
    """Node binpack, GPU spread (Fit walks the sorted list from its end: the highest index among the emptiest),
    the 1g.20gb at the highest start."""
    nodes = [TraceNode("a", 1000, 1000, 2, mig.A100), TraceNode("b", 1000, 1000, 2, mig.A100)]
    hami = mig.HamiGreedy(nodes, seed=0)
    pod = ModelPod("first", {}, (), mig.pod_object(TracePod("first", 1, 1, 1, 470), {}, "hami-scheduler"))
    hami("filter", pod, ["a", "b"])
    first = hami.bind("first")
    assert first[1] == ((1, mig.Instance("3g.40gb", 4, 4, 40192, 43)),)
    pod = ModelPod("second", {}, (), mig.pod_object(TracePod("second", 1, 1, 1, 230), {}, "hami-scheduler"))
    assert hami("filter", pod, ["a", "b"]).passed == [first[0]]
    assert hami.bind("second")[1] == ((0, mig.Instance("1g.20gb", 6, 2, 19968, 15)),)


def test_the_mig_end_check_finds_overlapping_instances_and_a_gpu_over_its_seven() -> None:
    node = TraceNode("n", 1000, 1000, 1, mig.A100)
    pods = tuple(TracePod(f"p{number}", 1, 1, 1, 100) for number in range(8))
    workload = mig.MigWorkload("toy", (node,), pods, pods, {})
    placed = {pod.name: ((0, mig.Instance("1g.10gb", min(number, 6), 1, 9856, 15)),) for number, pod in enumerate(pods)}
    result = mig.MigResult("toy", workload, [Outcome(pod, "n") for pod in pods], placed, 0.0)
    problems = mig.check(result)
    assert "n GPU 0: instances overlap at slice 6" in problems and "n GPU 0: 8 instances, more than 7" in problems


class EndingWatches:
    """A control plane whose pod watches each end after their scripted events, as kube-apiserver ends a watch
    after its request timeout (30 to 60 minutes: a slow peer's replay outlasts one). Records the paths opened."""

    def __init__(self, *scripts: list[dict[str, Any]]) -> None:
        self.scripts = list(scripts)
        self.paths: list[str] = []

    @contextlib.asynccontextmanager
    async def watch(self, path: str, timeout: float | None = None) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        self.paths.append(path)
        script = self.scripts.pop(0) if self.scripts else []

        async def events() -> AsyncIterator[dict[str, Any]]:
            for event in script:
                yield event

        yield events()


def pod_event(kind: str, name: str, version: str) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": version}}}


def test_the_pod_watch_is_opened_again_from_the_last_version_when_the_api_server_ends_it() -> None:
    from bench.placement.real import RealError, RealReplay

    replay = RealReplay.__new__(RealReplay)
    replay.plane = EndingWatches(  # type: ignore[assignment]
        [pod_event("ADDED", "a", "11"), pod_event("BOOKMARK", "", "15")],
        [pod_event("MODIFIED", "a", "17")],
    )

    async def read(count: int) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        async for kind, pod in replay._pod_events("10"):
            seen.append((kind, pod["metadata"]["name"]))
            if len(seen) == count:
                break
        return seen

    assert asyncio.run(read(2)) == [("ADDED", "a"), ("MODIFIED", "a")], "a bookmark is not an event"
    assert [path.rsplit("resourceVersion=", 1)[1] for path in replay.plane.paths] == ["10", "15"]  # type: ignore[attr-defined]
    replay.plane = EndingWatches()  # type: ignore[assignment]
    with pytest.raises(RealError, match="closed the pod watch three times at once"):
        asyncio.run(read(1))


def test_a_refusal_that_is_not_final_waits_for_kube_schedulers_retry_and_stands_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HAMi's node lock is held from a bind until the plugin has allocated the pod, and an extender that does not
    answer (a peer restarting) fails the pods meanwhile with a scheduler error: kube-scheduler tries such a pod
    again (at the Node update, after its back-off), so the one-at-a-time replay does not drop it meanwhile."""
    from bench.placement import real
    from bench.placement.real import RealReplay, Seen, refusal

    monkeypatch.setattr(real, "RETRY_GRACE", 0.3)
    replay = RealReplay.__new__(RealReplay)
    replay._check_alive = lambda: None  # type: ignore[method-assign]
    locked = "0/2 nodes are available: 2 node is locked for pod default/a until its device plugin has allocated it"
    down = 'Post "http://127.0.0.1:39211/gpushare-scheduler/filter": dial tcp 127.0.0.1:39211: connection refused'

    async def decide(first: str, then: Callable[[Seen], None] | None) -> Seen:
        seen = Seen(refused={"b": first}, retried={"b"})
        watcher = asyncio.create_task(asyncio.sleep(10))
        if then is not None:
            asyncio.get_running_loop().call_later(0.05, then, seen)
        await replay._retry(seen, watcher, "b")
        watcher.cancel()
        return seen

    def refused_for_good(message: str) -> Callable[[Seen], None]:
        return lambda seen: (seen.refused.__setitem__("b", message), seen.retried.discard("b"))  # type: ignore[func-returns-value]

    for first in (locked, down):
        bound = asyncio.run(decide(first, lambda seen: seen.bound.__setitem__("b", "n1")))
        assert bound.bound == {"b": "n1"} and "b" not in bound.refused
        full = "0/2 nodes are available: 2 Insufficient cpu"
        refused = asyncio.run(decide(first, refused_for_good(full)))
        assert refused.refused == {"b": full}, "the retry's own refusal stands"
        assert asyncio.run(decide(first, None)).refused == {"b": first}, "no retry came: the refusal stands"
        again = asyncio.run(decide(first, lambda seen: seen.refused.__setitem__("b", down)))
        assert again.refused == {"b": down}, "refused again, not for good: waited to the end, the last refusal stands"

    def condition(reason: str, message: str) -> dict[str, Any]:
        scheduled = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        return {"status": {"conditions": [scheduled]}}

    assert refusal(condition("Unschedulable", "0/2 nodes are available: 2 Insufficient cpu")) == (
        "0/2 nodes are available: 2 Insufficient cpu",
        True,
    )
    assert refusal(condition("Unschedulable", locked)) == (locked, False)
    assert refusal(condition("SchedulerError", down)) == (down, False)
    assert refusal(condition("SchedulingGated", "gated")) is None
    assert real.LOCKED.search("node openb-node-1 has been locked within 5m0s: node lock contention")


def test_a_pod_bound_then_deleted_is_not_waited_for_to_be_allocated() -> None:
    """A pod refused on the nodes kube-scheduler sampled, and so deleted, that its retry bound in between: the
    double allocates no pod that is gone, and the replay waited 120 s for it, then failed the run."""
    from bench.placement.real import RealReplay, Seen

    replay = RealReplay.__new__(RealReplay)
    replay._check_alive = lambda: None  # type: ignore[method-assign]
    replay.workdir = Path("/tmp/run")
    replay.workload = SimpleNamespace(pods=[SimpleNamespace(name="a", gpus=1), SimpleNamespace(name="b", gpus=1)])  # type: ignore[assignment]
    plugin = SimpleNamespace(allocations=["a"], violations=[])

    async def wait() -> None:
        seen = Seen(bound={"a": "n1", "b": "n1"}, uids={"a": "uid-a", "b": "uid-b"}, deleted={"b"})
        watcher = asyncio.create_task(asyncio.sleep(10))
        try:
            await asyncio.wait_for(replay._allocated(plugin, seen, watcher), 5)  # type: ignore[arg-type]
        finally:
            watcher.cancel()

    asyncio.run(wait())


def test_a_failure_of_the_plugin_double_on_the_pod_ends_the_wait_for_its_allocation_at_once() -> None:
    """The double records an API call that failed it as a finding and never allocates the pod: the replay waited
    out its 120 s and then named neither the pod's failure nor where to look."""
    from bench.placement.real import RealError, RealReplay, Seen

    replay = RealReplay.__new__(RealReplay)
    replay._check_alive = lambda: None  # type: ignore[method-assign]
    replay.workdir = Path("/tmp/run")
    plugin = SimpleNamespace(violations=["the double failed on default/a on n1: 429"], admitted=lambda uid: False)

    async def wait() -> None:
        seen = Seen(uids={"b": "uid-b"})
        watcher = asyncio.create_task(asyncio.sleep(10))
        fail = "the double failed on default/b on n1: PATCH /api/v1/namespaces/default/pods/b: 500"
        asyncio.get_running_loop().call_later(0.05, plugin.violations.append, fail)
        try:
            await asyncio.wait_for(replay._admitted(plugin, seen, watcher, "b"), 5)  # type: ignore[arg-type]
        finally:
            watcher.cancel()

    with pytest.raises(RealError, match=r"pod b: its allocation .*: the double failed on default/b on n1: PATCH"):
        asyncio.run(wait())
