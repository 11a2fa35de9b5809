"""What every table of figures built from run records shares: its error, the one machine its records ran on,
and the words for where its figures come from (bench/figures.py, bench/figures_placement.py)."""

from __future__ import annotations

from collections.abc import Sequence

from bench import record

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


def joined(values: Sequence[int | float]) -> str:
    """The distinct values of a setting over the records, in order: `1,000` or `1,000 or 5,000`."""
    distinct = sorted(set(values))
    return " or ".join(f"{value:,}" if isinstance(value, int) else f"{value:g}" for value in distinct)


def runs_said(records: Sequence[record.Record]) -> str:
    """Where the figures come from, and how busy the machine was while they were measured (where recorded)."""
    where = (
        f"its run record in `{records_folder(records)}`"
        if len(records) == 1
        else f"{len(records)} run records in `{records_folder(records)}`"
    )
    return where + load_said(records)


def load_said(records: Sequence[record.Record]) -> str:
    """`; the machine's load average (1 minute) 0.4 to 6.7 at the runs' starts and ends`, from the records that
    kept it ("" when none did): on two cores, what else ran beside a bench moves its figures."""
    loads = [values[0] for kept in records for values in kept.load.values() if values]
    if not loads:
        return ""
    low, high = min(loads), max(loads)
    span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f} to {high:.1f}"
    return f"; the machine's load average (1 minute) {span} at the runs' starts and ends"
