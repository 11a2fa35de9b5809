"""Run records: what one run of a bench measured and what it ran on, one JSON file per run, so that every figure
the docs and the README publish can be traced to the run that produced it, and generated from it.

A record holds the command, the commit (and whether the working tree differed from it), the machine as the bench
sees it (CPU model, cores, Python), the settings the bench ran with, its results as data and the report it
printed. devtools/docs_hooks.py builds the pages' tables from them when the site is built; tests/test_records.py
fails when a published figure has neither a record nor a place on the list of figures awaiting a rerun.

Where they live, `bench/records/<bench>/`: beside the benches that write them and read by the docs' hook. Not
under docs/, which MkDocs publishes file by file: a record carries a run's date, commit and machine, bookkeeping
that no page for users shows (the pages show what was measured, how, and on what kind of machine). Not at the
repository's root, which is the front door. A page's table pools every record in its bench's folder, so replacing
a figure is one commit that adds the new run's record and removes (`git rm`) the records it replaces; git keeps the
old ones.

JSON, not YAML: the standard library reads and writes it, and a record is written by a program, not a person.

A bench writes one when given `--record DIR` (`add_option`); its `__main__` runs through `run`, which tees what
the bench prints into the record and writes it however the run ends. Nothing is written by default, so the
suite's smoke runs of the benches leave the tree alone. A record imported from a run's raw output (a run from
before benches wrote records) says so in `source`. Never imported by the service.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from devtools.harness import cpu_model

RECORDS = Path(__file__).resolve().parent / "records"
"""The repository's records: one folder per bench (`RECORDS / "node_burst"`)."""
FORMAT = 1
"""The record's layout; a reader refuses a record of another."""


class RecordError(Exception):
    """A record cannot be read: not JSON, another format, a field missing."""


@dataclass(frozen=True, slots=True)
class Machine:
    """The machine as the bench sees it: enough to tell two machines apart, nothing that names one."""

    cpu: str
    """The CPU model, as /proc/cpuinfo names it."""
    cores: int
    """The cores the process may use."""
    python: str
    """Version and implementation: `3.11.7 (CPython)`."""

    def describe(self) -> str:
        return f"{self.cpu}, {self.cores} cores, Python {self.python}"


def this_machine() -> Machine:
    model = cpu_model()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return Machine(model, cores, f"{platform.python_version()} ({platform.python_implementation()})")


def this_commit(root: Path = RECORDS.parent.parent) -> tuple[str | None, bool | None]:
    """The commit the code ran from, and whether tracked files differed from it (None, None outside git)."""
    try:
        head = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head, bool(status)


def _git(root: Path, *arguments: str) -> str:
    return subprocess.run(["git", *arguments], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@dataclass(frozen=True, slots=True)
class Record:
    bench: str
    """The bench's module, `bench.node_burst`; its folder is the name after the dot."""
    command: str
    commit: str | None
    """None when the run did not know it (an imported record says what is known in `notes`)."""
    dirty: bool | None
    """Tracked files differed from `commit` when the run began."""
    started: str
    """UTC, ISO 8601."""
    machine: Machine
    settings: dict[str, Any]
    results: dict[str, Any]
    exit_status: int | None
    report: str = ""
    """What the bench printed to its standard output."""
    source: str | None = None
    """For a record imported from a run's raw output: that output's path, and the importer."""
    notes: tuple[str, ...] = ()
    load: dict[str, list[float]] = field(default_factory=dict)
    """The machine's load averages (1, 5 and 15 minutes) when the run began and ended (`os.getloadavg`): what else
    ran beside it, which a page may show next to the figures; empty in records from before it was kept."""

    @property
    def folder(self) -> str:
        return self.bench.rsplit(".", 1)[-1]

    def to_json(self) -> bytes:
        body = {"format": FORMAT, **dataclasses.asdict(self), "notes": list(self.notes)}
        return orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str) + b"\n"

    @classmethod
    def from_json(cls, data: bytes, where: str = "a record") -> Record:
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as error:
            raise RecordError(f"{where}: not JSON ({error})") from None
        if not isinstance(body, dict) or body.pop("format", None) != FORMAT:
            raise RecordError(f"{where}: not a record of format {FORMAT}")
        try:
            machine = Machine(**body.pop("machine"))
            notes = tuple(body.pop("notes", ()))
            return cls(**body, machine=machine, notes=notes)
        except (KeyError, TypeError) as error:
            raise RecordError(f"{where}: {error}") from None


