"""Every figure the README and the benchmark pages publish comes from a run record (bench/record.py), or is on the
list of figures awaiting a rerun below, and the defaults those pages quote are the code's.

The list is the debt made visible: a table or a plot whose run left no record (its raw output was not kept) stays
on its page, marked `<!-- awaiting a rerun -->` there and named here, until a run with `--record bench/records`
replaces it with a table generated from records (`<!-- table: bench/records/<bench> -->`), and its entry goes.
An entry whose figure is gone fails too, so the list never claims more debt than there is.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import figures, figures_common, record, record_import
from devtools import docs_hooks
from extender import settings

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "benchmarks"
README = ROOT / "README.md"

AWAITING_RERUN: dict[tuple[str, str], str] = {}
"""Tables and plots of docs/benchmarks/ whose runs left no record, by (page, the section they are in)."""

AWAITING_README: set[str] = set()
"""The README's figures rows whose runs left no record, by their first cell."""

RECORDING_BENCHES = (
    "bench/bench.py",
    "bench/cache_build.py",
    "bench/transport.py",
    "bench/scale.py",
    "bench/e2e.py",
    "bench/node_burst.py",
    "bench/placement/__main__.py",
    "loadtest/run.py",
)
"""Every bench behind a published figure."""


# ---- the pages' figures ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Published:
    page: str
    section: str
    kind: str  # "table" or "plot"
    marked: bool
    """The line above is `<!-- awaiting a rerun -->`."""


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


def is_separator(line: str) -> bool:
    return bool(re.fullmatch(r"\|[-:| ]+\|", line.strip()))


def has_figures(rows: list[str]) -> bool:
    """A table with a number outside code spans in its body (a table of flags is not figures)."""
    return any(re.search(r"\d", re.sub(r"`[^`]*`", "", row)) for row in rows)


def published(page: Path) -> list[Published]:
    """The tables of figures and the plots a page's source holds (a generated table is a marker, not a table)."""
    lines = page.read_text().splitlines()
    found, section = [], ""
    for number, line in enumerate(lines):
        above = lines[number - 1] if number else ""
        marked = above.strip() == figures.AWAITING_MARKER
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("|") and number + 1 < len(lines) and is_separator(lines[number + 1]):
            if not above.startswith("|"):
                body = []
                for row in lines[number + 2 :]:
                    if not row.startswith("|"):
                        break
                    body.append(row)
                if has_figures(body):
                    found.append(Published(page.name, section, "table", marked))
        elif (image := IMAGE.match(line)) and image[1] not in figures.PLOTS:  # one drawn from records: below
            found.append(Published(page.name, section, "plot", marked))
    return found


def every_published() -> list[Published]:
    return [item for page in sorted(BENCHMARKS.glob("*.md")) for item in published(page)]


def test_every_table_and_plot_of_the_benchmark_pages_is_generated_from_records_or_awaits_a_rerun() -> None:
    unlisted = [item for item in every_published() if (item.page, item.section) not in AWAITING_RERUN]
    assert not unlisted, f"a published figure with no record (generate it from bench/records, or list it): {unlisted}"


def test_a_figure_awaiting_a_rerun_is_marked_on_its_page() -> None:
    unmarked = [item for item in every_published() if not item.marked]
    assert not unmarked, f"mark these `{figures.AWAITING_MARKER}` on the line above: {unmarked}"


def test_the_list_of_figures_awaiting_a_rerun_names_only_figures_still_published() -> None:
    present = {(item.page, item.section) for item in every_published()}
    assert not set(AWAITING_RERUN) - present, "figures gone from their pages: take them off AWAITING_RERUN"


def test_the_generated_tables_name_benches_with_records() -> None:
    markers = [m for page in BENCHMARKS.glob("*.md") for m in figures.TABLE_MARKER.finditer(page.read_text())]
    assert markers, "no benchmark table is generated from records"
    for marker in markers:
        assert figures.table_key(marker) in figures.TABLES and record.load(marker["folder"]), marker[0]


