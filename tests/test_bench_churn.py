"""`make bench-placement --churn`'s parts that need no control plane: lifetimes read from the trace, the plan
(the rate that keeps the cluster over-full), the fast mode's model of kube-scheduler's queue, the figures and the
picture. The real mode is held to the fast one by tests/e2e/test_placement.py."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from bench.placement import __main__ as cli
from bench.placement import churn, churn_fast, plot
from bench.placement.churn import Plan, PlanError
from bench.placement.trace import FOREVER, TraceError, TraceNode, TracePod, Workload, load, synthetic_workload

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn-0,96000,393216,8,G2\n"
TIMED_PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    "p-0,12000,16384,1,1000,,LS,Running,100,700,100\n"
    "p-1,3152,12288,1,810,,LS,Running,0,5000,0\n"  # deleted when the trace was cut: runs to the end
    "p-2,4000,8192,0,0,,LS,Failed,40,41,40\n"
)
FLAGS = ["--scheduler-name=gpu-scheduler"]


def run_fast(workload: Workload, plan: Plan, flags: list[str] = FLAGS) -> churn.ChurnResult:
    served, _ = cli.command_settings("serve", flags)
    return churn_fast.replay(workload, plan, served, cli.config_text(flags), seed=1)


def small_churn(seed: int = 7, hours: float = 2.0, patience: float = churn.PATIENCE) -> tuple[Plan, Workload]:
    return churn.plan(synthetic_workload(seed, 1, churn.LONGEST), hours=hours, minutes=10, patience=patience)


# ---- lifetimes and the plan -----------------------------------------------------------------------------


def test_a_pods_lifetime_is_deletion_minus_creation_and_the_trace_cut_runs_to_the_end(tmp_path: Path) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES_CSV)
    (tmp_path / "openb_pod_list_default.csv").write_text(TIMED_PODS)
    lives = {pod.name: pod.lifetime for pod in load(tmp_path, "default").trace_pods}
    assert lives == {"p-0": 600, "p-1": FOREVER, "p-2": 1}


def test_a_deletion_before_the_creation_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES_CSV)
    (tmp_path / "openb_pod_list_default.csv").write_text(TIMED_PODS.replace(",100,700,100", ",900,700,900"))
    with pytest.raises(TraceError, match=r":2: deletion_time 700 before creation_time 900"):
        load(tmp_path, "default")


def test_the_plan_offers_what_it_was_asked_over_the_runs_second_half() -> None:
    for offered in (0.8, 1.2, 1.6):
        plan, workload = churn.plan(synthetic_workload(7, 1, churn.LONGEST), offered=offered, hours=2, minutes=10)
        assert plan.pods == len(workload.pods)
        assert plan.span == pytest.approx(2 * 3600, rel=0.01)
        achieved = churn.mean_offered(workload.pods, plan.gap, plan.span / 2, plan.span)
        assert achieved == pytest.approx(offered * workload.gpu_capacity, rel=0.03)
        assert plan.speed == pytest.approx(plan.span / 600)


def test_more_offered_means_pods_closer_together() -> None:
    low, _ = small_churn()
    high, _ = churn.plan(synthetic_workload(7, 1, churn.LONGEST), offered=2.0, hours=2, minutes=10)
    assert high.gap < low.gap and high.pods > low.pods


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"offered": 0}, "--churn-offered 0"),
        ({"hours": 0}, "--churn-hours 0"),
        ({"minutes": 0.1}, "--churn-minutes 0.1"),
        ({"patience": 0}, "--churn-patience 0"),
        ({"hours": 400}, "even .* pods .* offer less"),
    ],
)
def test_a_plan_that_cannot_run_names_its_setting(settings: dict[str, float], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        churn.plan(synthetic_workload(7, 1, 3.0), **settings)


# ---- the fast mode's queue ------------------------------------------------------------------------------


def test_kube_schedulers_backoff_doubles_from_one_second_to_ten() -> None:
    assert [churn_fast.backoff(count) for count in range(7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert churn_fast.backoff(10_000) == 10.0


def test_a_pod_that_fits_nowhere_waits_and_is_bound_when_the_pod_before_it_leaves() -> None:
    """One node of one GPU: A takes it for 600 trace seconds; B arrives while A runs and waits in the queue until
    A's deletion moves it to be tried again, or is withdrawn at its patience, and then C takes the GPU."""
    node = TraceNode("n-0", 32000, 131072, 1, "G2")
    pods = (
        TracePod("a", 1000, 1024, 1, 1000, lifetime=600),
        TracePod("b", 1000, 1024, 1, 1000, lifetime=FOREVER),
        TracePod("c", 1000, 1024, 1, 1000, lifetime=FOREVER),
    )
    workload = Workload("tiny", (node,), pods, pods)
    result = run_fast(workload, Plan(gap=100.0, speed=10.0, patience=400.0, offered=1.0, pods=3))
    assert [index for index, _ in result.binds] == [0]  # the run ends at the last arrival, 200 s: A still runs
    longer = run_fast(workload, Plan(gap=400.0, speed=10.0, patience=700.0, offered=1.0, pods=3))
    # A at 0 until 600; B arrives at 400 and is bound at 600 (waited 200 s); C arrives at 800 and waits (B runs
    # forever): the run ends at 800, before C's patience.
    assert [index for index, _ in longer.binds] == [0, 1]
    assert longer.waits["whole"] == [0.0, pytest.approx(200.0)]
    assert longer.waiting_at_end["whole"] == 1
    impatient = run_fast(workload, Plan(gap=400.0, speed=10.0, patience=100.0, offered=1.0, pods=3))
    assert [index for index, _ in impatient.binds] == [0, 2]  # B withdrawn at 500, before A leaves; C takes it
    assert impatient.withdrawn["whole"] == 1 and not impatient.all_problems


