"""The figures the docs publish, built from the run records (bench/record.py), so a table says what its runs
measured and nothing else: the docs site's hook (devtools/docs_hooks.py) calls it for every page, and
tests/test_records.py holds the pages and the README to it.

- In a page, the line `<!-- table: bench/records/<bench> -->` becomes that bench's table (`TABLES`), built from
  every record in the folder (`<!-- table: bench/records/<bench> <name> -->`: another table of the same bench),
  with the one machine they ran on (records from two machines make no table: one machine per table).
- A table whose figures predate the records is marked `<!-- awaiting a rerun -->` on the line above it, which the
  site shows as a note, and is named in tests/test_records.py's list of figures awaiting a rerun: the debt stays
  visible until a run records it.
- The README's figures rows that come from records (`README_ROWS`) are rewritten by `python -m
  devtools.docs_hooks` and checked at each build; docs/index.md shows the README's table.

Never imported by the service; it only reads records, never writes them.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import bench, cache_build, figures_placement, record
from bench.figures_common import (
    RECORDED,
    FiguresError,
    joined,
    one_machine,
    records_folder,
    runs_said,
)
from devtools.harness import percentile

TABLE_MARKER = re.compile(r"^<!-- table: bench/records/(?P<folder>\w+)(?P<name> \w+)? -->$", re.MULTILINE)
AWAITING_MARKER = "<!-- awaiting a rerun -->"
AWAITING_NOTE = "*These figures predate the benches' run records; they stay until a rerun records them.*"
INDEX_MARKER = "<!-- the README's figures -->"
FIGURES_HEADING = "## Figures"


# ---- node burst ---------------------------------------------------------------------------------------------

SCHEDULER_ORDER = ("ours",)
"""Ours first, then the peers by name."""


def node_burst_groups(records: Sequence[record.Record]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every run of every record, by (scheduler, protocol): ours first, gpushare's protocol before HAMi's."""
    runs = [run for kept in records for run in kept.results["runs"]]
    keys = sorted(
        {(run["scheduler"], run["protocol"]) for run in runs},
        key=lambda key: (key[0] not in SCHEDULER_ORDER, key[0], key[1]),
    )
    return {key: [run for run in runs if (run["scheduler"], run["protocol"]) == key] for key in keys}


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run whose all-Running time is the median (the lower of the two middle ones for an even count)."""
    middle = statistics.median_low(run["all_running"] for run in runs)
    return next(run for run in runs if run["all_running"] == middle)


def check_cell(runs: Sequence[dict[str, Any]]) -> str:
    failed = [len(run["problems"]) for run in runs if run["problems"]]
    if not failed:
        return "passed"
    return f"failed in {len(failed)} of {len(runs)} runs ({', '.join(map(str, failed))} pods)"


def spread(values: Sequence[float], digits: int = 1) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if low == high else f"{low:.{digits}f} - {high:.{digits}f}"


def node_burst_table(records: Sequence[record.Record]) -> str:
    machine = one_machine(records)
    groups = node_burst_groups(records)
    pods = {run["pods"] for runs in groups.values() for run in runs}
    counts = sorted({len(runs) for runs in groups.values()})
    lines = [
        f"**Results** ({machine.describe()}; {' or '.join(map(str, counts))} runs each, "
        f"{len(records)} run records in `{records_folder(records)}`):",
        "",
        f"| scheduler | protocol | all {'/'.join(map(str, sorted(pods)))} Running, s: median (range) "
        "| in the median run, a pod to Running, s: p50 / p90 | FailedScheduling events a run | check |",
        "|---|---|---:|---:|---:|---|",
    ]
    for (scheduler, protocol), runs in groups.items():
        totals = [run["all_running"] for run in runs]
        middle = median_run(runs)
        protocol_name = "HAMi" if protocol == "hami" else protocol
        lines.append(
            f"| {scheduler} | {protocol_name} | {statistics.median(totals):.1f} ({spread(totals)}) "
            f"| {middle['p50']:.1f} / {middle['p90']:.1f} | {spread([run['failed_scheduling'] for run in runs], 0)} "
            f"| {check_cell(runs)} |"
        )
    return "\n".join(lines)


# ---- make bench: the verbs ------------------------------------------------------------------------------------


def verbs_table(records: Sequence[record.Record]) -> str:
    """bench.bench's own table, each figure the median over the records (one run: its figures)."""
    machine = one_machine(records)
    by_row: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for kept in records:
        for row in kept.results["rows"]:
            by_row.setdefault((row["verb"], row["names"]), []).append(row)
    figures = [field.name for field in dataclasses.fields(bench.Row) if field.type == "float"]
    rows = [
        bench.Row(verb, names, **{name: statistics.median(row[name] for row in runs) for name in figures})
        for (verb, names), runs in by_row.items()
    ]
    clients = sorted({kept.settings["clients"] for kept in records})
    medians = "one run" if len(records) == 1 else f"each figure the median of {len(records)} runs"
    return "\n".join(
        [
            f"**Results** ({machine.describe()}; {medians}, {runs_said(records)}):",
            "",
            bench.table(rows, clients[0]) if len(clients) == 1 else bench.table(rows, 0).replace(" (0 conns)", ""),
        ]
    )