def test_the_plots_drawn_from_records_are_what_the_records_draw_and_are_shown() -> None:
    assert not figures.stale_plots(), "run python -m devtools.docs_hooks to draw them from the records"
    shown = {
        image for page in BENCHMARKS.glob("*.md") for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
    }
    assert set(figures.PLOTS) <= shown, "a plot drawn from records that no page shows"


# ---- the README's figures -------------------------------------------------------------------------------------


def readme_rows() -> list[list[str]]:
    table = figures.readme_table(README.read_text())
    assert is_separator(table[1])
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table[2:]]


def test_the_readmes_figures_are_at_most_six_rows_of_cells_under_120_characters() -> None:
    rows = readme_rows()
    assert 1 <= len(rows) <= 6
    long = [cell for row in rows for cell in row if len(cell) > 120]
    assert not long, f"cells over 120 characters: {long}"


def test_each_readme_figure_comes_from_records_and_equals_them_or_awaits_a_rerun() -> None:
    built = {cells[0]: cells for _, build in figures.README_ROWS if (cells := build())}
    for row in readme_rows():
        source = row[-1]
        if source == figures.RECORDED:
            assert tuple(row) == built[row[0]], "run python -m devtools.docs_hooks to write it from the records"
        else:
            assert source == "awaiting a rerun" and row[0] in AWAITING_README, row
    assert {row[0] for row in readme_rows()} >= AWAITING_README, "rows gone from the README: take them off the list"
    assert not figures.stale_readme_rows(README.read_text())


def test_the_readme_names_one_machine_the_one_its_records_ran_on() -> None:
    section = README.read_text().split(figures.FIGURES_HEADING, 1)[1].split("\n## ", 1)[0]
    described = re.findall(r"(\d+)-core ([A-Z][\w ]+?) VM \(Python ([\d.]+)\)", section)
    assert len(described) == 1, "name one machine above the figures"
    cores, cpu, python = described[0]
    for folder, _ in figures.README_ROWS:
        machine = figures.one_machine(record.load(folder))
        assert (int(cores), cpu, python) == (machine.cores, machine.cpu, machine.python.split()[0])


# ---- the benches write records ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", RECORDING_BENCHES)
def test_every_bench_behind_a_figure_takes_record_and_runs_through_the_recorder(path: str) -> None:
    source = (ROOT / path).read_text()
    assert "recording.add_option(parser)" in source and "recording.settings(" in source
    assert re.search(r'sys\.exit\(recording\.run\(main, "[\w.]+"\)\)', source)


def fake_bench(argv: list[str]) -> int:
    record.settings({"nodes": 3, "record": "left out"}, seed=7)
    record.result("figures", [{"pods": 2}])
    print("the report")
    return 3


def test_a_bench_run_with_record_writes_its_command_settings_results_and_report(tmp_path: Path) -> None:
    status = record.run(fake_bench, "bench.fake", ["--nodes", "3", "--record", str(tmp_path)])
    (path,) = (tmp_path / "fake").glob("*.json")
    kept = record.Record.from_json(path.read_bytes())
    assert status == 3 and kept.exit_status == 3
    assert kept.command == f"python -m bench.fake --nodes 3 --record {tmp_path}"
    assert kept.settings == {"nodes": 3, "seed": 7}
    assert kept.results == {"figures": [{"pods": 2}]}
    assert kept.report == "the report\n"
    assert kept.machine == record.this_machine() and kept.commit == record.this_commit()[0]
    assert set(kept.load) == {"start", "end"} and all(len(kept.load[when]) == 3 for when in kept.load)


def test_a_bench_run_without_record_writes_nothing_and_hands_over_nothing(tmp_path: Path) -> None:
    assert record.run(fake_bench, "bench.fake", ["--nodes", "3"]) == 3
    assert not list(tmp_path.iterdir())
    assert type(sys.stdout).__name__ != "_Tee"


def test_a_run_that_exits_is_recorded_with_its_status(tmp_path: Path) -> None:
    def failing(argv: list[str]) -> int:
        raise SystemExit(2)

    with pytest.raises(SystemExit):
        record.run(failing, "bench.fake", ["--record", str(tmp_path)])
    (path,) = (tmp_path / "fake").glob("*.json")
    assert record.Record.from_json(path.read_bytes()).exit_status == 2


