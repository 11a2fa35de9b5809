"""`python -m devtools.mutation` (`make mutation`): mutmut over the core's busiest modules, the share of mutants killed.

A test suite that passes says nothing of the lines it never looks at. mutmut changes one operator, constant or
call at a time (a mutant) and runs the tests that reach the changed function: a mutant they still pass is a line
no test guards. Each area below is mutated in a copy of the tree (mutmut writes its `mutants/` tree beside the
sources, and the tree under /work is shared), against the tests of its area only, so one mutant takes seconds.

A survivor is either killed by a new test or, when no behaviour can tell it apart from the original (a default
that is always overridden, a bound that a guard above already enforces), listed in `mutation_equivalents.toml`
beside this file with the reason; an entry names the mutant and the mutated line, and lapses when that line no
longer matches, so an edited function is judged afresh. The share is killed over mutants less equivalents; the
command fails when an area is under `--threshold`. Never part of `make test`: minutes, not seconds.

Each run keeps every mutant's outcome in ~/.cache/gpu-extender/mutation/AREA.json, with mutmut's hash of each
mutated function; after writing tests for the survivors, `--recheck` runs those alone (the others keep their
outcome), in minutes, and with them every mutant the record does not judge: of a function new or changed since (its
hash differs: mutmut numbers a function's mutants afresh, so an earlier outcome under the same name was another
mutant's), or never run. A full run is the record.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.cluster.layout import cache_root

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = Path(__file__).resolve().parent / "mutation_equivalents.toml"


@dataclass(frozen=True, slots=True)
class Area:
    """Sources mutated together and the tests run against them (mutmut picks, per mutant, those that reach it)."""

    name: str
    sources: tuple[str, ...]
    tests: tuple[str, ...]


CORE_TESTS = ("tests/core", "tests/reference")
"""The core's unit tests and its independent references (where present): mutmut runs a mutant against those that
reach its function, fastest first, and stops at the first failure, so a mutant takes seconds."""
PROPERTY_TESTS = "tests/property"
"""The stateful property tests: 20 to 30 s each, and every mutant they reach that nothing faster killed runs them,
so only with `--with-properties`."""

AREAS = (
    Area("ledger", ("extender/core/ledger.py",), CORE_TESTS),
    Area("mig", ("extender/core/mig.py",), CORE_TESTS),
    Area("placement", ("extender/core/placement/*.py",), CORE_TESTS),
    Area("protocols", ("extender/core/protocols/*.py",), CORE_TESTS),
)

KILLED = {
    1: "killed",
    3: "killed",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -9: "segfault",
    -11: "segfault",
}
"""mutmut's exit codes (mutmut/stats.py) that count as killed: a test failed, pytest broke, the run timed out (a
mutant that loops forever is caught, if slowly), or the tests' process died of a signal (mutmut's "segfault":
SIGSEGV, or SIGKILL past the hard CPU limit or out of memory, as arrays.py's rows grown at every new node were).
0 is a survivor, 5 and 33 mean no test reached the mutant."""


@dataclass(frozen=True, slots=True)
class Equivalent:
    mutant: str
    line: str
    why: str


@dataclass
class Tally:
    """One source file's mutants by outcome."""

    path: str
    outcomes: Counter[str] = field(default_factory=Counter)
    survivors: list[str] = field(default_factory=list)

    @property
    def judged(self) -> int:
        return sum(self.outcomes.values()) - self.outcomes["equivalent"]

    @property
    def killed(self) -> int:
        return self.outcomes["killed"]


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, Equivalent]:
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", []) if path.exists() else []
    return {e["mutant"]: Equivalent(e["mutant"], e["line"].strip(), e["why"]) for e in entries}