# ---- make bench: five thousand nodes, changing ---------------------------------------------------------------


def ms_figures(samples: Sequence[float], *fractions: float) -> str:
    """Percentiles of seconds, in milliseconds, as bench.scale prints them: `3.9 / 9.2 / 35.4`."""
    return " / ".join(f"{percentile(samples, fraction) * 1e3:.1f}" for fraction in fractions)


def scale_table(records: Sequence[record.Record]) -> str:
    """One row per scenario of each run: the filter, the bind and `/healthz` as bench.scale measured them."""
    machine = one_machine(records)
    settings = [kept.settings for kept in records]
    lines = [
        f"**Results** ({machine.describe()}; {joined([given['nodes'] for given in settings])} nodes, "
        f"{joined([given['churn'] for given in settings])} running pods replaced a second, "
        f"{joined([given['pods'] for given in settings])} pods a scenario; {runs_said(records)}):",
        "",
        "| scenario | pods placed | refused (no node fits) | filter p50 / p99 / max ms | bind p50 / p99 / max ms "
        "| `/healthz` p99 / max ms | loop held at most, ms | server CPU per pod, ms | RSS, MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = list(dict.fromkeys(scenario["label"] for kept in records for scenario in kept.results["scenarios"]))
    for label in labels:
        for number, kept in enumerate(records, start=1):
            for scenario in kept.results["scenarios"]:
                if scenario["label"] != label:
                    continue
                run = f" (run {number})" if len(records) > 1 else ""
                lines.append(
                    f"| {label}{run} | {scenario['placed']:,} | {scenario['refused']:,} "
                    f"| {ms_figures(scenario['filter'], 0.5, 0.99, 1.0)} "
                    f"| {ms_figures(scenario['bind'], 0.5, 0.99, 1.0)} "
                    f"| {ms_figures(scenario['ping'], 0.99, 1.0)} | {scenario['lag_max'] * 1e3:.1f} "
                    f"| {scenario['cpu_per_pod_ms']:.1f} | {scenario['rss_mib']:,.0f} |"
                )
    return "\n".join(lines)


# ---- make bench: the live cache -------------------------------------------------------------------------------


SCRAPES = ("gpu", "node", "auto")
"""bench.cache_build's `--gpu-metrics` settings, in the order the table gives them: the default last."""


def scrape_label(series: str, cache: dict[str, Any]) -> str:
    scrapes = cache["scrapes"]
    size = f"{scrapes[series]['bytes'] / 2**20:.1f} MB"
    if series == "gpu":
        return f"one `/metrics` scrape, a series per GPU for {cache['gpus']:,} GPUs (`--gpu-metrics gpu`; {size})"
    if series == "node":
        return f"one `/metrics` scrape, series per node only (`--gpu-metrics node`; {size})"
    per = "node" if scrapes["auto"]["bytes"] == scrapes["node"]["bytes"] else "GPU"
    return f"one `/metrics` scrape, the default (`--gpu-metrics auto`: per {per} at this size; {size})"


def cache_table(records: Sequence[record.Record]) -> str:
    """What bench.cache_build measured, one line a figure, each the range over the runs, beside its target."""
    machine = one_machine(records)
    caches = [kept.results["cache"] for kept in records]
    first = caches[0]

    def over(name: str, scale: float = 1.0, digits: int = 0) -> str:
        return spread([cache[name] * scale for cache in caches], digits)

    events = [cache["event_decode_apply_seconds"] for cache in caches]
    lines = [
        f"**Results** ({machine.describe()}; {joined([c['nodes'] for c in caches])} nodes, "
        f"{joined([c['gpus'] for c in caches])} GPUs, {joined([c['pods'] for c in caches])} pods "
        f"({joined([c['holding_gpu_memory'] for c in caches])} holding GPU memory); {runs_said(records)}):",
        "",
        "| | measured | target |",
        "|---|---:|---:|",
        f"| first list of nodes and pods into the cache ({first['wire_bytes'] / 2**20:,.0f} MB of JSON) "
        f"| {over('first_list_seconds', digits=1)} s | < {cache_build.LIST_TARGET_SECONDS:.0f} s |",
        f"| resident memory of the cache (process RSS after, minus before) | {over('cache_mb')} MB "
        f"({over('rss_after_mb')} MB in all; peak while listing {over('peak_mb')} MB) "
        f"| < {cache_build.MEMORY_TARGET_MB:.0f} MB |",
        f"| one MODIFIED pod event, decoded line to cache "
        f"| mean {spread([statistics.fmean(samples) * 1e6 for samples in events], 0)} µs, "
        f"p99 {spread([percentile(samples, 0.99) * 1e6 for samples in events], 0)} µs | well under 1 ms |",
    ]
    for series in sorted(first["scrapes"], key=SCRAPES.index):
        scrapes = [cache["scrapes"][series] for cache in caches]
        lines.append(
            f"| {scrape_label(series, first)} | {spread([scrape['seconds'] * 1e3 for scrape in scrapes], 0)} ms "
            f"in all, the event loop held at most {spread([scrape['longest_hold'] * 1e3 for scrape in scrapes])} "
            f"ms at a time | {'a few ms at a time' if series == 'gpu' else ''} |"
        )
    return "\n".join(lines)


# ---- make loadtest --------------------------------------------------------------------------------------------


def loadtest_runs(records: Sequence[record.Record]) -> list[dict[str, Any]]:
    """The summary of each run (loadtest.run's `run`; a saturation search's steps are not such runs)."""
    return [kept.results["run"] for kept in records if "run" in kept.results]


def extender_flags(plan: dict[str, Any]) -> str:
    return " ".join(f"`{flag}`" for flag in plan["server_flags"]) or "as shipped"


def loadtest_table(records: Sequence[record.Record]) -> str:
    """One row per run of loadtest.run: its pace, the client-side latencies and the handler's own p99, bind
    conflicts, the server's CPU per pod placed."""
    machine = one_machine(records)
    runs = sorted(
        loadtest_runs(records),
        key=lambda run: (
            run["plan"]["nodes"],
            run["plan"]["rate"],
            bool(run["plan"]["server_flags"]),
            run["locust"]["names_per_filter"],
        ),
    )
    lines = [
        f"**Results** ({machine.describe()}; one server process, Locust in one process beside it; "
        f"{joined([run['plan']['duration'] for run in runs])} s a run; {runs_said(records)}):",
        "",
        "| extender | nodes | names per filter | pods/s of the target | filter p50 / p99 ms | bind p50 / p99 ms "
        "| in the handler, p99 ≤ ms: filter / bind | max ms | bind conflicts | server CPU µs per pod | server CPU "
        "| end check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in runs:
        plan, locust = run["plan"], run["locust"]
        verbs, outcomes = locust["verbs"], locust["outcomes"]
        placed, attempts = int(outcomes.get("placed", 0)), int(outcomes.get("attempts", 0))
        requests = sum(int(verb["requests"]) for verb in verbs.values())
        client = {
            name: f"{verbs[name]['p50']:.2f} / {verbs[name]['p99']:.2f}" if name in verbs else "-"
            for name in ("filter", "bind")
        }
        handler = " / ".join(f"{run['server_p99_ms'].get(name, 0):g}" for name in ("filter", "bind"))
        failed = [check["name"] for check in run["checks"] if not check["ok"]] or [f"{run['errors']} errors"]
        check = "passed" if run["passed"] else f"FAILED ({', '.join(failed)})"
        lines.append(
            f"| {extender_flags(plan)} | {plan['nodes']:,} | {int(locust['names_per_filter']):,} "
            f"| {run['attempts_per_second']:,.0f} of {plan['rate']:g} | {client['filter']} | {client['bind']} "
            f"| {handler} | {max(verb['max'] for verb in verbs.values()):,.0f} "
            f"| {int(outcomes.get('bind_conflicts', 0)):,} of {attempts:,} "
            f"| {run['server_cpu_seconds'] / max(1, placed) * 1e6:,.0f} ({requests / max(1, placed):.1f} requests) "
            f"| {run['server_cpu_seconds'] / run['seconds']:.0%} | {check} |"
        )
    return "\n".join(lines)


# ---- make bench-e2e -------------------------------------------------------------------------------------------

ALONE = "alone"
"""bench.e2e_run's name for kube-scheduler without an extender."""
PROCESSES = ("etcd", "kube-apiserver", "kube-scheduler", "extender")
"""The processes bench.e2e measures the CPU of (the floor counts as `extender`), as its report orders them."""


def round_offsets(records: Sequence[record.Record]) -> list[int]:
    """Per record, the rounds of the records before it at the same size: its rounds are numbered on from theirs."""
    offsets, counted = [], Counter[tuple[int, int]]()
    for kept in records:
        size = (kept.settings["nodes"], kept.settings["pods"])
        offsets.append(counted[size])
        counted[size] += kept.settings["runs"]
    return offsets


def e2e_runs(records: Sequence[record.Record]) -> list[tuple[int, int, int, dict[str, Any]]]:
    """(nodes, pods, round, result) of every run that finished, the rounds of each size numbered 1, 2, ..."""
    return [
        (kept.settings["nodes"], kept.settings["pods"], offset + run["round"], run["result"])
        for kept, offset in zip(records, round_offsets(records), strict=True)
        for run in kept.results["runs"]
    ]


def e2e_table(records: Sequence[record.Record]) -> str:
    """Pods/s of kube-scheduler alone and with each wiring, round by round with the ratio to alone in the same
    round; then the CPU per pod of each process, the median over the rounds."""
    machine = one_machine(records)
    wirings = list(dict.fromkeys(wiring for kept in records for wiring in kept.settings["wiring"]))
    runs = e2e_runs(records)
    rounds = sorted({(nodes, pods, number) for nodes, pods, number, _ in runs})
    lines = [
        f"**Results** ({machine.describe()}; {runs_said(records)}): pods bound a second, from the 5th to the "
        "95th percentile bind, and the ratio to kube-scheduler alone in the same round",
        "",
        "| nodes | pods | round | alone | " + " | ".join(f"{wiring} | ratio" for wiring in wirings) + " |",
        "|---:|---:|---:|---:|" + "---:|---:|" * len(wirings),
    ]
    for nodes, pods, number in rounds:
        paces = {
            result["wiring"]: result["pace"]["pods_per_second"]
            for n, p, r, result in runs
            if (n, p, r) == (nodes, pods, number)
        }
        alone = paces.get(ALONE)
        cells = [f"{alone:.0f}" if alone else "-"]
        for wiring in wirings:
            pace = paces.get(wiring)
            cells += [f"{pace:.0f}", f"{pace / alone:.2f}" if alone else "-"] if pace else ["-", "-"]
        lines.append(f"| {nodes:,} | {pods:,} | {number} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU milliseconds per pod (the median over the rounds; `extender` is ours or the floor):",
        "",
        "| nodes | run | " + " | ".join(PROCESSES) + " | sum |",
        "|---:|---|" + "---:|" * (len(PROCESSES) + 1),
    ]
    for nodes in sorted({nodes for nodes, _, _, _ in runs}):
        for wiring in (ALONE, *wirings):
            cpu = [result["cpu_ms_per_pod"] for n, _, _, result in runs if n == nodes and result["wiring"] == wiring]
            if not cpu:
                continue
            shown = [name for name in PROCESSES if wiring != ALONE or name != "extender"]
            median = {name: statistics.median(run.get(name, 0.0) for run in cpu) for name in shown}
            cells = [f"{median[name]:.1f}" if name in median else "-" for name in PROCESSES]
            lines.append(f"| {nodes:,} | {wiring} | " + " | ".join(cells) + f" | {sum(median.values()):.1f} |")
    lines += ["", end_checks(records, runs)]
    return "\n".join(lines)


def end_checks(records: Sequence[record.Record], runs: Sequence[tuple[int, int, int, dict[str, Any]]]) -> str:
    """Whether every run's end check passed, and which runs did not finish (their reason is in the record)."""
    checked = [result for _, _, _, result in runs]
    failed = sum(1 for result in checked if result["check"]["problems"])
    said = "passed in every run" if not failed else f"found problems in {failed} of {len(checked)} runs"
    finished = {(nodes, number, result["wiring"]) for nodes, _, number, result in runs}
    unfinished = []
    for kept, offset in zip(records, round_offsets(records), strict=True):
        for failure in kept.results["failures"]:
            found = re.match(r"round (\d+), ([\w-]+): ", failure)
            if found:
                where = (kept.settings["nodes"], offset + int(found[1]), found[2])
                if where not in finished and where not in unfinished:
                    unfinished.append(where)
    text = f"End checks: {said}."
    if unfinished:
        listed = "; ".join(f"{wiring} in round {number} at {nodes:,} nodes" for nodes, number, wiring in unfinished)
        text += f" Runs that did not finish, so have no figure (the record says why): {listed}."
    return text


# ---- bench.placement.jobs: jobs placed whole ------------------------------------------------------------------

JOB_SCHEDULERS = ("ours, jobs declared", "ours, no groups")
"""bench.placement.jobs's names for ours, in the order its table gives them; the peers come after, by name."""
JOB_PROTOCOLS = {"gpushare": "gpushare's protocol", "hami": "HAMi's protocol"}


def job_rows(records: Sequence[record.Record], mode: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every run of `mode` (fill-up or churn) of every record by (protocol, scheduler): gpushare's protocol first,
    ours before the peers; each row's runs by seed. A seed run again replaces its earlier run (records by start)."""
    newest: dict[tuple[str, str, object], dict[str, Any]] = {}
    for kept in sorted(records, key=lambda kept: kept.started):
        for run in kept.results.get("runs", []):
            if run.get("mode", "fill-up") == mode:
                newest[run["protocol"], run["scheduler"], run["seed"]] = run
    runs = list(newest.values())

    def order(key: tuple[str, str]) -> tuple[object, ...]:
        protocol, scheduler = key
        ours = JOB_SCHEDULERS.index(scheduler) if scheduler in JOB_SCHEDULERS else len(JOB_SCHEDULERS)
        return protocol != "gpushare", protocol, ours, scheduler

    keys = sorted({(run["protocol"], run["scheduler"]) for run in runs}, key=order)
    return {
        key: sorted((run for run in runs if (run["protocol"], run["scheduler"]) == key), key=lambda run: run["seed"])
        for key in keys
    }


def seed_by_seed(runs: Sequence[dict[str, Any]], show: Callable[[dict[str, Any]], str]) -> str:
    return " / ".join(show(run) for run in runs)


def job_table_rows(
    rows: dict[tuple[str, str], list[dict[str, Any]]], columns: Sequence[Callable[[dict[str, Any]], str]]
) -> list[str]:
    """A line per scheduler (under a line per protocol, when there are two), its cells seed by seed."""
    lines: list[str] = []
    several = len({protocol for protocol, _ in rows}) > 1
    headed: set[str] = set()
    for (protocol, scheduler), group in rows.items():
        if several and protocol not in headed:
            lines.append(f"| *{JOB_PROTOCOLS.get(protocol, protocol)}* |" + " |" * (len(columns) + 2))
            headed.add(protocol)
        cells = [seed_by_seed(group, lambda run: str(run["seed"]))]
        cells += [seed_by_seed(group, column) for column in columns]
        lines.append(f"| {scheduler} | " + " | ".join([*cells, check_cell(group)]) + " |")
    return lines


def jobs_table(records: Sequence[record.Record]) -> str:
    """The fill-up's table (GPUs allocated, to jobs started whole; jobs started whole, partly placed with the GPUs
    their bound pods hold, never started) and the churn's (GPUs allocated and to jobs started over the full part,
    GPU-hours held by jobs partly placed, jobs started, withdrawn and waiting at the end, the wait of jobs of
    several pods): a row per scheduler and protocol, each figure seed by seed."""
    machine = one_machine(records)
    said = f"{machine.describe()}; a figure per run, seed by seed; {runs_said(records)}"
    tables = []
    fill_up = job_rows(records, "fill-up")
    if fill_up:
        runs = [run for group in fill_up.values() for run in group]
        tables += [
            f"**Fill-up** ({said}; {joined([run['nodes'] for run in runs])} of the trace's nodes, "
            f"{joined([run['gpus'] for run in runs])} GPUs; {joined([run['jobs'] for run in runs])} jobs of "
            f"{joined([run['pods'] for run in runs])} pods, by seed):",
            "",
            "| scheduler | seeds | GPU allocated, % | to jobs started whole, % | jobs started whole "
            "| jobs partly placed (GPUs they hold) | jobs never started | end check |",
            "|---|---|---:|---:|---:|---:|---:|---|",
            *job_table_rows(
                fill_up,
                [
                    lambda run: f"{run['allocated']:.1f}",
                    lambda run: f"{run['useful']:.1f}",
                    lambda run: f"{run['whole']:,}",
                    lambda run: f"{run['partial']:,} ({run['partial_gpus']:,.1f})",
                    lambda run: f"{run['never']:,}",
                ],
            ),
        ]
    churned = job_rows(records, "churn")
    if churned:
        runs = [run for group in churned.values() for run in group]
        tables += [
            *([""] if tables else []),
            f"**Jobs that come and go** ({said}; {joined([run['nodes'] for run in runs])} of the trace's nodes, "
            f"{joined([run['gpus'] for run in runs])} GPUs; {joined([run['jobs'] for run in runs])} jobs arriving "
            f"over {joined([run['hours'] for run in runs])} trace hours, "
            f"{joined([run['offered'] for run in runs])} capacities offered, withdrawn after "
            f"{joined([run['patience_minutes'] for run in runs])} trace minutes not started):",
            "",
            "| scheduler | seeds | GPU allocated, % | to jobs started, % | held by jobs partly placed, GPU-hours "
            "(% of the cluster's) | longest a job was partly placed | jobs started | withdrawn (holding GPUs then) "
            "| waiting at the end (holding GPUs) | jobs of several pods: wait p90 | end check |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            *job_table_rows(
                churned,
                [
                    lambda run: f"{run['allocated']:.1f}",
                    lambda run: f"{run['useful']:.1f}",
                    lambda run: f"{run['partial_gpu_hours']:,.1f} ({run['partial_share']:.1f})",
                    longest_partly_placed,
                    lambda run: f"{run['started']:,}",
                    lambda run: f"{run['withdrawn']:,} ({run['withdrawn_partial']:,})",
                    lambda run: f"{run['waiting']:,} ({run['waiting_partial']:,})",
                    lambda run: wait_text(run["gang_wait_p90"]),
                ],
            ),
        ]
    return "\n".join(tables)


def longest_partly_placed(run: dict[str, Any]) -> str:
    """The longest a job was partly placed, or "not counted" in a record from before the figure was."""
    return wait_text(run["partly_placed_longest"]) if "partly_placed_longest" in run else "not counted"


def wait_text(seconds: float) -> str:
    """Trace seconds as the churn report says them: `45s`, `12m`, `1.5h`."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


# ---- make bench: the transport --------------------------------------------------------------------------------


def transport_table(records: Sequence[record.Record]) -> str:
    """bench.transport's servers: each figure the median over every round of every record, as the bench prints
    one run's (its rounds' median)."""
    machine = one_machine(records)
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for kept in records:
        for server in kept.results["servers"]:
            rates.setdefault(server["label"], []).extend(server["rates"])
            cpu.setdefault(server["label"], []).extend(server["cpu_us"])
    settings = records[-1].settings
    rounds = sum(len(kept.results["servers"][0]["rates"]) for kept in records if kept.results["servers"])
    return "\n".join(
        [
            f"**Results** ({machine.describe()}; {settings['names']:,} node names a POST, "
            f"{settings['connections']} keep-alive connections from {settings['clients']} client processes, each "
            f"figure the median of {rounds} runs of {settings['seconds']:g} s; {runs_said(records)}):",
            "",
            "| server | req/s | server CPU µs/request |",
            "|---|---:|---:|",
            *(
                f"| {label} | {statistics.median(rates[label]):,.0f} | {statistics.median(cpu[label]):.1f} |"
                for label in rates
            ),
        ]
    )


TABLES: dict[str, Callable[[Sequence[record.Record]], str]] = {
    "placement": figures_placement.result_table,
    "placement mig": figures_placement.mig_table,
    "node_burst": node_burst_table,
    "bench": verbs_table,
    "scale": scale_table,
    "cache_build": cache_table,
    "run": loadtest_table,
    "e2e": e2e_table,
    "jobs": jobs_table,
    "transport": transport_table,
}
"""The benches whose pages' tables are built from records, by records folder (and the table's name after it, for a
bench with more than one: `table_key`)."""


def table_key(marker: re.Match[str]) -> str:
    """The key of `TABLES` a page's table marker names: `placement`, `placement mig`."""
    return marker["folder"] + (marker["name"] or "")