def test_a_run_stopped_by_a_signal_is_recorded_with_what_it_finished(tmp_path: Path) -> None:
    """A bench started in the background ignores SIGINT (a non-interactive shell's `&`): `kill` (SIGTERM) or
    SIGINT still end it as an exit, and its record keeps the results it gave before."""
    script = (
        "import signal, sys, time\n"
        "from bench import record\n"
        "def main(argv):\n"
        "    record.result('runs', [{'seed': 42}])\n"
        "    print('started', flush=True)\n"
        "    time.sleep(60)\n"
        "    return 0\n"
        "sys.exit(record.run(main, 'bench.fake'))\n"
    )
    for number in (signal.SIGTERM, signal.SIGINT):
        folder = tmp_path / number.name
        process = subprocess.Popen(
            [sys.executable, "-c", script, "--record", str(folder)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `&` in a script leaves it
        )
        assert process.stdout is not None and process.stdout.readline() == b"started\n"
        process.send_signal(number)
        assert process.wait(timeout=30) == 128 + number
        (path,) = (folder / "fake").glob("*.json")
        kept = record.Record.from_json(path.read_bytes())
        assert kept.exit_status == 128 + number and kept.results["runs"] == [{"seed": 42}]


def test_two_records_of_one_second_do_not_overwrite_each_other(tmp_path: Path) -> None:
    kept = make_record([run_of("ours", "hami", 20.0)])
    paths = {record.write(kept, tmp_path), record.write(kept, tmp_path)}
    assert len(paths) == 2


def test_a_record_of_another_format_is_refused() -> None:
    with pytest.raises(record.RecordError, match="format"):
        record.Record.from_json(b'{"format": 99}')


# ---- tables from records ----------------------------------------------------------------------------------------

MACHINE = record.Machine("AMD EPYC", 2, "3.11.7 (CPython)")


def run_of(scheduler: str, protocol: str, running: float, problems: int = 0, failed: int = 0) -> dict[str, object]:
    return {
        "scheduler": scheduler, "protocol": protocol, "run": 1, "pods": 64, "create_seconds": 1.0,
        "all_bound": running - 1, "all_running": running, "p50": running / 2, "p90": running * 0.9,
        "failed_scheduling": failed, "load": 1.0, "problems": [f"pod {n}" for n in range(problems)], "to_running": None,
    }  # fmt: skip


def make_record(runs: list[dict[str, object]], machine: record.Machine = MACHINE) -> record.Record:
    return record.Record(
        bench="bench.node_burst", command="python -m bench.node_burst", commit=None, dirty=None,
        started="2026-01-01T00:00:00+00:00", machine=machine, settings={}, results={"runs": runs}, exit_status=0,
    )  # fmt: skip


def test_the_burst_table_gives_the_median_its_range_and_the_median_runs_pod_times() -> None:
    # ours: 20, 30, 25 s: median 25 (20 - 30), the median run's p50 / p90 12.5 / 22.5; the peer failed 2 of 2 runs
    kept = [
        make_record([run_of("ours", "hami", 20.0, failed=300), run_of("ours", "hami", 30.0, failed=320)]),
        make_record([run_of("ours", "hami", 25.0, failed=310)]),
        make_record([run_of("hami-scheduler", "hami", 600.0, 4), run_of("hami-scheduler", "hami", 590.0, 3)]),
    ]
    table = figures.node_burst_table(kept)
    assert "| ours | HAMi | 25.0 (20.0 - 30.0) | 12.5 / 22.5 | 300 - 320 | passed |" in table
    assert (
        "| hami-scheduler | HAMi | 595.0 (590.0 - 600.0) | 295.0 / 531.0 | 0 | failed in 2 of 2 runs (4, 3 pods) |"
        in table
    )
    assert table.index("| ours |") < table.index("| hami-scheduler |")
    assert MACHINE.describe() in table


def test_records_from_two_machines_make_no_table() -> None:
    other = record.Machine("Intel Xeon", 2, "3.11.7 (CPython)")
    kept = [make_record([run_of("ours", "hami", 20.0)]), make_record([run_of("ours", "hami", 21.0)], other)]
    with pytest.raises(figures.FiguresError, match="one machine per table"):
        figures.node_burst_table(kept)


def test_a_table_marker_with_no_records_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "node_burst").mkdir()
    with pytest.raises(figures.FiguresError, match="no record"):
        figures.fill_tables("<!-- table: bench/records/node_burst -->\n", tmp_path)
    with pytest.raises(figures.FiguresError, match="no table is built"):
        figures.fill_tables("<!-- table: bench/records/unknown -->\n", tmp_path)
    with pytest.raises(figures.FiguresError, match="no table is built from bench/records/node_burst as 'node_burst x'"):
        figures.fill_tables("<!-- table: bench/records/node_burst x -->\n", tmp_path)


