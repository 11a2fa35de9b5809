"""The placement page's table and the README's placement rows, built from `make bench-placement`'s run records
(bench/records/placement/, each run as `bench/placement/runs.py` keeps it).

Only the real mode counts (the real kube-scheduler: the figure of record); a seed run again replaces its earlier
run (records by start), so a rerun after a fix is what the pages show and the earlier record stays as history.
The paper's FGD is the paper's own figure (`bench/placement/paper.py`), cited beside ours, never measured here.
"""

from __future__ import annotations

import operator
import re
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import record
from bench.figures_common import RECORDED, FiguresError, one_machine, records_folder, runs_said
from bench.placement import plot
from bench.placement.paper import PAPER

FOLDER = "placement"
KINDS = ("fill-up", "churn")
WORKLOADS = ("default", "gpushare100")
PROTOCOLS = {"gpushare": "gpushare's protocol", "hami": "HAMi's protocol"}
OURS = ("ours", "our fill policy")
"""Ours first, in this order; the peers after, by name."""
PEER_TO_README = "gpushare-scheduler-extender c0b6141"
"""The peer of the README's row of the 400-node sample: the one run on it in gpushare's protocol."""

REFUSING = "ours (--extender-flag=--gpushare-several-gpus=refuse)"
"""Ours as shipped in gpushare's protocol, which refuses pods asking several GPUs (`bench.placement` binds them
unless told: `GPUSHARE_FLAGS`), as a run given the flag names it."""

WHOLE_TRACE = 1213
"""The trace's GPU nodes (openb_node_list_gpu_node.csv): a run on that many is on the whole trace."""

Key = tuple[str, int, str, str, str]
"""(protocol, nodes, kind, workload, scheduler)."""


def newest_runs(records: Sequence[record.Record]) -> dict[Key, list[dict[str, Any]]]:
    """Every real-mode run by (protocol, nodes, kind, workload, scheduler), each seed's newest, by seed."""
    newest: dict[tuple[Key, int], dict[str, Any]] = {}
    for kept in sorted(records, key=lambda kept: kept.started):
        for run in kept.results.get("runs", []):
            if run["mode"] == "real":
                key = (run["protocol"], run["nodes"], run["kind"], run["workload"], run["scheduler"])
                newest[key, run["seed"]] = run
    grouped: dict[Key, list[dict[str, Any]]] = {}
    for (key, _), run in sorted(newest.items(), key=lambda item: (item[0][0], item[0][1])):
        grouped.setdefault(key, []).append(run)
    return grouped


def _sections(runs: dict[Key, list[dict[str, Any]]]) -> list[tuple[str, int, list[str]]]:
    """Each (protocol, nodes) run, gpushare's protocol first and the larger cluster first, with its schedulers in
    the pages' order (`_scheduler_order`): the table's sections and the plots' panels."""
    sections = sorted({key[:2] for key in runs}, key=lambda section: (section[0] != "gpushare", -section[1]))
    return [
        (protocol, nodes, sorted({key[4] for key in runs if key[:2] == (protocol, nodes)}, key=_scheduler_order))
        for protocol, nodes in sections
    ]


def _scheduler_order(scheduler: str) -> tuple[object, ...]:
    """Ours first (with settings of a run's own right after as shipped), our fill policy, then the peers by name."""
    base = next((name for name in OURS if scheduler == name or scheduler.startswith(f"{name} (")), None)
    return (base is None, OURS.index(base) if base is not None else 0, scheduler)


def _column_order(column: tuple[str, str]) -> tuple[object, ...]:
    kind, workload = column
    order = WORKLOADS.index(workload) if workload in WORKLOADS else len(WORKLOADS)
    return KINDS.index(kind), order, workload


def _cell(runs: Sequence[dict[str, Any]], seeds: Sequence[int], value: Callable[[dict[str, Any]], float]) -> str:
    """The figure of each run, seed by seed; the seeds named when they are not the column's."""
    text = " / ".join(f"{value(run):.1f}" for run in runs)
    ran = [run["seed"] for run in runs]
    return text if ran == list(seeds) else f"{text} (seed{'s' if len(ran) > 1 else ''} {', '.join(map(str, ran))})"