PLOTS: dict[str, tuple[str, Callable[[Sequence[record.Record]], str]]] = {
    "fill-up-default.svg": ("placement", figures_placement.fill_up_plot),
    "churn-default.svg": ("placement", figures_placement.churn_plot),
}
"""The benchmark pages' images built from records: by file name in docs/benchmarks/, (records folder, builder).
`python -m devtools.docs_hooks` writes them; the site's build and the tests fail when one differs."""
BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def built_plot(name: str, root: Path = record.RECORDS) -> str:
    """The image `name` as its records draw it now."""
    folder, build = PLOTS[name]
    records = record.load(folder, root)
    if not records:
        raise FiguresError(f"a published plot with no record: bench/records/{folder}/ is empty")
    return build(records)


def stale_plots(pages: Path = BENCHMARKS, root: Path = record.RECORDS) -> list[str]:
    """The images built from records that differ from what the records draw (or are missing)."""
    return [
        name for name in PLOTS if not (pages / name).is_file() or (pages / name).read_text() != built_plot(name, root)
    ]


def write_plots(pages: Path = BENCHMARKS, root: Path = record.RECORDS) -> None:
    for name in PLOTS:
        (pages / name).write_text(built_plot(name, root))


def fill_tables(markdown: str, root: Path = record.RECORDS) -> str:
    """A page with every table marker replaced by its table, and every awaiting marker by its note."""

    def table(found: re.Match[str]) -> str:
        folder, key = found["folder"], table_key(found)
        if key not in TABLES:
            raise FiguresError(f"no table is built from bench/records/{folder} as {key!r} (bench/figures.py's TABLES)")
        records = record.load(folder, root)
        if not records:
            raise FiguresError(f"a published figure with no record: bench/records/{folder}/ is empty")
        return TABLES[key](records)

    return TABLE_MARKER.sub(table, markdown).replace(AWAITING_MARKER, AWAITING_NOTE)