def test_the_readmes_burst_row_needs_both_schedulers_records(tmp_path: Path) -> None:
    record.write(make_record([run_of("ours", "hami", 20.0)]), tmp_path)
    with pytest.raises(figures.FiguresError, match="hami-scheduler"):
        figures.burst_row(tmp_path)


def test_the_awaiting_marker_becomes_a_note_readers_see() -> None:
    assert figures.AWAITING_NOTE in figures.fill_tables(f"{figures.AWAITING_MARKER}\n| a |\n|---|\n| 1 |\n")


def bench_record(bench: str, settings: dict[str, object], results: dict[str, object]) -> record.Record:
    return record.Record(
        bench=bench, command=f"python -m {bench}", commit=None, dirty=None, started="2026-01-01T00:00:00+00:00",
        machine=MACHINE, settings=settings, results=results, exit_status=0,
    )  # fmt: skip


def verb_row(p50_ms: float, per_core: float) -> dict[str, object]:
    return {
        "verb": "filter", "names": 1000, "p50_ms": p50_ms, "p99_ms": 2 * p50_ms, "max_ms": 5.0, "samples": 3000,
        "achieved": per_core, "per_core": per_core, "sequential_cpu_us": 500.0, "server_busy": 0.99,
        "client_cpu_us": 50.0, "notes": [],
    }  # fmt: skip


def test_the_verbs_table_gives_each_figure_the_median_over_the_runs() -> None:
    # p50 1.0, 2.0 and 4.0 ms: 2.000; per core 900, 1,000 and 3,000: 1,000
    kept = [
        bench_record("bench.bench", {"clients": 3}, {"rows": [verb_row(p50, core)]})
        for p50, core in ((1.0, 900.0), (4.0, 3000.0), (2.0, 1000.0))
    ]
    table = figures.verbs_table(kept)
    assert "| filter | 1,000 | 2.000 | 4.000 | 5.0 | 1,000 | 1,000 | 500 | 99% | 50 |" in table
    assert "req/s achieved (3 conns)" in table and "the median of 3 runs" in table


def scenario(label: str, filter_ms: list[float], rss: float) -> dict[str, object]:
    seconds = [value / 1000 for value in filter_ms]
    return {
        "label": label, "placed": len(seconds), "refused": 0, "filter": seconds, "bind": seconds, "ping": seconds,
        "lag_max": 0.018, "cpu_per_pod_ms": 6.1, "rss_mib": rss,
    }  # fmt: skip


def test_the_scale_table_gives_each_scenarios_percentiles_from_its_samples() -> None:
    # 100 filters of 1 to 100 ms: p50 50, p99 99, max 100 (nearest rank)
    samples = [float(ms) for ms in range(100, 0, -1)]
    settings = {"nodes": 5000, "churn": 20.0, "pods": 100}
    kept = [bench_record("bench.scale", settings, {"scenarios": [scenario("three shapes", samples, 249.0)]})]
    table = figures.scale_table(kept)
    row = "| three shapes | 100 | 0 | 50.0 / 99.0 / 100.0 | 50.0 / 99.0 / 100.0 | 99.0 / 100.0 | 18.0 | 6.1 | 249 |"
    assert row in table
    assert "5,000 nodes, 20 running pods replaced a second" in table


