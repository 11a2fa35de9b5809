"""The placement page's table and the README's placement rows, from `make bench-placement`'s run records; and what
a run keeps in its record (bench/placement/runs.py), from a replay of the synthetic workload in process."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bench import figures, figures_placement, record
from bench.placement import __main__ as cli
from bench.placement import fast, runs
from bench.placement.__main__ import command_settings, config_text
from bench.placement.trace import MILLI, synthetic_workload

MACHINE = record.Machine("AMD EPYC", 2, "3.11.7 (CPython)")


def entry(scheduler: str, seed: int, allocated: float, **given: Any) -> dict[str, Any]:
    run = {
        "scheduler": scheduler, "protocol": "gpushare", "nodes": 400, "kind": "fill-up", "workload": "default",
        "mode": "real", "seed": seed, "allocated": allocated, "allocated_one_gpu_at_most": allocated - 2,
        "problems": 0, "problems_first": [],
    }  # fmt: skip
    return run | given


def placement_record(entries: list[dict[str, Any]], started: str = "2026-01-01T00:00:00+00:00") -> record.Record:
    return record.Record(
        bench="bench.placement", command="python -m bench.placement", commit=None, dirty=None, started=started,
        machine=MACHINE, settings={}, results={"runs": entries}, exit_status=0,
    )  # fmt: skip


def mig_entry(scheduler: str, seed: int, memory: float, problems: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "scheduler": scheduler, "seed": seed, "workload": "default", "nodes": 588, "gpus": 4704, "memory": memory,
        "slices": memory + 2, "demand": memory - 5, "free": 100 - memory - 2, "fragmented": 100 - memory - 2,
        "cut": 1.0, "stranded": 0.0, "placed": 5550, "pods": 8192, "placements": "x", "seconds": 1.0,
        "problems": list(problems),
    }  # fmt: skip


def test_the_mig_table_is_built_from_the_mig_runs_alone_each_seed_its_newest() -> None:
    def mig_record(entries: list[dict[str, Any]], started: str) -> record.Record:
        return dataclasses.replace(placement_record([], started), results={"mig": entries})

    earlier = mig_record(
        [mig_entry("ours", 42, 80.0), mig_entry("HAMi's greedy", 42, 85.5)], "2026-01-01T00:00:00+00:00"
    )
    later = mig_record(
        [mig_entry("ours", 42, 91.5), mig_entry("ours", 43, 91.9), mig_entry("HAMi's greedy", 43, 85.4)],
        "2026-01-02T00:00:00+00:00",
    )
    runs_only = placement_record([entry("ours", 42, 96.0)])
    table = figures_placement.mig_table([later, runs_only, earlier])
    lines = table.splitlines()
    assert "588 nodes, 4,704 GPUs; seeds 42 / 43" in lines[0] and "2 run records" in lines[0], "the MIG records alone"
    assert lines[2].startswith("| | GPU memory allocated | slices in use |")
    assert lines[4].startswith("| ours, `--protocol hami` | **91.5 / 91.9** | 93.5 / 93.9 |"), "the rerun of seed 42"
    assert lines[5].startswith("| hami-scheduler v2.10.0's choice | 85.5 / 85.4 | 87.5 / 87.4 |")
    assert "clean in every one of the 4 runs" in table
    overlap = ("node-1 GPU 0: two instances overlap",)
    bad = mig_record([mig_entry("HAMi's greedy", 43, 85.0, overlap)], "2026-01-03T00:00:00+00:00")
    table = figures_placement.mig_table([later, bad, earlier])
    assert "clean in 3 of the 4 runs; not in these: hami-scheduler v2.10.0's choice seed 43: node-1 GPU 0" in table
    other = mig_record([mig_entry("ours", 42, 70.0) | {"workload": "gpushare100"}], "2026-01-04T00:00:00+00:00")
    lines = figures_placement.mig_table([later, other]).splitlines()
    assert "workload" not in lines[0], "a row per workload instead"
    assert lines[4].startswith("| ours, `--protocol hami`, `default` | **91.5 / 91.9** |")
    assert lines[5].startswith("| ours, `--protocol hami`, `gpushare100` | **70.0 (seed 42)** |")
    with pytest.raises(figures.FiguresError, match="no record of 'mig'"):
        figures_placement.mig_table([runs_only])
    assert "| ours | **96.0** |" in figures_placement.result_table([runs_only, later]), "the table ignores MIG runs"


def test_the_table_gives_each_scheduler_seed_by_seed_ours_first_and_bold() -> None:
    kept = [
        placement_record([entry("gpushare-scheduler-extender c0b6141", seed, 93.0 + seed / 100) for seed in (42, 43)]),
        placement_record([entry("ours", seed, 96.0) for seed in (42, 43)] + [entry("our fill policy", 42, 87.0)]),
    ]
    table = figures_placement.result_table(kept)
    assert "| | fill-up `default`, seeds 42 / 43 |" in table
    assert "| *gpushare's protocol, 400 of the trace's nodes* |" in table
    assert "| ours | **96.0 / 96.0** |" in table
    assert "| our fill policy | 87.0 (seed 42) |" in table  # not the column's seeds: named
    assert "| gpushare-scheduler-extender c0b6141 | 93.4 / 93.4 |" in table
    assert table.index("| ours |") < table.index("| our fill policy |") < table.index("| gpushare-scheduler")
    assert "FGD" not in table, "the paper's figure is for the whole trace"
    assert "clean in every one of the 5 runs" in table
    assert MACHINE.describe() in table


def test_the_table_has_a_section_per_protocol_and_cluster_and_says_not_run_where_no_run_is() -> None:
    over = ["node-7 GPU 0: 1200 of 1000 milli-GPU allocated"]
    hami = entry("hami-scheduler v2.10.0", 42, 88.0, protocol="hami", nodes=200, problems=2, problems_first=over)
    fast = entry("ours", 42, 11.1, mode="fast")  # the fast mode is no figure of record
    whole, churned = (
        entry("ours", 42, 96.0, nodes=1213),
        entry("ours", 42, 96.5, kind="churn", binds=14_400, seconds=1200.0, pods=16_500),
    )
    kept = [placement_record([whole, entry("ours", 42, 95.0), churned, hami, fast])]
    table = figures_placement.result_table(kept)
    lines = table.splitlines()
    assert "| | fill-up `default`, seed 42 | churn `default`, seed 42 |" in lines
    assert "| the paper's FGD (its best), in its simulator, mean of seeds 42-51 | 95.4 |  |" in lines
    assert "| the paper's Random (random placement), in its simulator, mean of seeds 42-51 | 87.5 |  |" in lines
    sections = [line for line in lines if line.startswith("| *")]
    assert sections[0].startswith("| *gpushare's protocol, the whole trace, 1,213 nodes* |")
    assert sections[1].startswith("| *gpushare's protocol, 400 of the trace's nodes* |")
    assert sections[2].startswith("| *HAMi's protocol, 200 of the trace's nodes* |")
    assert "| ours | **96.0** | not run |" in lines
    assert "| ours | **95.0** | **96.5** |" in lines
    assert "| hami-scheduler v2.10.0 | 88.0 | not run |" in lines
    assert "11.1" not in table
    assert "clean in 3 of the 4 runs" in table
    assert "hami-scheduler v2.10.0, fill-up `default` seed 42 (200 nodes, HAMi's protocol): 2 findings" in table


def test_a_seed_run_again_replaces_its_earlier_run() -> None:
    earlier = placement_record([entry("ours", 42, 90.0), entry("ours", 43, 91.0)], "2026-01-01T00:00:00+00:00")
    later = placement_record([entry("ours", 42, 96.0)], "2026-01-02T00:00:00+00:00")
    table = figures_placement.result_table([later, earlier])
    assert "| ours | **96.0 / 91.0** |" in table


def test_against_gpushare_the_pods_of_one_gpu_at_most_are_shown_too() -> None:
    kept = [placement_record([entry("ours", 42, 96.0), entry("gpushare-scheduler-extender c0b6141", 42, 93.0)])]
    table = figures_placement.result_table(kept)
    assert "GPU allocated to pods asking one GPU at most" in table
    assert "| ours | 94.0 |" in table and "| gpushare-scheduler-extender c0b6141 | 91.0 |" in table
    refusing = entry(figures_placement.REFUSING, 42, 95.0)
    table = figures_placement.result_table([placement_record([*kept[0].results["runs"], refusing])])
    assert table.index("| ours |") < table.index(f"| {figures_placement.REFUSING} |") < table.index("| gpushare")
    alone = figures_placement.result_table([placement_record([entry("ours", 42, 96.0)])])
    assert "one GPU at most" not in alone


def test_the_readmes_rows_are_the_means_over_the_seeds(tmp_path: Path) -> None:
    whole = [entry("ours", seed, value, nodes=1213) for seed, value in ((42, 96.0), (43, 95.9), (44, 95.8))]
    sample = [entry("ours", seed, 96.0) for seed in (42, 43, 44)]
    peer = [entry("gpushare-scheduler-extender c0b6141", seed, 93.5) for seed in (42, 43, 44)]
    record.write(dataclasses.replace(placement_record(whole + sample + peer), bench="bench.placement"), tmp_path)
    row = figures_placement.whole_trace_row(tmp_path)
    assert row[0].startswith("GPUs allocated, Alibaba's GPU-sharing trace (1,213 nodes)")
    assert row[1:3] == ("95.9 % (mean, 3 seeds)", "the paper's FGD, in its simulator: 95.4 %")
    row = figures_placement.sample_row(tmp_path)
    assert row[0] == "the same replay, 400 of its nodes, each scheduler built from its source"
    assert row[1:3] == ("96.0 % (mean, 3 seeds); pods of 1 GPU at most: 94.0 %", "gpushare-scheduler-extender: 93.5 %")
    assert row[-1] == figures.RECORDED
    refusing = [entry(figures_placement.REFUSING, seed, 94.0) for seed in (42, 43, 44)]
    record.write(placement_record(refusing, "2026-01-02T00:00:00+00:00"), tmp_path)
    row = figures_placement.sample_row(tmp_path)
    assert row[1] == "96.0 % (mean, 3 seeds); refusing pods of several GPUs, as shipped: 94.0 %"


def test_a_readme_row_without_its_runs_names_what_it_needs(tmp_path: Path) -> None:
    record.write(placement_record([entry("ours", 42, 96.0)]), tmp_path)
    with pytest.raises(figures.FiguresError, match="gpushare-scheduler-extender c0b6141 on 400 nodes"):
        figures_placement.sample_row(tmp_path)


def test_a_run_keeps_its_figures_and_the_gpu_allocated_to_pods_of_one_gpu_at_most() -> None:
    workload = synthetic_workload(seed=3, scale=1, ratio=1.3)
    served, _ = command_settings("serve", ["--gpushare-several-gpus=bind"])
    result = fast.replay(workload, served, config_text([]), 3)
    kept = runs.fill_up(result, 3)
    capacity = workload.gpu_capacity
    bound = [outcome.pod for outcome in result.outcomes if outcome.node]
    assert any(pod.gpus > 1 for pod in bound), "the synthetic workload binds pods of several GPUs"
    assert kept["allocated"] == round(100 * sum(pod.gpu_demand for pod in bound) / capacity, 3)
    one_at_most = sum(pod.gpu_demand for pod in bound if pod.gpus <= 1)
    assert kept["allocated_one_gpu_at_most"] == round(100 * one_at_most / capacity, 3)
    assert kept["gpus"] == capacity // MILLI and kept["pods"] == len(workload.pods) and kept["seed"] == 3
    assert kept["kind"] == "fill-up" and kept["mode"] == "fast" and kept["problems"] == 0
    assert kept["bound"] == len(bound) and kept["curve"]["130"] == kept["allocated"]
    assert record._plain(kept) == kept, "a record's entry is plain data"


def test_a_run_of_ours_with_settings_of_its_own_is_a_scheduler_of_its_own_in_the_record() -> None:
    """Ours as measured on the pages binds pods of several GPUs in gpushare's protocol (`GPUSHARE_FLAGS`); as
    shipped it refuses them: a run given that flag is its own row, not mixed with the other runs' seeds."""
    workload = synthetic_workload(seed=3, scale=1, ratio=1.3)
    served, _ = command_settings("serve", ["--gpushare-several-gpus=bind"])
    result = fast.replay(workload, served, config_text([]), 3)
    plain = cli.arguments(["--synthetic", "--mode", "fast"])
    assert cli.run_record(plain, "shipped", 3, result)["scheduler"] == "ours"
    refusing = cli.arguments(["--synthetic", "--mode", "fast", "--extender-flag=--gpushare-several-gpus=refuse"])
    kept = cli.run_record(refusing, "shipped", 3, result)
    assert kept["scheduler"] == "ours (--extender-flag=--gpushare-several-gpus=refuse)" == figures_placement.REFUSING
    assert kept["extender_flags"][-1] == "--gpushare-several-gpus=refuse" and kept["protocol"] == "gpushare"
    fill = cli.run_record(refusing, "fill", 3, result)
    assert fill["scheduler"] == "our fill policy (--extender-flag=--gpushare-several-gpus=refuse)"