# ---- the README's figures ------------------------------------------------------------------------------------


RAISED = "hami-scheduler-qps"
"""The scheduler name of hami-scheduler's runs with its API client raised: `hami-scheduler-qps<requests/s>`."""


def burst_row(root: Path = record.RECORDS) -> tuple[str, ...]:
    """The README's row of the node burst: ours in HAMi's protocol beside hami-scheduler, medians over runs."""
    groups = node_burst_groups(record.load("node_burst", root))
    if ("ours", "hami") not in groups or ("hami-scheduler", "hami") not in groups:
        raise FiguresError("the README's burst row needs records of ours and of hami-scheduler in HAMi's protocol")
    ours, peer = groups[("ours", "hami")], groups[("hami-scheduler", "hami")]
    peer_cell = (
        f"hami-scheduler v2.10.0: {statistics.median(run['all_running'] for run in peer):.1f} s ({len(peer)} runs)"
    )
    for (scheduler, protocol), runs in groups.items():
        # hami-scheduler with its API client raised (bench.node_burst --peer-qps), beside it as shipped.
        if protocol == "hami" and scheduler.startswith(RAISED):
            qps = scheduler.removeprefix(RAISED)
            peer_cell += f"; client at {qps}/s: {statistics.median(run['all_running'] for run in runs):.1f} s"
    return (
        f"{ours[0]['pods']} GPU pods created at once to all Running, one node, HAMi's protocol",
        f"{statistics.median(run['all_running'] for run in ours):.1f} s (median, {len(ours)} runs)",
        peer_cell,
        "[node burst](docs/benchmarks/node-burst.md)",
        RECORDED,
    )