def cache_of(first_list: float, cache_mb: float, events: list[float]) -> dict[str, object]:
    scrape = {"seconds": 0.146, "longest_hold": 0.0068, "bytes": 12 * 2**20}
    return {
        "nodes": 5000, "gpus": 40000, "pods": 100000, "holding_gpu_memory": 80000, "wire_bytes": 315 * 2**20,
        "first_list_seconds": first_list, "rss_before_mb": 40.0, "rss_after_mb": 40 + cache_mb, "cache_mb": cache_mb,
        "peak_mb": 160.0, "event_apply_seconds": events, "event_decode_apply_seconds": events,
        "scrapes": {"auto": {**scrape, "bytes": 2**20}, "gpu": scrape, "node": {**scrape, "bytes": 2**20}},
    }  # fmt: skip


def test_the_cache_table_gives_each_figure_its_range_over_the_runs_beside_its_target() -> None:
    # first lists of 4.6 and 7.6 s; events of 100 µs in one run, 50 to 150 µs (mean 100, p99 150) in the other
    kept = [
        bench_record("bench.cache_build", {}, {"cache": cache_of(4.6, 97.0, [0.0001] * 4)}),
        bench_record("bench.cache_build", {}, {"cache": cache_of(7.6, 98.0, [0.00005, 0.0001, 0.0001, 0.00015])}),
    ]
    table = figures.cache_table(kept)
    assert "| first list of nodes and pods into the cache (315 MB of JSON) | 4.6 - 7.6 s | < 15 s |" in table
    assert "| 97 - 98 MB (137 - 138 MB in all; peak while listing 160 MB) | < 500 MB |" in table
    assert "| mean 100 µs, p99 100 - 150 µs | well under 1 ms |" in table
    rows = [line for line in table.splitlines() if "`/metrics` scrape" in line]
    assert ["gpu`" in rows[0], "node`" in rows[1], "auto`: per node at this size" in rows[2]] == [True] * 3


def test_the_readmes_scale_row_gives_the_three_shapes_filter_and_memory_median_over_the_runs(tmp_path: Path) -> None:
    # filters of 1 to 100 ms in one run, 2 to 200 in another, 3 to 300 in a third: p50 100 (the median of 50, 100
    # and 150), p99 198; RSS 249, 254 and 260 MiB: 254
    for scale, rss in ((1, 249.0), (2, 254.0), (3, 260.0)):
        samples = [float(ms * scale) for ms in range(1, 101)]
        results = {"scenarios": [scenario("three shapes", samples, rss)], "running_pods": 149_852}
        record.write(bench_record("bench.scale", {"nodes": 5000, "churn": 20.0}, results), tmp_path, str(scale))
    assert figures.scale_row(tmp_path)[:2] == (
        "5,000 nodes, about 150,000 pods, 20 replaced a second: filter p50 / p99",
        "100.0 / 198.0 ms (median, 3 runs), 254 MiB resident",
    )


def loadtest_run(flags: list[str], conflicts: int, cpu_seconds: float) -> dict[str, object]:
    verb = {"requests": 4500, "p50": 2.16, "p99": 5.68, "max": 52.0}
    return {
        "plan": {"nodes": 1000, "rate": 300.0, "duration": 30, "server_flags": flags, "names": "adaptive"},
        "locust": {"names_per_filter": 420, "verbs": {"filter": verb, "bind": verb},
                   "outcomes": {"attempts": 9000, "placed": 4500, "bind_conflicts": conflicts}},
        "seconds": 30.0, "errors": 0, "attempts_per_second": 300.0, "server_cpu_seconds": cpu_seconds,
        "server_p99_ms": {"filter": 5.0, "bind": 25.0, "prioritize": 0.0},
        "checks": [{"name": "no GPU over capacity", "ok": True, "detail": ""}], "passed": True,
    }  # fmt: skip


