"""The figures the docs publish, built from the run records (bench/record.py), so a table says what its runs
measured and nothing else: the docs site's hook (devtools/docs_hooks.py) calls it for every page, and
tests/test_records.py holds the pages and the README to it.

- In a page, the line `<!-- table: bench/records/<bench> -->` becomes that bench's table (`TABLES`), built from
  every record in the folder, with the one machine they ran on (records from two machines make no table: one
  machine per table).
- A table whose figures predate the records is marked `<!-- awaiting a rerun -->` on the line above it, which the
  site shows as a note, and is named in tests/test_records.py's list of figures awaiting a rerun: the debt stays
  visible until a run records it.
- The README's figures rows that come from records (`README_ROWS`) are rewritten by `python -m
  devtools.docs_hooks` and checked at each build; docs/index.md shows the README's table.

Never imported by the service; it only reads records, never writes them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import record

TABLE_MARKER = re.compile(r"^<!-- table: bench/records/(?P<folder>\w+) -->$", re.MULTILINE)
AWAITING_MARKER = "<!-- awaiting a rerun -->"
AWAITING_NOTE = "*These figures predate the benches' run records; they stay until a rerun records them.*"
INDEX_MARKER = "<!-- the README's figures -->"
FIGURES_HEADING = "## Figures"
RECORDED = "run records"
"""The README's `from` cell of a row built from records; an awaiting row says `awaiting a rerun`."""


class FiguresError(Exception):
    """A table cannot be built: no records, records from two machines, a marker naming no known bench."""


def one_machine(records: Sequence[record.Record]) -> record.Machine:
    machines = {run.machine for run in records}
    if len(machines) != 1:
        described = "; ".join(sorted(machine.describe() for machine in machines)) or "none"
        raise FiguresError(f"one machine per table: the records of {records_folder(records)} name {described}")
    return machines.pop()


def records_folder(records: Sequence[record.Record]) -> str:
    return f"bench/records/{records[0].folder}/" if records else "no records"


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


TABLES: dict[str, Callable[[Sequence[record.Record]], str]] = {"node_burst": node_burst_table}
"""The benches whose pages' tables are built from records, by records folder."""


def fill_tables(markdown: str, root: Path = record.RECORDS) -> str:
    """A page with every table marker replaced by its table, and every awaiting marker by its note."""

    def table(found: re.Match[str]) -> str:
        folder = found["folder"]
        if folder not in TABLES:
            raise FiguresError(f"no table is built from bench/records/{folder} (bench/figures.py's TABLES)")
        records = record.load(folder, root)
        if not records:
            raise FiguresError(f"a published figure with no record: bench/records/{folder}/ is empty")
        return TABLES[folder](records)

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


README_ROWS: dict[str, Callable[[], tuple[str, ...]]] = {"node_burst": burst_row}
"""The README's rows built from records, by records folder."""


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
    for build in README_ROWS.values():
        cells = build()
        lines = [line for line in readme_table(readme) if line.startswith(f"| {cells[0]} |")]
        if len(lines) != 1:
            raise FiguresError(f"README.md's figures have {len(lines)} rows {cells[0]!r}: keep one, then run again")
        readme = readme.replace(lines[0], row_line(cells))
    return readme


def stale_readme_rows(readme: str) -> list[str]:
    """The README's rows from records that differ from what the records give."""
    table = readme_table(readme)
    return [cells[0] for build in README_ROWS.values() if row_line(cells := build()) not in table]


def readme_table_for_site(readme: str) -> str:
    """The README's figures table as docs/index.md shows it: links relative to docs/."""
    return "\n".join(readme_table(readme)).replace("](docs/", "](")