def load(folder: str, root: Path = RECORDS) -> list[Record]:
    """Every record of one bench's folder, oldest first."""
    records = [Record.from_json(path.read_bytes(), str(path)) for path in sorted((root / folder).glob("*.json"))]
    return sorted(records, key=lambda record: record.started)


def write(record: Record, root: Path, label: str = "") -> Path:
    """The record as a new file `root/<bench>/<UTC start>[-label].json`; never over another."""
    folder = root / record.folder
    folder.mkdir(parents=True, exist_ok=True)
    stem = datetime.datetime.fromisoformat(record.started).strftime("%Y%m%dT%H%M%SZ") + (f"-{label}" if label else "")
    path, number = folder / f"{stem}.json", 1
    while path.exists():
        number += 1
        path = folder / f"{stem}-{number}.json"
    path.write_bytes(record.to_json())
    return path


# ---- what a bench calls -------------------------------------------------------------------------------------


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        metavar="DIR",
        type=Path,
        help="Write this run's record (command, commit, machine, settings, results) under DIR/<bench>/; "
        "the repository's records are bench/records (the docs' tables are built from them).",
    )


@dataclass(slots=True)
class Recorder:
    """What one run has said so far: its settings and results, as the bench hands them over."""

    settings: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)


_current: Recorder | None = None


def settings(arguments: argparse.Namespace | dict[str, Any], **more: Any) -> None:
    """The run's settings: its parsed arguments (every default resolved) and anything else it ran with. Does
    nothing when no record is being written."""
    if _current is not None:
        given = vars(arguments) if isinstance(arguments, argparse.Namespace) else dict(arguments)
        given.pop("record", None)
        _current.settings.update(_plain(given), **_plain(more))


def result(name: str, value: Any) -> None:
    """One of the run's results, as data (dataclasses become dicts). Does nothing when no record is written."""
    if _current is not None:
        _current.results[name] = _plain(value)


def _plain(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def _recording() -> Iterator[tuple[Recorder, io.StringIO]]:
    global _current
    report = io.StringIO()
    recorder = Recorder()
    _current, stdout = recorder, sys.stdout
    sys.stdout = _Tee(stdout, report)
    try:
        yield recorder, report
    finally:
        sys.stdout, _current = stdout, None


def run(main: Callable[[list[str]], int], bench: str, argv: Sequence[str] | None = None) -> int:
    """A bench's `__main__`: `sys.exit(record.run(main, "bench.node_burst"))`. With `--record DIR`, the run's
    record is written under DIR when main returns or raises (a failed run is evidence too: its exit status says
    so)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    known, _ = _record_parser().parse_known_args(argv)
    if known.record is None:
        with _stopped_by_signals():
            return main(argv)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load_before = _load()
    commit, dirty = this_commit()
    status: int | None = None
    with _recording() as (recorder, report), _stopped_by_signals():
        try:
            status = main(argv)
        except SystemExit as error:
            status = error.code if isinstance(error.code, int) else 1
            raise
        finally:
            record = Record(
                bench=bench,
                command=shlex.join(["python", "-m", bench, *argv]),
                commit=commit,
                dirty=dirty,
                started=started,
                machine=this_machine(),
                settings=recorder.settings,
                results=recorder.results,
                exit_status=status,
                report=report.getvalue(),
                load={"start": load_before, "end": _load()},
            )
            path = write(record, known.record)
            print(f"record: {path}", file=sys.stderr)
    return status


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGINT end the run as an exit would (SystemExit 128 + the signal): every `finally` stops the
    processes it started, and the record is written with what the run finished. A replay of hours is stopped with
    `kill`, and a bench started in the background by a non-interactive shell ignores SIGINT (POSIX), which Python
    would not otherwise turn into KeyboardInterrupt. The handlers before are put back after (only the main thread
    may set them: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number: int, frame: object) -> None:
        raise SystemExit(128 + number)

    before = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _load() -> list[float]:
    """The load averages now, rounded to hundredths ([] where the system has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return []


def _record_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    add_option(parser)
    return parser