def test_the_loadtest_table_gives_each_run_its_pace_latencies_conflicts_and_server_cpu() -> None:
    # server CPU 9 s for 4,500 pods placed: 2,000 µs a pod, of 9,000 requests (2 a pod); 30 % of a core over 30 s
    kept = [
        bench_record("loadtest.run", {}, {"run": loadtest_run(["--placement=fill"], 3, 9.0)}),
        bench_record("loadtest.run", {}, {"run": loadtest_run([], 0, 9.0)}),
    ]
    rows = [line for line in figures.loadtest_table(kept).splitlines() if line.startswith("| as shipped")]
    assert rows == [
        "| as shipped | 1,000 | 420 | 300 of 300 | 2.16 / 5.68 | 2.16 / 5.68 | 5 / 25 | 52 | 0 of 9,000 "
        "| 2,000 (2.0 requests) | 30% | passed |"
    ]
    assert "| `--placement=fill` | 1,000 |" in figures.loadtest_table(kept)


def test_the_readmes_loadtest_row_takes_the_runs_as_shipped_and_leaves_other_policies_out(tmp_path: Path) -> None:
    for label, flags, conflicts in (("shipped", [], 0), ("fill", ["--placement=fill"], 3)):
        record.write(bench_record("loadtest.run", {}, {"run": loadtest_run(flags, conflicts, 9.0)}), tmp_path, label)
    assert figures.loadtest_row(tmp_path)[:2] == (
        "the extender alone, 1,000 nodes, 300 pods/s, every pod bound: filter p99",
        "5.68 ms, no bind conflict",
    )


def e2e_result(wiring: str, pods_per_second: float, scheduler_cpu: float) -> dict[str, object]:
    return {
        "wiring": wiring, "pace": {"pods_per_second": pods_per_second}, "check": {"problems": []},
        "cpu_ms_per_pod": {"etcd": 1.0, "kube-apiserver": 2.0, "kube-scheduler": scheduler_cpu, "extender": 4.0},
    }  # fmt: skip


def test_the_e2e_table_gives_each_rounds_pace_beside_alone_in_the_same_round_and_the_median_cpu() -> None:
    # round 1: alone 140, full 70 (0.50); round 2 (the first of the next record at 1,000 nodes, a record at 5,000
    # between them): alone 120, full 90 (0.75)
    settings = {"nodes": 1000, "pods": 3000, "wiring": ["full"], "runs": 1}
    kept = [
        bench_record("bench.e2e", settings, {"runs": [
            {"round": 1, "result": e2e_result("alone", 140.0, 3.0)},
            {"round": 1, "result": e2e_result("full", 70.0, 2.0)}], "failures": []}),
        bench_record("bench.e2e", {**settings, "nodes": 5000}, {"runs": [
            {"round": 1, "result": e2e_result("alone", 100.0, 9.0)}], "failures": []}),
        bench_record("bench.e2e", settings, {"runs": [
            {"round": 1, "result": e2e_result("alone", 120.0, 5.0)},
            {"round": 1, "result": e2e_result("full", 90.0, 4.0)}], "failures": []}),
    ]  # fmt: skip
    table = figures.e2e_table(kept)
    assert "| 1,000 | 3,000 | 1 | 140 | 70 | 0.50 |" in table and "| 1,000 | 3,000 | 2 | 120 | 90 | 0.75 |" in table
    assert "| 5,000 | 3,000 | 1 | 100 | - | - |" in table
    # kube-scheduler's CPU: alone median of 3 and 5 = 4.0; the extender's column is empty for alone
    assert "| 1,000 | alone | 1.0 | 2.0 | 4.0 | - | 7.0 |" in table
    assert "| 1,000 | full | 1.0 | 2.0 | 3.0 | 4.0 | 10.0 |" in table
    assert "passed in every run" in table


def test_the_e2e_table_names_the_runs_that_did_not_finish_and_gives_them_no_figure() -> None:
    settings = {"nodes": 5000, "pods": 3000, "wiring": ["full"], "runs": 2}
    failures = ["round 2, full: full run in /tmp/x/2-full: extender bench /readyz did not answer 200 within 180 s"]
    kept = [
        bench_record("bench.e2e", settings, {"runs": [
            {"round": 1, "result": e2e_result("alone", 140.0, 3.0)},
            {"round": 1, "result": e2e_result("full", 70.0, 2.0)},
            {"round": 2, "result": e2e_result("alone", 120.0, 5.0)}], "failures": failures}),
    ]  # fmt: skip
    table = figures.e2e_table(kept)
    assert "| 5,000 | 3,000 | 2 | 120 | - | - |" in table
    assert "Runs that did not finish, so have no figure (the record says why): full in round 2 at 5,000" in table
    assert "/tmp/" not in table