def copy_tree(
    work: Path, area: Area, properties: bool = False, committed: bool = False, tests: tuple[str, ...] = ()
) -> None:
    """The package, the tests and pyproject.toml with a `[tool.mutmut]` table for this area, into `work`: as the
    working tree has them, or with `committed` as HEAD does (what others are editing meanwhile left out)."""
    if committed:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", "HEAD", "extender", "tests"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    else:
        ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", ".pytest_cache", "*.pyc")
        for name in ("extender", "tests"):
            shutil.copytree(ROOT / name, work / name, ignore=ignore)
    chosen = tests or (*area.tests, *([PROPERTY_TESTS] if properties else []))
    selection = [t for t in chosen if (work / t).exists()]
    table = [
        "",
        "[tool.mutmut]",
        'source_paths = ["extender"]',
        f"only_mutate = {json.dumps(list(area.sources))}",
        f"pytest_add_cli_args_test_selection = {json.dumps(selection)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]',
        # Each mutant's run forks from a process that has only collected the tests: forked from mutmut's own
        # process instead, it would inherit the lru_caches (mig._choice, ...) that the unmutated run filled.
        'process_isolation = "forkserver"',
    ]
    text = (
        subprocess.run(
            ["git", "show", "HEAD:pyproject.toml"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        if committed
        else (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    )
    (work / "pyproject.toml").write_text(text + "\n".join(table) + "\n", encoding="utf-8")


def mutmut(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "mutmut"), *args]
    return subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)


DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps({name: get_diff_for_mutant(name) for name in sys.argv[1:]}))
"""
"""`mutmut show` for many mutants in one process (each `mutmut show` parses the module afresh)."""


def diffs(work: Path, mutants: list[str]) -> dict[str, str]:
    if not mutants:
        return {}
    run = subprocess.run([sys.executable, "-c", DIFFS, *mutants], cwd=work, capture_output=True, text=True, check=True)
    found: dict[str, str] = json.loads(run.stdout)
    return found


def mutated_line(diff: str) -> str:
    """The first added line of mutmut's diff of a mutant, stripped: what an equivalent entry names."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


Codes = dict[str, dict[str, int | None]]
"""mutmut's exit code per mutant, per mutated file (`extender/core/mig.py`): None when not run."""
Hashes = dict[str, dict[str, str]]
"""mutmut's hash of each mutated function's source (`xǁLedgerǁreserve`), per mutated file."""


@dataclass(frozen=True, slots=True)
class Record:
    """What a run leaves for the next `--recheck`: each mutant's outcome, and the functions' hashes it judged."""

    codes: Codes
    hashes: Hashes


def read_codes(work: Path) -> Codes:
    return {path: meta["exit_code_by_key"] for path, meta in _metas(work).items() if meta["exit_code_by_key"]}


def read_hashes(work: Path) -> Hashes:
    return {path: meta.get("hash_by_function_name", {}) for path, meta in _metas(work).items()}


def _metas(work: Path) -> dict[str, dict[str, Any]]:
    """mutmut's record of each mutated file (its `.meta`), by the file's path in the tree."""
    return {
        str(meta.relative_to(work / "mutants")).removesuffix(".meta"): json.loads(meta.read_text(encoding="utf-8"))
        for meta in sorted((work / "mutants").rglob("*.py.meta"))
    }


def function_of(mutant: str) -> str:
    """The mutated function of a mutant, as mutmut keys its hash: `xǁLedgerǁreserve` of
    `extender.core.ledger.xǁLedgerǁreserve__mutmut_3`."""
    return mutant.rpartition("__mutmut_")[0].rpartition(".")[2]


GENERATE = """
from mutmut.__main__ import (copy_also_copy_files, copy_src_dir, create_mutants, set_mutant_under_test,
    setup_source_paths, store_lines_covered_by_tests)
set_mutant_under_test("mutant_generation")
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); store_lines_covered_by_tests(); create_mutants(1)
"""
"""The first step of `mutmut run` alone (mutmut/__main__.py `_run`): the mutants of the tree, none run, so that a
recheck knows them before it names those to run."""


def generate(work: Path) -> Record:
    """The tree's mutants (outcomes all None) and its functions' hashes."""
    subprocess.run([sys.executable, "-c", GENERATE], cwd=work, capture_output=True, text=True, check=True)
    return Record(read_codes(work), read_hashes(work))


def unjudged(previous: Record, tree: Record) -> list[str]:
    """The tree's mutants whose outcome the record does not hold: never run, or of a function that came or changed
    since (mutmut's hash of it differs; a record without hashes, written before they were kept, says nothing of
    changes)."""
    found = []
    for path, by_mutant in tree.codes.items():
        before, hashes_before = previous.codes.get(path, {}), previous.hashes.get(path)
        hashes = tree.hashes.get(path, {})
        for mutant in by_mutant:
            function = function_of(mutant)
            changed = hashes_before is not None and hashes_before.get(function) != hashes.get(function)
            if before.get(mutant) is None or changed:
                found.append(mutant)
    return found


