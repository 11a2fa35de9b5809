"""The gang replay's workload and accounting (bench/placement/job_mix.py, job_report.py, jobs_real.py's reading of
refusals): jobs drawn from trace pod shapes as the page says, declared as Kueue reads them, and each job's end
state read from API snapshots. No cluster: the replay itself runs in `python -m bench.placement.jobs`."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from bench import figures, record
from bench.placement.job_mix import SIZES, TraceJob, declare, draw_jobs, job_workload, sample_nodes
from bench.placement.job_report import render, tally
from bench.placement.job_timeline import JobTimeline, as_pods, job_plan
from bench.placement.jobs_real import job_refusal
from bench.placement.trace import GPUSHARE, MILLI, PROFILE, TracePod, pod_object, synthetic
from extender.core.groups import GroupKey, MemberPod, Scheme, declared, group_of

NODES, PODS = synthetic(seed=7, scale=2)
CAPACITY = sum(node.gpus for node in NODES) * MILLI


def make_pod(name: str, gpus: int = 1, milli: int = MILLI) -> TracePod:
    return TracePod(name, 4000, 8192, gpus, milli)


def make_job(name: str, size: int, gpus: int = 1, milli: int = MILLI) -> TraceJob:
    return TraceJob(name, "shape", tuple(make_pod(f"{name}-{n}", gpus, milli) for n in range(size)))


# ---- the mix ------------------------------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_jobs_and_another_seed_others() -> None:
    first = draw_jobs(PODS, CAPACITY, 42, 1.3)
    assert first == draw_jobs(PODS, CAPACITY, 42, 1.3)
    assert first != draw_jobs(PODS, CAPACITY, 43, 1.3)


def test_jobs_arrive_until_their_gpu_demand_reaches_the_ratio_the_last_one_passing_it() -> None:
    jobs = draw_jobs(PODS, CAPACITY, 42, 1.3)
    total = sum(job.gpu_demand for job in jobs)
    assert total >= 1.3 * CAPACITY > total - jobs[-1].gpu_demand


def test_a_jobs_pods_share_one_trace_shape_and_are_named_after_the_job() -> None:
    shapes = {pod.name: pod for pod in PODS}
    for job in draw_jobs(PODS, CAPACITY, 42, 1.3):
        shape = shapes[job.shape]
        assert [member.name for member in job.members] == [f"{job.name}-{n}" for n in range(job.size)]
        assert {(m.cpu_milli, m.memory_mib, m.gpus, m.gpu_milli, m.models) for m in job.members} == {
            (shape.cpu_milli, shape.memory_mib, shape.gpus, shape.gpu_milli, shape.models)
        }


def test_only_single_pod_jobs_may_ask_no_gpu_and_every_size_of_the_mix_comes() -> None:
    jobs = draw_jobs(PODS, 20 * CAPACITY, 42, 1.3)
    assert all(job.members[0].gpus for job in jobs if job.size > 1)
    assert any(not job.members[0].gpus for job in jobs if job.size == 1)
    assert set(Counter(job.size for job in jobs)) == {size for size, _ in SIZES}


def test_the_workload_is_every_jobs_pods_job_after_job_on_the_nodes_given() -> None:
    jobs = job_workload("synthetic", NODES, PODS, 42, 1.3)
    assert jobs.workload.pods == tuple(member for job in jobs.jobs for member in job.members)
    assert jobs.workload.nodes == NODES and jobs.workload.trace_pods == PODS
    assert jobs.job_of()[jobs.jobs[3].members[-1].name] == jobs.jobs[3]


def test_the_node_sample_is_seeded_by_name_and_all_nodes_when_asked_for_none_or_more() -> None:
    sample = sample_nodes(NODES, 10, 42)
    assert sample == sample_nodes(NODES, 10, 42) and len(sample) == 10
    assert [node.name for node in sample] == sorted(node.name for node in sample)
    assert sample_nodes(NODES, 0, 42) == NODES == sample_nodes(NODES, 1000, 42)


# ---- the declaration ----------------------------------------------------------------------------------------


def test_a_job_of_several_pods_is_declared_as_kueue_reads_a_group_of_its_size() -> None:
    job = make_job("job-00007", 4)
    said = declared(declare(pod_object(job.members[2]), job))
    assert said is not None and not said.problem
    assert said.group == GroupKey(Scheme.KUEUE, "default", "job-00007") and said.minimum == 4


def test_a_single_pod_job_carries_no_declaration() -> None:
    job = make_job("job-00001", 1)
    body = declare(pod_object(job.members[0]), job)
    assert body == pod_object(job.members[0]) and declared(body) is None


# ---- the end state of each job ------------------------------------------------------------------------------


def bound(member: TracePod, node: str, index: int = 0) -> dict[str, Any]:
    """The API's pod as gpushare's device plugin reads it once bound: node and GPU index annotated."""
    body = pod_object(member)
    body["spec"]["nodeName"] = node
    body["metadata"]["annotations"] = {PROFILE.index_annotation: str(index)}
    return body


def test_each_job_is_started_whole_partly_placed_or_never_started_by_its_pods_bound() -> None:
    whole, partial, never, single = make_job("a", 4), make_job("b", 4), make_job("c", 2), make_job("d", 1, milli=500)
    pods = [bound(member, "n1") for member in whole.members]
    pods += [bound(partial.members[0], "n2"), bound(partial.members[1], "n2", 1), pod_object(partial.members[2])]
    pods += [bound(single.members[0], "n3")]
    result = tally([whole, partial, never, single], pods, GPUSHARE, 10 * MILLI)
    assert [state.kind for state in result.states] == ["whole", "partial", "never", "whole"]
    figures = result.summary()
    # whole: a (4 GPUs) and d (0.5): 45 % of 10 GPUs; partial: b's 2 bound pods, 2 GPUs doing nothing: 20 %
    assert (figures["whole"], figures["whole_gangs"], figures["partial"], figures["never"]) == (2, 1, 1, 1)
    assert (figures["useful"], figures["partial_share"], figures["allocated"]) == (45.0, 20.0, 65.0)
    assert figures["partial_gpus"] == 2.0 and figures["never_gangs"] == 1
    assert figures["by_size"] == {
        "1": {"whole": 1, "partial": 0, "never": 0},
        "2": {"whole": 0, "partial": 0, "never": 1},
        "4": {"whole": 1, "partial": 1, "never": 0},
    }
    assert not figures["problems"]


def test_the_gpus_a_partial_job_holds_are_what_its_pods_annotations_give_them() -> None:
    job = make_job("b", 3, milli=300)
    result = tally([job], [bound(job.members[0], "n1"), bound(job.members[1], "n1")], GPUSHARE, 2 * MILLI)
    assert result.held("partial") == 600 and result.share("partial") == 30.0


def test_a_bound_gpu_pod_without_its_allocation_is_a_problem_and_holds_nothing() -> None:
    job = make_job("a", 2)
    unannotated = pod_object(job.members[1])
    unannotated["spec"]["nodeName"] = "n1"
    result = tally([job], [bound(job.members[0], "n1"), unannotated], GPUSHARE, 4 * MILLI)
    assert result.states[0].kind == "whole" and result.held("whole") == MILLI
    assert result.problems == ("pod a-1 is bound to n1 without its GPU allocation",)


def test_the_report_says_the_jobs_and_the_gpus_doing_nothing() -> None:
    job = make_job("b", 4)
    figures = tally([job], [bound(job.members[0], "n1")], GPUSHARE, 4 * MILLI).summary()
    text = render(figures)
    assert "partly placed 1, never started 0" in text and "(1.0 GPUs doing nothing)" in text
    assert "4: 0/1/0" in text


# ---- which refusals are final -------------------------------------------------------------------------------


def refused(message: str, reason: str = "Unschedulable") -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
    return {"status": {"conditions": [condition]}}


def test_a_member_waiting_for_its_jobs_other_pods_is_not_refused_for_good() -> None:
    key = GroupKey(Scheme.KUEUE, "default", "job-00003")
    waiting = group_of(key, [(MemberPod("u0", "job-00003-0", False), 4)]).gang().waiting
    message = f"0/20 nodes are available: 20 {waiting}."
    assert job_refusal(refused(message)) == (message, False)
    held = (
        "0/20 nodes are available: 20 pod default/job-00003-1 is held on node n7 for its job, not among the nodes sent."
    )
    assert job_refusal(refused(held)) == (held, False)


def test_a_job_that_does_not_fit_and_a_pod_that_fits_nowhere_are_refused_for_good() -> None:
    for message in (
        "0/20 nodes are available: 20 job default/job-00003 needs 4 pods of 1 GPU with 1000 milli-GPU; 2 fit now.",
        "0/20 nodes are available: 12 Insufficient cpu, 8 Insufficient aliyun.com/gpu-mem.",
    ):
        assert job_refusal(refused(message)) == (message, True)


# ---- the page's table ---------------------------------------------------------------------------------------


def job_run(scheduler: str, seed: int, partial: int = 0, protocol: str = "gpushare") -> dict[str, Any]:
    return {
        "scheduler": scheduler, "protocol": protocol, "seed": seed, "nodes": 200, "gpus": 1000, "jobs": 500,
        "pods": 1600, "allocated": 90.0 + partial, "useful": 90.0, "whole": 350, "partial": partial,
        "partial_gpus": 2.5 * partial, "never": 150 - partial, "problems": [],
    }  # fmt: skip


def jobs_record(*runs: dict[str, Any]) -> record.Record:
    return record.Record(
        bench="bench.placement.jobs", command="python -m bench.placement.jobs", commit=None, dirty=None,
        started="2026-01-01T00:00:00+00:00", machine=record.Machine("AMD EPYC", 2, "3.11.7 (CPython)"), settings={},
        results={"runs": list(runs)}, exit_status=0,
    )  # fmt: skip


def test_the_jobs_table_gives_each_scheduler_a_row_seed_by_seed_ours_first() -> None:
    kept = [
        jobs_record(job_run("gpushare-scheduler-extender", 42, partial=4)),
        jobs_record(job_run("ours, no groups", 43, partial=2), job_run("ours, no groups", 42, partial=1)),
        jobs_record(job_run("ours, jobs declared", 42)),
    ]
    rows = [line for line in figures.jobs_table(kept).splitlines() if line.startswith("| ") and "seeds" not in line]
    assert rows == [
        "| ours, jobs declared | 42 | 90.0 | 90.0 | 350 | 0 (0.0) | 150 | passed |",
        "| ours, no groups | 42 / 43 | 91.0 / 92.0 | 90.0 / 90.0 | 350 / 350 | 1 (2.5) / 2 (5.0) | 149 / 148 "
        "| passed |",
        "| gpushare-scheduler-extender | 42 | 94.0 | 90.0 | 350 | 4 (10.0) | 146 | passed |",
    ]


def test_the_jobs_table_heads_each_protocol_when_there_are_two() -> None:
    kept = [jobs_record(job_run("hami-scheduler", 42, protocol="hami"), job_run("ours, jobs declared", 42))]
    table = figures.jobs_table(kept)
    assert table.index("*gpushare's protocol*") < table.index("ours, jobs declared") < table.index("*HAMi's")
    assert table.index("*HAMi's protocol*") < table.index("| hami-scheduler |")


# ---- jobs that come and go ----------------------------------------------------------------------------------


def test_a_job_as_a_pod_asks_all_its_pods_gpus_and_lives_its_shapes_lifetime() -> None:
    job = TraceJob("job-1", "shape", tuple(replace(make_pod(f"job-1-{n}", 2), lifetime=600) for n in range(4)))
    (pod,) = as_pods([job])
    assert (pod.name, pod.gpu_demand, pod.lifetime) == ("job-1", 8 * MILLI, 600)


def test_the_churn_plan_keeps_the_jobs_that_arrive_and_their_pods_in_order() -> None:
    jobs = job_workload("synthetic", NODES, PODS, 42, 20.0)
    plan, kept, as_workload = job_plan(jobs, 1.2, 2.0, 20.0, 3600.0)
    assert plan.pods == len(kept.jobs) == len(as_workload.pods) and kept.jobs == jobs.jobs[: plan.pods]
    assert kept.workload.pods == tuple(member for job in kept.jobs for member in job.members)


def test_pods_of_a_job_not_started_hold_gpu_time_until_its_last_pod_binds() -> None:
    # a job of 3 whole GPUs: 1 GPU from t=10, 2 from t=40, started at t=100: 30 + 120 = 150 GPU-seconds held
    timeline = JobTimeline((make_job("a", 3),), 10 * MILLI)
    timeline.arrive(0, 0.0)
    assert not timeline.bind(0, 0, 10.0) and not timeline.bind(0, 1, 40.0)
    assert timeline.partly_placed() == 1 and timeline.partial == 2 * MILLI
    assert timeline.bind(0, 2, 100.0)
    assert (timeline.partial, timeline.running, timeline.partly_placed()) == (0, 3 * MILLI, 0)
    figures = timeline.figures(1000.0, 3600.0)
    assert figures["partial_gpu_hours"] == 150 / 3600
    assert figures["partial_share"] == 100 * 150 * MILLI / (10 * MILLI * 1000.0)  # 1.5 % of 10 GPUs x 1000 s
    assert (figures["started"], figures["gang_wait_p50"]) == (1, 100.0)
    assert figures["partly_placed_longest"] == 90.0, "from its first bind at t=10 to its last at t=100"


def test_a_job_withdrawn_lets_go_of_what_its_pods_held_and_counts_as_withdrawn_partly_placed() -> None:
    timeline = JobTimeline((make_job("a", 2), make_job("b", 2)), 4 * MILLI)
    timeline.arrive(0, 0.0)
    timeline.arrive(1, 0.0)
    timeline.bind(0, 0, 0.0)
    assert timeline.withdraw(0, 60.0) and timeline.withdraw(1, 60.0)
    assert not timeline.withdraw(0, 61.0) and not timeline.bind(0, 1, 62.0)
    figures = timeline.figures(100.0, 60.0)
    assert timeline.partial == 0 and figures["partial_gpu_hours"] == 60 / 3600
    assert (figures["withdrawn"], figures["withdrawn_partial"], figures["gang_wait_p90"]) == (2, 1, 60.0)
    assert figures["partly_placed_longest"] == 60.0, "a bound at 0, withdrawn at 60; b never partly placed"


def test_the_longest_a_job_was_partly_placed_counts_one_still_waiting_at_the_end() -> None:
    timeline = JobTimeline((make_job("a", 2), make_job("b", 2)), 4 * MILLI)
    timeline.arrive(0, 0.0)
    timeline.arrive(1, 0.0)
    assert not timeline.bind(0, 0, 1.0) and timeline.bind(0, 1, 2.0)
    assert not timeline.bind(1, 0, 30.0)
    assert timeline.figures(100.0, 3600.0)["partly_placed_longest"] == 70.0, "b from 30 to the end"


def test_a_started_job_finishing_gives_back_its_gpus_once() -> None:
    timeline = JobTimeline((make_job("a", 1, milli=500),), 2 * MILLI)
    timeline.arrive(0, 0.0)
    assert timeline.bind(0, 0, 5.0)
    timeline.finish(0, 50.0)
    timeline.finish(0, 60.0)
    assert timeline.running == 0 and timeline.figures(100.0, 60.0)["partial_gpu_hours"] == 0.0


def test_a_job_still_waiting_at_the_end_counts_its_wait_so_far_and_what_it_holds() -> None:
    timeline = JobTimeline((make_job("a", 4),), 8 * MILLI)
    timeline.arrive(0, 30.0)
    timeline.bind(0, 0, 40.0)
    figures = timeline.figures(100.0, 3600.0)
    assert (figures["waiting"], figures["waiting_partial"], figures["gang_wait_p50"]) == (1, 1, 70.0)


def churn_run(scheduler: str, seed: int, partial_hours: float) -> dict[str, Any]:
    return {
        "scheduler": scheduler, "protocol": "gpushare", "seed": seed, "mode": "churn", "nodes": 200, "gpus": 1000,
        "jobs": 3000, "hours": 2.0, "offered": 1.2, "patience_minutes": 60.0, "allocated": 95.0, "useful": 80.0,
        "partial_gpu_hours": partial_hours, "partial_share": 7.5, "started": 2500, "withdrawn": 300,
        "withdrawn_partial": 40, "waiting": 200, "waiting_partial": 20, "gang_wait_p90": 1500.0, "problems": [],
        "partly_placed_longest": 90.0,
    }  # fmt: skip


def test_the_churn_runs_get_a_table_of_their_own_after_the_fill_ups() -> None:
    kept = [jobs_record(churn_run("ours, no groups", 42, 150.0), job_run("ours, no groups", 42))]
    table = figures.jobs_table(kept)
    assert table.index("**Fill-up**") < table.index("**Jobs that come and go**")
    assert "3,000 jobs arriving over 2 trace hours, 1.2 capacities offered, withdrawn after 60 trace minutes" in table
    row = "| ours, no groups | 42 | 95.0 | 80.0 | 150.0 (7.5) | 90s | 2,500 | 300 (40) | 200 (20) | 25m | passed |"
    assert row in table
    older = dict(churn_run("ours, no groups", 42, 150.0))
    del older["partly_placed_longest"]  # a record from before the figure was counted
    assert "| 150.0 (7.5) | not counted | 2,500 |" in figures.jobs_table([jobs_record(older)])