def test_the_site_index_shows_the_readmes_figures_with_links_into_the_site() -> None:
    table = figures.readme_table_for_site(README.read_text())
    assert "](docs/" not in table and "](benchmarks/" in table


# ---- the importer -----------------------------------------------------------------------------------------------

RAW = """\
| scheduler | protocol | run | pods | kubectl create, s | all bound, s | all Running, s | pod to Running p50, s | p90, s | FailedScheduling | load | check |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
| hami-scheduler | hami | 1 | 64 | 1.14 | 659.99 | 661.38 | 181.70 | 618.15 | 383 | 1.7 | FAILED (2 problems) |

| scheduler | protocol | runs | all Running, s: median (range) | pod to Running p50, s | p90, s |
|---|---|---:|---:|---:|---:|
| hami-scheduler | hami | 1 | 661.38 (661.38 - 661.38) | 181.70 | 618.15 |

FAILED:
- hami-scheduler, run 1: burst-003: hami.io/bind-phase allocating
- hami-scheduler, run 1: burst-050: hami.io/bind-phase allocating
"""  # noqa: E501 (bench.node_burst's own lines, as it printed them)


def test_the_importer_reads_each_runs_line_and_its_problems_and_not_the_summary() -> None:
    (run,) = record_import.node_burst_runs(RAW)
    assert (run["scheduler"], run["protocol"], run["run"], run["pods"]) == ("hami-scheduler", "hami", 1, 64)
    assert (run["all_bound"], run["all_running"], run["p50"], run["p90"]) == (659.99, 661.38, 181.70, 618.15)
    assert (run["failed_scheduling"], run["load"], run["to_running"]) == (383, 1.7, None)
    assert run["problems"] == ["burst-003: hami.io/bind-phase allocating", "burst-050: hami.io/bind-phase allocating"]


def test_the_importer_refuses_an_output_without_a_table_of_runs() -> None:
    with pytest.raises(record_import.NotItsOutput):
        record_import.node_burst_runs("machine: AMD EPYC\n")


def test_the_records_say_where_they_came_from() -> None:
    """Each record is either written by its bench at a commit, or imported from a run's output, saying so."""
    kept = record.load("node_burst")
    assert kept
    for item in kept:
        imported = bool(item.source and "imported by bench/record_import.py" in item.source)
        assert imported or (item.source is None and re.fullmatch(r"[0-9a-f]{40}", item.commit or "")), item.command


# ---- defaults the pages quote -----------------------------------------------------------------------------------

PAST = re.compile(r"\b(then|before|was|were|until|used to)\b")
FLAG_VALUE = re.compile(r"`(--[a-z][a-z0-9-]*)[ =]([^`\s]+)`")
NEAR = 80
MAKE_DEFAULT = re.compile(r"`([A-Z][A-Z0-9_]*) \?= ([^`]*)`")