def results_file(area: Area) -> Path:
    """Where an area's last outcomes are kept, for `--recheck`."""
    return cache_root() / "mutation" / f"{area.name}.json"


def load_record(path: Path) -> Record:
    """A run's record; one written before hashes were kept is its outcomes alone."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if set(data) == {"codes", "hashes"}:
        return Record(data["codes"], data["hashes"])
    return Record(data, {})


def save_record(path: Path, record: Record) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"codes": record.codes, "hashes": record.hashes}, indent=1, sort_keys=True)
    path.write_text(text, encoding="utf-8")


def tally(codes: Codes, diff_of: dict[str, str], equivalents: dict[str, Equivalent], stale: list[str]) -> list[Tally]:
    """Each mutated file's outcomes."""
    tallies = []
    for path, by_mutant in codes.items():
        result = Tally(path)
        for mutant, code in sorted(by_mutant.items()):
            if code in KILLED:
                result.outcomes["killed"] += 1
                continue
            listed = equivalents.get(mutant)
            if listed is not None:
                if mutated_line(diff_of[mutant]) == listed.line:
                    result.outcomes["equivalent"] += 1
                    continue
                stale.append(mutant)
            result.outcomes["no tests" if code in (5, 33) else "survived" if code == 0 else f"exit {code}"] += 1
            result.survivors.append(mutant)
        tallies.append(result)
    return tallies


def share(killed: int, judged: int) -> float:
    return 100.0 * killed / judged if judged else 100.0


FAILURE_LINES = 60
"""Lines of mutmut's output shown when it fails (its stats step's pytest output, typically)."""


def failure_text(output: str) -> str:
    """The end of mutmut's output without its progress frames: it redraws a spinner line (braille characters)
    with carriage returns many times a second, so the last few kilobytes of a failed run were spinner alone and
    hid the pytest failure that stopped it."""
    lines = [line.rstrip() for chunk in output.split("\n") for line in chunk.split("\r")]
    kept = [line for line in lines if line.strip() and not ("\u2800" <= line.lstrip()[0] <= "\u28ff")]
    return "\n".join(kept[-FAILURE_LINES:])


def report(area: Area, codes: Codes, diff_of: dict[str, str], equivalents: dict[str, Equivalent], took: str) -> float:
    """Print the area's share killed, per file, and each survivor's diff; returns the share."""
    stale: list[str] = []
    tallies = tally(codes, diff_of, equivalents, stale)
    killed = sum(t.killed for t in tallies)
    judged = sum(t.judged for t in tallies)
    print(f"\n{area.name}: {share(killed, judged):.1f} % killed ({killed} of {judged}), {took}")
    for t in tallies:
        rest = ", ".join(f"{n} {k}" for k, n in sorted(t.outcomes.items()) if k != "killed")
        print(f"  {t.path}: {share(t.killed, t.judged):.1f} % ({t.killed} of {t.judged}{'; ' + rest if rest else ''})")
    for mutant in stale:
        print(f"  listed as equivalent but its line changed, judged afresh: {mutant}")
    for t in tallies:
        for mutant in t.survivors:
            print(f"# {mutant}\n{diff_of[mutant]}")
    return share(killed, judged)


def merged(previous: Codes, fresh: Codes, rechecked: set[str], stale: frozenset[str] = frozenset()) -> Codes:
    """The mutants of the tree now, each with its outcome of this run where it ran, else its earlier one unless
    that is `stale` (its function changed since). One that has neither (left out by `--only`) is counted alive, and
    said."""
    codes: Codes = {}
    unrun = 0
    for path, by_mutant in fresh.items():
        before = previous.get(path, {})
        codes[path] = {}
        for mutant, code in by_mutant.items():
            if mutant not in rechecked and mutant not in stale and mutant in before:
                code = before[mutant]
            unrun += code is None
            codes[path][mutant] = code
    if unrun:
        print(f"{unrun} mutants were never run (new or changed since the last run, and left out by --only)")
    return codes