def scale_row(root: Path = record.RECORDS) -> tuple[str, ...]:
    """The README's row of bench.scale: the filter of pods of three shapes while the cluster changes, and the
    extender's memory then (the median over the runs, when there are several)."""
    records = record.load("scale", root)
    if not records:
        raise FiguresError("the README's row of five thousand nodes, changing, needs bench/records/scale/")
    three = [next(s for s in kept.results["scenarios"] if s["label"] == "three shapes") for kept in records]
    p50 = statistics.median(percentile(scenario["filter"], 0.5) for scenario in three) * 1e3
    p99 = statistics.median(percentile(scenario["filter"], 0.99) for scenario in three) * 1e3
    rss = statistics.median(scenario["rss_mib"] for scenario in three)
    given = records[-1].settings
    pods = round(records[-1].results["running_pods"], -3)
    runs = f" (median, {len(records)} runs)" if len(records) > 1 else ""
    return (
        f"{given['nodes']:,} nodes, about {pods:,} pods, {given['churn']:g} replaced a second: filter p50 / p99",
        f"{p50:.1f} / {p99:.1f} ms{runs}, {rss:,.0f} MiB resident",
        "no peer run",
        "[make bench](docs/benchmarks/bench.md#five-thousand-nodes-changing)",
        RECORDED,
    )