def sentences(text: str) -> list[str]:
    """The prose's sentences, each on one line: code blocks and tables left out."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("|"))
    paragraphs = [" ".join(paragraph.split()) for paragraph in re.split(r"\n\s*\n", prose)]
    return [sentence for paragraph in paragraphs for sentence in re.split(r"(?<=[a-z)`])\.\s+", paragraph)]


def quoted_defaults(pages: list[Path] | None = None) -> list[tuple[str, str, str]]:
    """(page, flag, value) for each `--flag value` within `NEAR` characters of words saying it is the default or
    as shipped, in a sentence that does not speak of the past (the words outside code spans: `default-scheduler` is
    a name)."""
    pages = pages or [README, *sorted(BENCHMARKS.glob("*.md")), ROOT / "docs" / "index.md"]
    found = []
    for page in pages:
        for sentence in sentences(page.read_text()):
            words = re.sub(r"`[^`]*`", lambda span: "x" * len(span[0]), sentence)
            if PAST.search(words):
                continue
            said = [match.start() for match in re.finditer(r"default|shipped|as it ships", words)]
            for quoted in FLAG_VALUE.finditer(sentence):
                if any(abs(where - quoted.start()) <= NEAR for where in said):
                    found.append((page.name, quoted[1], quoted[2]))
    return found


def test_the_defaults_the_pages_quote_are_the_settings_defaults() -> None:
    by_flag = {settings.flag(field): field for field in settings.fields()}
    quoted = [(page, flag, value) for page, flag, value in quoted_defaults() if flag in by_flag]
    assert quoted, "no default quoted: the check would hold nothing"
    wrong = [
        (page, flag, value, docs_hooks.default_text(by_flag[flag]))
        for page, flag, value in quoted
        if f"`{value}`" != docs_hooks.default_text(by_flag[flag])
    ]
    assert not wrong, f"defaults quoted that are not the code's (page, flag, quoted, code): {wrong}"


def test_a_default_is_found_beside_its_words_and_not_in_the_past_or_far_away(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "The default policy (`--placement fill`) places.\n\n"
        "Then `--nodes-to-score 100` was the default.\n\n"
        "A scheduler (`--protocol hami`) " + "and so on " * 10 + "with HAMi's default split.\n"
    )
    assert quoted_defaults([page]) == [("page.md", "--placement", "fill")]


def test_the_make_defaults_the_pages_quote_are_the_makefiles() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pages = [README, *sorted(BENCHMARKS.glob("*.md"))]
    quoted = [found for page in pages for found in MAKE_DEFAULT.findall(page.read_text())]
    wrong = [f"{name} ?= {value}" for name, value in quoted if f"\n{name} ?= {value}\n" not in makefile]
    assert not wrong, f"make defaults quoted that the Makefile does not set: {wrong}"


def test_a_table_says_how_busy_the_machine_was_where_the_records_kept_it() -> None:
    old = make_record([])
    assert figures_common.load_said([old]) == "", "records from before the load was kept say nothing of it"
    busy = dataclasses.replace(old, load={"start": [0.42, 1.0, 1.0], "end": [6.66, 3.0, 2.0]})
    assert (
        figures_common.load_said([old, busy])
        == "; the machine's load average (1 minute) 0.4 to 6.7 at the runs' starts and ends"
    )
    assert figures_common.runs_said([busy]).endswith("0.4 to 6.7 at the runs' starts and ends")


def test_the_transport_table_gives_each_servers_median_over_every_round() -> None:
    servers = [
        {"label": "ours", "rates": [100.0, 300.0, 200.0], "cpu_us": [10.0, 30.0, 20.0]},
        {"label": "uvicorn", "rates": [50.0, 70.0, 60.0], "cpu_us": [40.0, 20.0, 30.0]},
    ]
    settings = {"names": 1000, "connections": 8, "clients": 2, "seconds": 4.0}
    kept = dataclasses.replace(
        make_record([]), bench="bench.transport", settings=settings, results={"servers": servers}
    )
    table = figures.transport_table([kept])
    assert "each figure the median of 3 runs of 4 s" in table
    assert "| ours | 200 | 20.0 |" in table and "| uvicorn | 60 | 30.0 |" in table


def test_a_seed_of_the_gang_replay_run_again_replaces_its_earlier_run() -> None:
    def job_record(started: str, allocated: float, seeds: tuple[int, ...]) -> record.Record:
        runs = [
            {"mode": "churn", "protocol": "gpushare", "scheduler": "ours, jobs declared", "seed": seed,
             "allocated": allocated}
            for seed in seeds
        ]  # fmt: skip
        return dataclasses.replace(bench_record("bench.placement.jobs", {}, {"runs": runs}), started=started)

    later = job_record("2026-01-02T00:00:00+00:00", 2.0, (42,))
    earlier = job_record("2026-01-01T00:00:00+00:00", 1.0, (42, 43))
    rows = figures.job_rows([later, earlier], "churn")
    runs = rows["gpushare", "ours, jobs declared"]
    assert [(run["seed"], run["allocated"]) for run in runs] == [(42, 2.0), (43, 1.0)]
    assert figures.job_rows([later, earlier], "fill-up") == {}