def test_the_fill_up_curve_draws_every_scheduler_a_panel_per_cluster_the_same_bytes_each_time() -> None:
    curve = {"10": 10.0, "50": 49.5, "100": 90.0, "130": 93.0}
    kept = [
        placement_record(
            [
                entry("ours", 42, 96.0, curve=curve),
                entry("ours", 43, 96.0, curve=curve),
                entry("gpushare-scheduler-extender c0b6141", 42, 93.0, curve=curve),
                entry("hami-scheduler v2.10.0, client at 50/s", 42, 89.0, protocol="hami", nodes=200, curve=curve),
                entry("ours", 42, 96.0, kind="churn", curve=curve),  # not the fill-up's: not drawn
            ]
        )
    ]
    drawn = figures_placement.fill_up_plot(kept)
    assert drawn == figures_placement.fill_up_plot(kept)
    assert drawn.count("<polyline") == 4, "a line per scheduler and seed"
    for name in ("ours", "gpushare-scheduler-extender c0b6141", "hami-scheduler v2.10.0, client at 50/s"):
        assert f">{name}</text>" in drawn, name
    assert ">gpushare's protocol, 400 of the trace's nodes<" in drawn
    assert ">HAMi's protocol, 200 of the trace's nodes<" in drawn
    with pytest.raises(figures.FiguresError, match="no fill-up"):
        figures_placement.fill_up_plot([placement_record([entry("ours", 42, 96.0, kind="churn")])])