def loadtest_row(root: Path = record.RECORDS) -> tuple[str, ...]:
    """The README's row of make loadtest: the filter's client-side p99 as shipped, with kube-scheduler's adaptive
    share of names (the median over such runs, when there are several), and its bind conflicts."""
    shipped = [
        run
        for run in loadtest_runs(record.load("run", root))
        if not run["plan"]["server_flags"] and run["plan"]["names"] == "adaptive"
    ]
    if not shipped:
        raise FiguresError("the README's load test row needs a record of make loadtest as shipped (NAMES=adaptive)")
    plan = shipped[-1]["plan"]
    p99 = statistics.median(run["locust"]["verbs"]["filter"]["p99"] for run in shipped)
    conflicts = sum(int(run["locust"]["outcomes"].get("bind_conflicts", 0)) for run in shipped)
    runs = f" (median, {len(shipped)} runs)" if len(shipped) > 1 else ""
    return (
        f"the extender alone, {plan['nodes']:,} nodes, {plan['rate']:g} pods/s, every pod bound: filter p99",
        f"{p99:.2f} ms{runs}, " + ("no bind conflict" if not conflicts else f"{conflicts:,} bind conflicts"),
        "no peer run",
        "[load test](docs/benchmarks/loadtest.md#at-kube-schedulers-pace)",
        RECORDED,
    )


