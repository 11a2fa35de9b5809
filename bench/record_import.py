"""`python -m bench.record_import node_burst OUT ERR --command CMD`: a run record built from the raw output of a run
of `bench.node_burst` from before the benches wrote records, so the figures published from that run are
generated from a record as well, and the record says where it came from (`source`).

Only what the output holds goes into the record: the per-run lines of its table (figures as printed, to two
decimals), the machine line of its standard error, the problems it reported. What the output does not hold stays
out: each pod's seconds to Running (`to_running`: null), and the commit, which the record leaves null and names
in a note as the commit HEAD was at when the output was last written (the run used the working tree then).
Never used to type figures in: its input is a file a bench wrote.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import record

ROW = re.compile(r"^\| (?P<scheduler>[\w-]+) \| (?P<protocol>\w+) \| (?P<run>\d+) \| (?P<cells>.+) \|$")
"""A run's line of bench.node_burst's table (`run_line`)."""
COLUMNS = ("pods", "create_seconds", "all_bound", "all_running", "p50", "p90", "failed_scheduling", "load", "check")
"""The cells after scheduler, protocol and run, in `run_line`'s order (an older output lacks `load`)."""
MACHINE = re.compile(r"^machine: (?P<cpu>.+), (?P<cores>\d+) cores, Python (?P<python>[^;]+)")
PROBLEM = re.compile(r"^- (?P<scheduler>[\w-]+), run (?P<run>\d+): (?P<problem>.+)$")


class NotItsOutput(Exception):
    """The output is not one bench.node_burst printed."""


def node_burst_runs(out: str) -> list[dict[str, Any]]:
    """Each run's line of the output's table, as `bench.node_burst.as_record` holds a run."""
    lines = out.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith("| scheduler | protocol | run |")), None)
    if start is None:
        raise NotItsOutput("no table of runs in the output")
    header = lines[start]
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append(line)
    has_load = "| load |" in header
    columns = [column for column in COLUMNS if has_load or column != "load"]
    problems: dict[tuple[str, int], list[str]] = {}
    for line in out.splitlines():
        if found := PROBLEM.match(line):
            problems.setdefault((found["scheduler"], int(found["run"])), []).append(found["problem"])
    runs = []
    for line in table:
        found = ROW.match(line)
        if not found:
            raise NotItsOutput(f"not a run's line: {line!r}")
        cells = dict(zip(columns, (cell.strip() for cell in found["cells"].split("|")), strict=True))
        key = (found["scheduler"], int(found["run"]))
        runs.append(
            {
                "scheduler": key[0],
                "protocol": found["protocol"],
                "run": key[1],
                "pods": int(cells["pods"]),
                **{name: float(cells[name]) for name in ("create_seconds", "all_bound", "all_running", "p50", "p90")},
                "failed_scheduling": int(cells["failed_scheduling"]),
                "load": float(cells["load"]) if has_load else None,
                "problems": problems.get(key, []) if cells["check"] != "passed" else [],
                "to_running": None,
            }
        )
    if not runs:
        raise NotItsOutput("the table of runs has no run")
    return runs


def node_burst_machine(err: str) -> record.Machine:
    found = next((match for line in err.splitlines() if (match := MACHINE.match(line))), None)
    if found is None:
        raise NotItsOutput("no `machine:` line in the standard error")
    return record.Machine(found["cpu"], int(found["cores"]), found["python"].strip())


def node_burst_settings(command: str, out: str) -> dict[str, Any]:
    """What the command and the report's heading say the run ran with."""
    words = command.split()
    settings: dict[str, Any] = {"protocol": words[words.index("--protocol") + 1] if "--protocol" in words else None}
    settings["runs"] = int(words[words.index("--runs") + 1]) if "--runs" in words else 3
    settings["peer"] = words[words.index("--peer") + 1] if "--peer" in words else None
    if found := re.search(r"kubelet (v[\d.]+)", out):
        settings["kubelet"] = found[1]
    if found := re.search(r"Node: (\d+) GPUs x (\d+) GiB, pods of (\d+) MiB", out):
        settings.update(gpus=int(found[1]), gpu_mib=int(found[2]) * 1024, pod_mib=int(found[3]))
    return settings


def head_at(moment: datetime.datetime, root: Path) -> str:
    """The commit HEAD was at, at `moment`: the newest commit made no later."""
    return subprocess.run(
        ["git", "log", "-1", "--format=%H", f"--before={moment.isoformat()}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def node_burst(out_path: Path, err_path: Path, command: str, root: Path) -> record.Record:
    out, err = out_path.read_text(), err_path.read_text()
    written = datetime.datetime.fromtimestamp(out_path.stat().st_mtime, datetime.UTC).replace(microsecond=0)
    runs = node_burst_runs(out)
    status = re.search(r"^rc=(\d+)$", out, re.MULTILINE)
    return record.Record(
        bench="bench.node_burst",
        command=command,
        commit=None,
        dirty=None,
        started=written.isoformat(),
        machine=node_burst_machine(err),
        settings=node_burst_settings(command, out),
        results={"runs": runs, "failures": [problem for run in runs for problem in run["problems"]]},
        exit_status=int(status[1]) if status else None,
        report=out,
        source=f"{out_path} and {err_path}, imported by bench/record_import.py",
        notes=(
            "Imported from the run's raw output: the run predates the benches' records. `started` is when the "
            "output was last written (the run's end); the output names no commit: HEAD was "
            f"{head_at(written, root)} then, and the run used the working tree.",
            "`to_running` (each pod's seconds) is not in the output: the runs' p50 and p90 are as it printed them.",
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.record_import", description=__doc__.split("\n", 1)[0])
    parser.add_argument("bench", choices=["node_burst"])
    parser.add_argument("out", type=Path, help="The run's standard output.")
    parser.add_argument("err", type=Path, help="The run's standard error.")
    parser.add_argument("--command", required=True, help="The command the run was, as it was typed.")
    parser.add_argument("--label", default="", help="Appended to the record's file name.")
    parser.add_argument("--records", type=Path, default=record.RECORDS)
    arguments = parser.parse_args(argv)
    try:
        imported = node_burst(arguments.out, arguments.err, arguments.command, record.RECORDS.parent.parent)
    except (OSError, NotItsOutput) as error:
        print(f"record_import: {error}", file=sys.stderr)
        return 1
    print(record.write(imported, arguments.records, arguments.label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