def test_the_churn_curves_draw_the_allocated_and_the_waiting_of_every_scheduler() -> None:
    samples = [{"hours": 0.5 * n, "allocated": 10.0 * n, "waiting": n, "fragmented": None} for n in range(5)]
    kept = [
        placement_record(
            [
                entry("ours", 42, 96.5, kind="churn", samples=samples),
                entry("gpushare-scheduler-extender c0b6141", 42, 15.0, kind="churn", samples=samples),
                entry("ours", 42, 96.0, curve={"130": 96.0}),  # the fill-up's: not drawn here
            ]
        )
    ]
    drawn = figures_placement.churn_plot(kept)
    assert drawn.count("<polyline") == 4, "allocated and waiting, for each scheduler"
    assert ">GPU allocated, gpushare's protocol, 400 of the trace's nodes<" in drawn
    assert ">Pods waiting, gpushare's protocol, 400 of the trace's nodes<" in drawn
    with pytest.raises(figures.FiguresError, match="no churn"):
        figures_placement.churn_plot([placement_record([entry("ours", 42, 96.0)])])


def test_the_readmes_churn_row_gives_every_peer_best_first_without_versions(tmp_path: Path) -> None:
    kept = [entry("ours", seed, value, kind="churn") for seed, value in ((42, 96.6), (43, 96.6), (44, 96.3))] + [
        entry("gpushare-scheduler-extender c0b6141", 42, 15.4, kind="churn"),
        entry("hami-scheduler v2.10.0, client at 50/s", 42, 40.0, kind="churn", protocol="hami"),
    ]
    record.write(placement_record(kept), tmp_path)
    row = figures_placement.churn_row(tmp_path)
    assert row[1] == "96.5 % (mean, 3 seeds)"
    assert row[2] == (
        "hami-scheduler, client at 50/s, HAMi: 40.0 % (seed 42); gpushare-scheduler-extender: 15.4 % (seed 42)"
    ), "a peer run on fewer seeds than ours says which"
    assert len(row[2]) <= 120
    record.write(placement_record([entry("ours", 42, 96.3, kind="churn", protocol="hami")]), tmp_path)
    row = figures_placement.churn_row(tmp_path)
    assert row[1] == "96.5 % (mean, 3 seeds); in HAMi's protocol: 96.3 % (seed 42)", "ours beside hami-scheduler too"
    over = {"problems": 3, "problems_first": ["openb-node-1042: cpu 110260m requested of 96000m"]}
    later = placement_record(
        [entry("ours", 42, 96.4, kind="churn", protocol="hami", **over)], "2026-01-02T00:00:00+00:00"
    )
    record.write(later, tmp_path)
    assert figures_placement.churn_row(tmp_path)[1] == "96.5 % (mean, 3 seeds)", "not a run whose end check failed"