def run_area(
    area: Area,
    children: int,
    equivalents: dict[str, Equivalent],
    keep: bool,
    recheck: bool,
    only: str = "*",
    properties: bool = False,
    committed: bool = False,
    tests: tuple[str, ...] = (),
) -> tuple[float, str]:
    """Mutate one area in a fresh copy (with `recheck`, only the mutants its last run left alive or does not judge,
    the others keeping their outcome; with `only`, those whose name matches it); print the report; its share and
    the copy's path."""
    previous = Record({}, {})
    if recheck:
        if not results_file(area).exists():
            print(f"{area.name}: no earlier run to recheck ({results_file(area)})")
            return 0.0, ""
        previous = load_record(results_file(area))
    work = Path(tempfile.mkdtemp(prefix=f"mutation-{area.name}-"))
    started = time.monotonic()
    try:
        copy_tree(work, area, properties, committed, tests)
        chosen: list[str] = []
        stale: frozenset[str] = frozenset()
        if recheck:
            tree = generate(work)
            stale = frozenset(unjudged(previous, tree))
            chosen = [
                m
                for path, by_mutant in tree.codes.items()
                for m in by_mutant
                if (m in stale or previous.codes.get(path, {}).get(m) not in KILLED) and fnmatch.fnmatchcase(m, only)
            ]
            if not chosen:
                codes = merged(previous.codes, tree.codes, set(), stale)
                return report(area, codes, diffs(work, alive_in(codes)), equivalents, "nothing to recheck"), ""
        run = mutmut(work, "run", "--max-children", str(children), *chosen)
        elapsed = time.monotonic() - started
        if run.returncode != 0 or not (work / "mutants").exists():
            print(f"{area.name}: mutmut failed ({run.returncode}):\n{failure_text(run.stdout + run.stderr)}")
            return 0.0, str(work)
        codes = read_codes(work)
        if recheck:
            codes = merged(previous.codes, codes, set(chosen), stale)
        save_record(results_file(area), Record(codes, read_hashes(work)))
        took = f"{elapsed:.0f} s" + (f" rechecking {len(chosen)}" if recheck else "")
        return report(area, codes, diffs(work, alive_in(codes)), equivalents, took), str(work)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def alive_in(codes: Codes) -> list[str]:
    return [m for by_mutant in codes.values() for m, code in by_mutant.items() if code not in KILLED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("areas", nargs="*", help=f"of {', '.join(a.name for a in AREAS)}; default: all")
    parser.add_argument("--max-children", type=int, default=2, help="mutants run at once")
    parser.add_argument("--threshold", type=float, default=90.0, help="least share killed, in percent")
    parser.add_argument("--keep", action="store_true", help="keep each area's copy (mutmut show/browse there)")
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="run only what the last run left alive or did not judge (after new tests): minutes",
    )
    parser.add_argument("--with-properties", action="store_true", help=f"also run {PROPERTY_TESTS} (slow)")
    parser.add_argument("--committed", action="store_true", help="mutate HEAD, not the working tree")
    parser.add_argument("--tests", nargs="+", default=(), help="these tests instead of the area's (tests/core ...)")
    parser.add_argument(
        "--only", default="*", help="with --recheck, the survivors whose name matches this pattern (*fit.x__refusal*)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.areas) - {a.name for a in AREAS}
    if unknown:
        parser.error(f"no such area: {', '.join(sorted(unknown))}")
    chosen = [a for a in AREAS if not args.areas or a.name in args.areas]
    equivalents = load_equivalents()
    shares = {}
    for area in chosen:
        shares[area.name], work = run_area(
            area,
            args.max_children,
            equivalents,
            args.keep,
            args.recheck,
            args.only,
            args.with_properties,
            args.committed,
            tuple(args.tests),
        )
        if args.keep:
            print(f"  kept: {work}")
    print("\n" + "  ".join(f"{name} {value:.1f} %" for name, value in shares.items()))
    below = [name for name, value in shares.items() if value < args.threshold]
    if below:
        print(f"under {args.threshold:.0f} % killed: {', '.join(below)}", file=sys.stderr)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