README_ROWS: tuple[tuple[str, Callable[[], tuple[str, ...]]], ...] = (
    ("placement", figures_placement.whole_trace_row),
    ("placement", figures_placement.sample_row),
    ("placement", figures_placement.churn_row),
    ("node_burst", burst_row),
    ("run", loadtest_row),
    ("scale", scale_row),
)
"""The README's rows built from records: (the records folder, the row's builder)."""


def row_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def readme_table(readme: str) -> list[str]:
    """The lines of the README's figures table."""
    if FIGURES_HEADING not in readme:
        raise FiguresError(f"README.md has no {FIGURES_HEADING!r} section")
    section = readme.split(FIGURES_HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def fill_readme(readme: str) -> str:
    """The README with each row built from records rewritten, found by its first cell."""
    for _, build in README_ROWS:
        cells = build()
        lines = [line for line in readme_table(readme) if line.startswith(f"| {cells[0]} |")]
        if len(lines) != 1:
            raise FiguresError(f"README.md's figures have {len(lines)} rows {cells[0]!r}: keep one, then run again")
        readme = readme.replace(lines[0], row_line(cells))
    return readme


def stale_readme_rows(readme: str) -> list[str]:
    """The README's rows from records that differ from what the records give."""
    table = readme_table(readme)
    return [cells[0] for _, build in README_ROWS if row_line(cells := build()) not in table]


def readme_table_for_site(readme: str) -> str:
    """The README's figures table as docs/index.md shows it: links relative to docs/."""
    return "\n".join(readme_table(readme)).replace("](docs/", "](")