def _seeds(seeds: Sequence[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {' / '.join(map(str, seeds))}"


def _section(protocol: str, nodes: int) -> str:
    sample = f"the whole trace, {nodes:,} nodes" if nodes == WHOLE_TRACE else f"{nodes:,} of the trace's nodes"
    return f"*{PROTOCOLS.get(protocol, protocol)}, {sample}*"


def result_table(records: Sequence[record.Record]) -> str:
    """GPU allocated, % (fill-up: when 130 % of the capacity has arrived; churn: the mean over the full part), a
    row per scheduler under a line per protocol and cluster, a column per kind of run and workload, each cell seed
    by seed; the paper's FGD beside ours on the whole trace; the end check's findings under the table."""
    records = _of_kind(records, "runs")
    machine = one_machine(records)
    runs = newest_runs(records)
    if not runs:
        raise FiguresError(f"no run of the real mode in {records_folder(records)}")
    columns = sorted({(kind, workload) for _, _, kind, workload, _ in runs}, key=_column_order)
    seeds = {
        column: sorted({run["seed"] for key, group in runs.items() if key[2:4] == column for run in group})
        for column in columns
    }
    header = [f"{kind} `{workload}`, {_seeds(seeds[kind, workload])}" for kind, workload in columns]
    lines = [
        f"**GPU allocated, %** ({machine.describe()}; {runs_said(records)}):",
        "",
        "| | " + " | ".join(header) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for protocol, nodes, schedulers in _sections(runs):
        lines.append(f"| {_section(protocol, nodes)} |" + " |" * len(columns))
        for scheduler in schedulers:
            cells = []
            for kind, workload in columns:
                group = runs.get((protocol, nodes, kind, workload, scheduler), [])
                cell = _cell(group, seeds[kind, workload], lambda run: run["allocated"]) if group else "not run"
                cells.append(f"**{cell}**" if scheduler == "ours" and group else cell)
            lines.append(f"| {scheduler} | " + " | ".join(cells) + " |")
        if nodes == WHOLE_TRACE and protocol == "gpushare":
            lines += _paper_rows(columns)
    paced = pace(runs)
    return "\n".join([*lines, "", end_checks(runs), *(["", paced] if paced else []), *one_gpu_at_most(runs, machine)])


def _of_kind(records: Sequence[record.Record], kind: str) -> list[record.Record]:
    """The records of one kind of run (`runs` through kube-scheduler, `mig` in process): one table each."""
    kept = [one for one in records if kind in one.results]
    if not kept:
        raise FiguresError(f"no record of {kind!r} in {records_folder(records)}")
    return kept


MIG_COLUMNS = (
    ("memory", "GPU memory allocated"),
    ("slices", "slices in use"),
    ("demand", "the pods' own demand placed"),
    ("free", "slices free at the end"),
    ("cut", "of it cut by the slices alone"),
)
"""The MIG table's figures (`bench/placement/mig.py`'s `figures`), all % of the GPUs."""
MIG_NAMES = {"ours": "ours, `--protocol hami`", "HAMi's greedy": "hami-scheduler v2.10.0's choice"}
"""The MIG runs' policies as the table names them."""


def mig_table(records: Sequence[record.Record]) -> str:
    """`--mig`: ours against HAMi's own choice on the trace's MIG-capable nodes, both in process on one arrival
    sequence: a row per policy (and workload, where the records hold several), a column per figure, each cell seed
    by seed (a seed run again replaces its earlier run); the pods placed and the end check under it."""
    records = _of_kind(records, "mig")
    machine = one_machine(records)
    newest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for kept in sorted(records, key=lambda kept: kept.started):  # a later run of a seed replaces it
        for run in kept.results["mig"]:
            newest[run["scheduler"], run["workload"], run["seed"]] = run
    rows = sorted({key[:2] for key in newest}, key=lambda row: (row[0] != "ours", row[0], row[1] != "default", row[1]))
    workloads = {workload for _, workload in rows}
    label = {row: MIG_NAMES.get(row[0], row[0]) + (f", `{row[1]}`" if len(workloads) > 1 else "") for row in rows}
    groups = {row: [newest[key] for key in sorted(newest) if key[:2] == row] for row in rows}
    seeds = sorted({key[2] for key in newest})
    sizes = {(run["nodes"], run["gpus"]) for run in newest.values()}
    cluster = " or ".join(f"{nodes:,} nodes, {gpus:,} GPUs" for nodes, gpus in sorted(sizes))
    said = "" if len(workloads) > 1 else f"workload `{next(iter(workloads))}`; "
    lines = [
        f"**% of the GPUs** ({said}{cluster}; {_seeds(seeds)}; {machine.describe()}; {runs_said(records)}):",
        "",
        "| | " + " | ".join(name for _, name in MIG_COLUMNS) + " |",
        "|---|" + "---:|" * len(MIG_COLUMNS),
    ]
    for row in rows:
        cells = [_cell(groups[row], seeds, operator.itemgetter(field)) for field, _ in MIG_COLUMNS]
        bold = [row[0] == "ours" and field == "memory" for field, _ in MIG_COLUMNS]
        lines.append(
            f"| {label[row]} | "
            + " | ".join(f"**{cell}**" if b else cell for b, cell in zip(bold, cells, strict=True))
            + " |"
        )
    placed = "; ".join(
        f"{label[row]} " + " / ".join(f"{run['placed']:,} of {run['pods']:,}" for run in groups[row]) for row in rows
    )
    found = [(key, run["problems"]) for key, run in newest.items() if run["problems"]]
    total = len(newest)
    check = (
        f"The end check is clean in every one of the {total} runs: no two instances overlap, no GPU holds more than "
        "7, each instance at one of its profile's placements with its memory, every GPU pod one instance per GPU "
        "asked, no node's cpu or memory over."
        if not found
        else f"The end check is clean in {total - len(found)} of the {total} runs; not in these: "
        + "; ".join(f"{label[key[:2]]} seed {key[2]}: {problems[0]}" for key, problems in found)
        + "."
    )
    return "\n".join([*lines, "", f"Pods placed, seed by seed: {placed}.", "", check])


PAPER_ROWS = {"FGD": "its best", "Random": "random placement"}
"""The paper's policies shown beside ours on the whole trace."""


def _paper_rows(columns: Sequence[tuple[str, str]]) -> list[str]:
    """The paper's figures for the fill-up columns, in its simulator (mean of its seeds 42-51)."""
    rows = []
    for policy, what in PAPER_ROWS.items():
        paper = [PAPER.get(workload, {}).get(policy) if kind == "fill-up" else None for kind, workload in columns]
        if any(paper):
            cells = [f"{value:.1f}" if value else "" for value in paper]
            label = f"the paper's {policy} ({what}), in its simulator, mean of seeds 42-51"
            rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def end_checks(runs: dict[Key, list[dict[str, Any]]]) -> str:
    """The end check over every run: clean, or each run that found something, with its first finding."""
    found = [
        (key, run) for key, group in runs.items() for run in group if run["problems"]
    ]  # each: nothing over capacity, every bound GPU pod with its allocation
    total = sum(len(group) for group in runs.values())
    if not found:
        return (
            f"The end check is clean in every one of the {total} runs: nothing over capacity, every pod bound with "
            "its allocation."
        )
    said = "; ".join(
        f"{key[4]}, {key[2]} `{key[3]}` seed {run['seed']} ({key[1]:,} nodes, {PROTOCOLS[key[0]]}): "
        f"{run['problems']} finding{'s' if run['problems'] > 1 else ''}, the first: {run['problems_first'][0]}"
        for key, run in found
    )
    return f"The end check is clean in {total - len(found)} of the {total} runs; not in these: {said}."


def pace(runs: dict[Key, list[dict[str, Any]]]) -> str:
    """Pods a second over each run, by scheduler and protocol (the range over its runs): in the fill-up the pods
    decided (each is created once the previous one is decided), under churn the pods bound against the pods the
    replay offers. On a shared machine a run's pace is also what ran beside it."""
    said = []
    for kind, what in (("fill-up", "decided"), ("churn", "bound")):
        rates: dict[tuple[str, str], list[float]] = {}
        offered: list[float] = []
        for key, group in runs.items():
            for run in group if key[2] == kind else ():
                rate = run.get("pods_per_second") if kind == "fill-up" else run["binds"] / run["seconds"]
                if isinstance(rate, int | float) and rate == rate:  # a run that kept no pace: NaN, or None
                    rates.setdefault((key[4], key[0]), []).append(rate)
                if kind == "churn":
                    offered.append(run["pods"] / run["seconds"])
        if not rates:
            continue
        both = {
            scheduler for scheduler, protocol in rates if (scheduler, "gpushare") in rates and protocol != "gpushare"
        }
        order = sorted(rates, key=lambda found: (_scheduler_order(found[0]), found[1]))
        named = {found: found[0] + (f" in {PROTOCOLS[found[1]]}" if found[0] in both else "") for found in order}
        by = ", ".join(f"{named[found]} {_span(rates[found])}" for found in order)
        lead = f"in the fill-up, {what}" if kind == "fill-up" else f"under churn, {what}, of {_span(offered)} offered"
        said.append(f"{lead}: {by}")
    return f"Pods a second over each run: {'; '.join(said)}." if said else ""


def _span(values: Sequence[float]) -> str:
    low, high = f"{min(values):.1f}", f"{max(values):.1f}"
    return low if low == high else f"{low} to {high}"


def one_gpu_at_most(runs: dict[Key, list[dict[str, Any]]], machine: record.Machine) -> list[str]:
    """Against gpushare-scheduler-extender, which refuses every pod asking several GPUs (its device plugin serves
    one GPU a pod), the GPU allocated to pods of one GPU at most: ours counted as it would be, were such pods
    never bound. Empty when no fill-up has gpushare's peer."""
    peered = {key[:4] for key in runs if key[4] == PEER_TO_README and key[2] == "fill-up"}
    if not peered:
        return []
    lines = [
        "",
        "**GPU allocated to pods asking one GPU at most, %** (the same runs; gpushare-scheduler-extender binds no "
        "other pod, so this is its whole figure):",
        "",
        "| | "
        + " | ".join(f"{kind} `{workload}`, {nodes:,} nodes" for _, nodes, kind, workload in sorted(peered))
        + " |",
        "|---|" + "---:|" * len(peered),
    ]
    schedulers = sorted({key[4] for key in runs if key[:4] in peered}, key=_scheduler_order)
    for scheduler in schedulers:
        cells = []
        for column in sorted(peered):
            group = runs.get((*column, scheduler), [])
            seeds = [run["seed"] for run in group]
            cells.append(_cell(group, seeds, lambda run: run["allocated_one_gpu_at_most"]) if group else "not run")
        lines.append(f"| {scheduler} | " + " | ".join(cells) + " |")
    return lines


# ---- the README's rows ----------------------------------------------------------------------------------------


def _mean(group: Sequence[dict[str, Any]], field: str = "allocated") -> str:
    """The mean over the seeds, and what it is the mean of."""
    seeds = f"mean, {len(group)} seeds" if len(group) > 1 else f"seed {group[0]['seed']}"
    return f"{_average(group, field):.1f} % ({seeds})"


def _average(group: Sequence[dict[str, Any]], field: str = "allocated") -> float:
    return float(statistics.mean(run[field] for run in group))


def _fill_up(
    runs: dict[Key, list[dict[str, Any]]], protocol: str, nodes: int | None, scheduler: str
) -> tuple[int, list[dict[str, Any]]]:
    """The fill-up runs of `default` of one scheduler on the whole trace (nodes None: the most nodes run) or a
    sample; FiguresError when there are none."""
    sizes = [key[1] for key in runs if key[0] == protocol and key[2:] == ("fill-up", "default", scheduler)]
    size = max(sizes, default=0) if nodes is None else nodes
    group = runs.get((protocol, size, "fill-up", "default", scheduler), [])
    if not group:
        where = "the whole trace" if nodes is None else f"{nodes} nodes"
        raise FiguresError(f"the README's placement rows need fill-up runs of {scheduler} on {where}")
    return size, group


def whole_trace_row(root: Path = record.RECORDS) -> tuple[str, ...]:
    """Ours on the whole trace, in the paper's method, beside the paper's FGD in its own simulator."""
    nodes, ours = _fill_up(newest_runs(record.load(FOLDER, root)), "gpushare", None, "ours")
    return (
        f"GPUs allocated, Alibaba's GPU-sharing trace ({nodes:,} nodes), via kube-scheduler, at 130 % of capacity "
        "arrived",
        _mean(ours),
        f"the paper's FGD, in its simulator: {PAPER['default']['FGD']:.1f} %",
        "[placement](docs/benchmarks/placement.md#the-result)",
        RECORDED,
    )


def sample_row(root: Path = record.RECORDS) -> tuple[str, ...]:
    """Ours and gpushare-scheduler-extender on a sample of the trace's nodes, each built from its source. Ours
    binds the pods asking several GPUs there, which gpushare's device plugin cannot start and its extender refuses;
    ours as shipped refuses them too (`REFUSING`): that run beside it when there is one, else ours counted on the
    pods of one GPU at most."""
    runs = newest_runs(record.load(FOLDER, root))
    nodes, peer = _fill_up(runs, "gpushare", 400, PEER_TO_README)
    _, ours = _fill_up(runs, "gpushare", nodes, "ours")
    refusing = runs.get(("gpushare", nodes, "fill-up", "default", REFUSING), [])
    if refusing:
        also = f"refusing pods of several GPUs, as shipped: {_average(refusing):.1f} %"
    else:
        also = f"pods of 1 GPU at most: {_average(ours, 'allocated_one_gpu_at_most'):.1f} %"
    return (
        f"the same replay, {nodes} of its nodes, each scheduler built from its source",
        f"{_mean(ours)}; {also}",
        f"gpushare-scheduler-extender: {_average(peer):.1f} %",
        "[peers](docs/benchmarks/placement.md#the-result)",
        RECORDED,
    )


# ---- the curves ---------------------------------------------------------------------------------------------------


def fill_up_plot(records: Sequence[record.Record]) -> str:
    """The fill-up's curve of `default` (GPU allocated as the demand arrives, the paper's curve), a panel per
    protocol and cluster, a line per scheduler and seed (a colour per scheduler, a dash per seed), every peer run
    on it: an SVG image (`bench/placement/plot.py`), the same records giving the same bytes."""
    runs = {key: group for key, group in newest_runs(records).items() if key[2:4] == ("fill-up", "default")}
    if not runs:
        raise FiguresError(f"no fill-up of `default` in {records_folder(records)} to draw")
    panels = []
    for protocol, nodes, schedulers in _sections(runs):
        lines = []
        for scheduler in schedulers:
            for dash, run in enumerate(runs[protocol, nodes, "fill-up", "default", scheduler]):
                points = tuple(sorted((float(x), float(y)) for x, y in run["curve"].items()))
                lines.append(plot.Line(f"{scheduler}, seed {run['seed']}", points, group=scheduler, dash=dash))
        title = _section(protocol, nodes).strip("*")
        panels.append(plot.Panel(title, "GPU demand arrived, % of capacity", "GPU allocated, %", tuple(lines), 40.0))
    return plot.svg(panels, "GPU allocated as the demand arrives, workload default (a line per seed)")


def churn_plot(records: Sequence[record.Record]) -> str:
    """The churn of `default`: the GPU allocated and the pods waiting over trace hours, a pair of panels per
    protocol and cluster, a line per scheduler and seed, every peer run on it (`fill_up_plot`'s conventions)."""
    runs = {key: group for key, group in newest_runs(records).items() if key[2:4] == ("churn", "default")}
    if not runs:
        raise FiguresError(f"no churn of `default` in {records_folder(records)} to draw")
    panels = []
    for protocol, nodes, schedulers in _sections(runs):
        allocated: list[plot.Line] = []
        waiting: list[plot.Line] = []
        for scheduler in schedulers:
            for dash, run in enumerate(runs[protocol, nodes, "churn", "default", scheduler]):
                label, samples = f"{scheduler}, seed {run['seed']}", run["samples"]
                hours = [float(sample["hours"]) for sample in samples]
                for lines, field in ((allocated, "allocated"), (waiting, "waiting")):
                    points = tuple(
                        (x, float(sample[field]))
                        for x, sample in zip(hours, samples, strict=True)
                        if sample[field] is not None
                    )
                    lines.append(plot.Line(label, points, group=scheduler, dash=dash))
        where = _section(protocol, nodes).strip("*")
        panels += [
            plot.Panel(f"GPU allocated, {where}", "trace hours", "% of the GPU capacity", tuple(allocated)),
            plot.Panel(f"Pods waiting, {where}", "trace hours", "pods", tuple(waiting)),
        ]
    return plot.svg(panels, "Pods coming and going, workload default (a line per seed)")


def _short(scheduler: str) -> str:
    """A peer's name without its version, as the README's narrow cells give it."""
    return re.sub(r" (v\d[\w.]*|[0-9a-f]{7,})(?=,|$)", "", scheduler)


def churn_row(root: Path = record.RECORDS) -> tuple[str, ...]:
    """Ours under churn on the 400-node sample, in gpushare's protocol and, where run with a clean end check, in
    HAMi's, beside every peer run so (the best first; a peer in HAMi's protocol says so)."""
    runs = newest_runs(record.load(FOLDER, root))
    ours = runs.get(("gpushare", 400, "churn", "default", "ours"), [])
    if not ours:
        raise FiguresError("the README's churn row needs churn runs of ours on 400 nodes, gpushare's protocol")
    in_hami = [run for run in runs.get(("hami", 400, "churn", "default", "ours"), []) if not run["problems"]]
    peers = [
        (_average(group), f"{_short(key[4])}{', HAMi' if key[0] == 'hami' else ''}: {_average(group):.1f} %"
         + (f" ({_seeds([run['seed'] for run in group])})" if len(group) != len(ours) else ""))
        for key, group in runs.items()
        if key[1:4] == (400, "churn", "default") and key[4] not in OURS
    ]  # fmt: skip
    return (
        "pods coming and going at the trace's pace, 400 nodes: GPUs allocated",
        _mean(ours) + (f"; in HAMi's protocol: {_mean(in_hami)}" if in_hami else ""),
        "; ".join(text for _, text in sorted(peers, reverse=True)) or "no peer run",
        "[peers](docs/benchmarks/placement.md#the-result)",
        RECORDED,
    )