def test_the_pace_under_the_table_is_each_schedulers_range_over_its_runs_by_protocol() -> None:
    """The fill-up's pods decided a second; under churn the binds a second against the pods offered; ours named
    by protocol once it ran in both; a run that kept no pace (NaN) left out."""
    churned = {"kind": "churn", "binds": 2400, "seconds": 1200.0, "pods": 16_800}
    kept = [
        placement_record(
            [
                entry("ours", 42, 96.0, pods_per_second=26.0),
                entry("ours", 43, 96.0, pods_per_second=32.2),
                entry("ours", 42, 96.0, protocol="hami", nodes=200, pods_per_second=9.3),
                entry("our fill policy", 42, 87.0, pods_per_second=float("nan")),
                entry("gpushare-scheduler-extender c0b6141", 42, 14.9, **churned),
                entry("gpushare-scheduler-extender c0b6141", 43, 15.0, **churned | {"binds": 2520}),
            ]
        )
    ]
    table = figures_placement.result_table(kept)
    assert (
        "Pods a second over each run: in the fill-up, decided: ours in gpushare's protocol 26.0 to 32.2, ours in "
        "HAMi's protocol 9.3; under churn, bound, of 14.0 offered: gpushare-scheduler-extender c0b6141 2.0 to 2.1."
    ) in table
