"""devtools/mutation.py (`make mutation`): how mutmut's outcomes are counted, how an equivalent is recognised and
when its entry lapses, and that every listed equivalent names a module the run mutates. mutmut itself is not run
here (a run takes minutes); its outcomes are given as its meta files hold them."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import mutation
from devtools.mutation import AREAS, Equivalent, Record, load_equivalents, mutated_line, share, tally, unjudged

DIFF = """--- extender/core/mig.py
+++ extender/core/mig.py
@@ -1,3 +1,3 @@
 def f(a: int) -> bool:
-    return a > 0
+    return a >= 0
"""


def test_the_mutated_line_is_the_first_added_one_stripped() -> None:
    assert mutated_line(DIFF) == "return a >= 0"
    assert mutated_line("--- a\n+++ b\n") == ""


def test_outcomes_are_counted_killed_survived_untested_and_equivalent_while_its_line_still_matches() -> None:
    codes: mutation.Codes = {
        "extender/core/mig.py": {
            "m.x_f__mutmut_1": 1,  # a test failed
            "m.x_f__mutmut_2": 36,  # timed out: counted killed
            "m.x_f__mutmut_7": -9,  # the tests' process killed (out of memory, past the CPU limit): counted killed
            "m.x_f__mutmut_3": 0,  # survived
            "m.x_f__mutmut_4": 33,  # no test reached it
            "m.x_f__mutmut_5": 0,  # listed, line matches
            "m.x_f__mutmut_6": 0,  # listed, line changed since
        }
    }
    diff_of = {name: DIFF for name in codes["extender/core/mig.py"]}
    diff_of["m.x_f__mutmut_6"] = DIFF.replace(">= 0", ">= 1")
    listed = {name: Equivalent(name, "return a >= 0", "why") for name in ("m.x_f__mutmut_5", "m.x_f__mutmut_6")}
    stale: list[str] = []
    [counted] = tally(codes, diff_of, listed, stale)
    assert dict(counted.outcomes) == {"killed": 3, "survived": 2, "no tests": 1, "equivalent": 1}
    assert counted.judged == 6 and counted.killed == 3
    assert counted.survivors == ["m.x_f__mutmut_3", "m.x_f__mutmut_4", "m.x_f__mutmut_6"]
    assert stale == ["m.x_f__mutmut_6"]
    assert share(2, 5) == 40.0 and share(0, 0) == 100.0


def test_every_listed_equivalent_says_why_and_names_a_function_of_a_mutated_module() -> None:
    root = Path(mutation.__file__).resolve().parent.parent
    modules = {
        str(path.relative_to(root).with_suffix("")).replace("/", ".")
        for area in AREAS
        for pattern in area.sources
        for path in root.glob(pattern)
    }
    listed = load_equivalents()
    assert listed
    for name, entry in listed.items():
        module, _, mangled = name.rpartition(".")
        assert module in modules, name
        assert "__mutmut_" in mangled and entry.line and len(entry.why) > 20, name
        function = mangled.split("__mutmut_")[0].split("ǁ")[-1].removeprefix("x_")  # x_f, xǁClassǁf
        source = (root / module.replace(".", "/")).with_suffix(".py").read_text()
        assert f"def {function}(" in source, name


def test_a_recheck_keeps_earlier_outcomes_takes_its_own_and_drops_those_of_a_changed_function(
    capsys: pytest.CaptureFixture[str],
) -> None:
    previous: mutation.Codes = {
        "extender/core/mig.py": {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": 0, "m.x_h__mutmut_1": 1}
    }
    fresh: mutation.Codes = {
        "extender/core/mig.py": {
            "m.x_f__mutmut_1": None,
            "m.x_f__mutmut_2": 1,  # rechecked: killed now
            "m.x_g__mutmut_1": None,  # new, left out by --only
            "m.x_h__mutmut_1": None,  # its function changed, left out by --only: the earlier outcome was another's
        }
    }
    stale = frozenset({"m.x_g__mutmut_1", "m.x_h__mutmut_1"})
    codes = mutation.merged(previous, fresh, {"m.x_f__mutmut_2"}, stale)
    assert codes == {
        "extender/core/mig.py": {
            "m.x_f__mutmut_1": 1,
            "m.x_f__mutmut_2": 1,
            "m.x_g__mutmut_1": None,
            "m.x_h__mutmut_1": None,
        }
    }
    assert "2 mutants were never run" in capsys.readouterr().out


def test_a_record_does_not_judge_mutants_never_run_new_or_of_a_function_changed_since() -> None:
    """mutmut numbers a function's mutants afresh when it changes: an earlier outcome under the same name was
    another mutant's. fit.py's 126 mutants left unrun by rechecks after its functions changed came from this."""
    previous = Record(
        {"a.py": {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": None, "m.xǁCǁg__mutmut_1": 0}},
        {"a.py": {"x_f": "11", "xǁCǁg": "22"}},
    )
    tree = Record(
        {"a.py": dict.fromkeys(["m.x_f__mutmut_1", "m.x_f__mutmut_2", "m.xǁCǁg__mutmut_1", "m.x_k__mutmut_1"])},
        {"a.py": {"x_f": "11", "xǁCǁg": "23", "x_k": "44"}},
    )
    assert mutation.function_of("m.xǁCǁg__mutmut_1") == "xǁCǁg"
    assert unjudged(previous, tree) == ["m.x_f__mutmut_2", "m.xǁCǁg__mutmut_1", "m.x_k__mutmut_1"]
    # a record written before hashes were kept says nothing of changes: only what it never ran or never had
    assert unjudged(Record(previous.codes, {}), tree) == ["m.x_f__mutmut_2", "m.x_k__mutmut_1"]


def test_a_record_reads_back_as_written_and_one_of_outcomes_alone_still_reads(tmp_path: Path) -> None:
    record = Record({"a.py": {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": None}}, {"a.py": {"x_f": "11"}})
    mutation.save_record(tmp_path / "area.json", record)
    assert mutation.load_record(tmp_path / "area.json") == record
    (tmp_path / "old.json").write_text('{"a.py": {"m.x_f__mutmut_1": 1}}')
    assert mutation.load_record(tmp_path / "old.json") == Record({"a.py": {"m.x_f__mutmut_1": 1}}, {})


def test_a_failed_runs_output_is_shown_without_its_spinner_frames() -> None:
    spinner = "".join(f"\r{frame} Running stats" for frame in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" * 400)
    output = "collected 12 items\nFAILED tests/core/test_x.py::test_y - AssertionError\n" + spinner + "\n"
    text = mutation.failure_text(output)
    assert text == "collected 12 items\nFAILED tests/core/test_x.py::test_y - AssertionError"
    assert mutation.failure_text("\n".join(f"line {n}" for n in range(100))).splitlines()[0] == "line 40"