def test_a_churn_run_is_repeatable_and_checks_the_cluster_at_the_end() -> None:
    plan, workload = small_churn()
    first, second = run_fast(workload, plan), run_fast(workload, plan)
    shown = churn.figures(first)
    assert shown.placements == churn.figures(second).placements
    assert not shown.problems
    assert len(first.samples) == churn.SAMPLES + 1
    assert all(0 <= sample.allocated <= 100 for sample in first.samples)
    assert 80 < shown.allocated <= 100 and shown.offered > 100  # the cluster ran full and pods queued
    assert shown.binds > plan.pods * 0.7
    counted = sum(count for *_, count in shown.waits.values())  # every pod that arrived has a wait
    assert counted == shown.binds + shown.withdrawn + shown.waiting_at_end == plan.pods
    assert first.extra["skipped"] and first.extra["cycles"]


def test_the_work_the_model_skips_changes_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every retry run as a full cycle (nothing skipped) binds the same pods to the same nodes in the same order."""
    plan, workload = small_churn(seed=5, hours=1.5)
    skipping = run_fast(workload, plan)
    monkeypatch.setattr(churn_fast.ChurnFast, "certain_to_fail", lambda self, queued: False)
    every = run_fast(workload, plan)
    assert every.extra["skipped"] == 0 and skipping.extra["skipped"]
    assert every.binds == skipping.binds
    assert every.withdrawn == skipping.withdrawn


def test_pods_withdrawn_count_at_their_patience_in_the_waits() -> None:
    plan, workload = small_churn(patience=120.0)
    result = run_fast(workload, plan)
    shown = churn.figures(result)
    assert shown.withdrawn > 0
    assert max(p99 for _, _, p99, count in shown.waits.values() if count) <= 120.0 + 1e-6
    assert churn.percentile([], 0.5) != churn.percentile([], 0.5)  # NaN: no pod of that kind


def test_the_report_says_what_the_run_found() -> None:
    plan, workload = small_churn()
    text = churn.render(run_fast(workload, plan), "fast, seed 7")
    assert "GPU allocated over the full part:" in text and "wait p50/p90/p99" in text
    assert "end check: ok" in text and "withdrawn" in text


# ---- the picture and the command ----------------------------------------------------------------------


def test_the_picture_is_svg_with_a_line_per_run_and_gaps_where_nothing_was_measured() -> None:
    lines = (
        plot.Line("ours", ((0.0, 1.0), (1.0, 2.0), (2.0, math.nan), (3.0, 4.0), (4.0, 5.0))),
        plot.Line("fill <&>", ((0.0, 2.0), (4.0, 1.0))),
    )
    text = plot.svg([plot.Panel("GPU allocated", "hours", "%", lines)], "a title")
    root = ElementTree.fromstring(text)
    namespace = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f".//{namespace}polyline")) == 3  # "ours" broken in two at the NaN
    labels = [element.text for element in root.iter(f"{namespace}text")]
    assert "fill <&>" in labels and "a title" in labels
    assert plot.svg([plot.Panel("t", "x", "y", lines)]) == plot.svg([plot.Panel("t", "x", "y", lines)])


def test_the_command_runs_churn_for_each_policy_and_draws_the_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "curves.svg"
    argv = ["--synthetic", "--churn", "--mode", "fast", "--churn-hours", "1", "--policies", "shipped,fill"]
    assert cli.main([*argv, "--plot", str(picture)]) == 0
    printed = capsys.readouterr().out
    assert "== shipped, fast, seed 42, churn" in printed and "== fill, fast, seed 42, churn" in printed
    assert "== summary, churn" in printed
    root = ElementTree.fromstring(picture.read_text())
    assert len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) >= 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--churn", "--mode", "burst"], "burst is the fill-up replay's"),
        (["--policies", "best"], "--policies 'best'"),
    ],
)
def test_the_command_refuses_what_it_cannot_run(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.arguments(["--synthetic", *argv])
    assert message in capsys.readouterr().err


def test_a_bind_counts_as_one_more_failure_of_every_pod_waiting() -> None:
    """kube-scheduler v1.34 moves every pod the extender refused to the backoff queue when any pod is bound
    (`addPodToCache`, queueing hints GA), and the idle scheduler tries it again at once: its failures go one up
    and its timestamp to the bind's, which lengthens its backoff against the pods that come after it."""
    node = TraceNode("n-0", 32000, 131072, 2, "G2")
    pods = (
        TracePod("a", 1000, 1024, 1, 1000, lifetime=FOREVER),
        TracePod("big", 1000, 1024, 2, 1000, lifetime=FOREVER),  # waits: one GPU of two is taken
        TracePod("c", 1000, 1024, 1, 500, lifetime=FOREVER),
        TracePod("d", 1000, 1024, 1, 500, lifetime=FOREVER),
    )
    served, _ = cli.command_settings("serve", FLAGS)
    model = churn_fast.ChurnFast(
        Workload("tiny", (node,), pods, pods),
        Plan(gap=100.0, speed=10.0, patience=1000.0, offered=1.0, pods=4),
        served,
        cli.config_text(FLAGS),
    )
    result = model.run()
    assert [index for index, _ in result.binds] == [0, 2, 3]
    waiting = model.pods[1]
    model.caught_up(waiting)
    assert waiting.failures == 3  # refused on arrival, and once after each of the two binds that followed
    assert waiting.timestamp == pytest.approx(30.0)  # d's bind, at 300 trace s


def test_an_api_call_cancelled_before_its_turn_leaves_no_coroutine_unawaited() -> None:
    """A real run that fails cancels the calls still queued for a slot: each closes the request it never sent
    (Python would warn "coroutine ... was never awaited" for each, one per pod still to create)."""
    import asyncio
    import gc
    import warnings

    from bench.placement.churn_real import ChurnReal

    sent: list[str] = []

    async def request(name: str) -> None:
        sent.append(name)
        await asyncio.Event().wait()  # an API server that does not answer

    async def run() -> None:
        driver = ChurnReal.__new__(ChurnReal)
        driver.slots, driver.calls, driver.latest = asyncio.Semaphore(1), set(), 0.0
        driver._call(request("first"))
        driver._call(request("second"))
        await asyncio.sleep(0)
        for call in driver.calls:
            call.cancel()
        await asyncio.gather(*driver.calls, return_exceptions=True)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        asyncio.run(run())
        gc.collect()
    assert sent == ["first"]
