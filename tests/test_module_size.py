"""`make lint`'s check that no module of the package is over 500 lines (`devtools/module_size.py`)."""

from __future__ import annotations

from pathlib import Path

from devtools.module_size import LIMIT, oversized


def test_a_module_over_the_limit_is_named_with_its_count(tmp_path: Path) -> None:
    package = tmp_path / "extender"
    (package / "core").mkdir(parents=True)
    (package / "core" / "small.py").write_text("x = 1\n" * LIMIT)
    (package / "core" / "large.py").write_text("x = 1\n" * (LIMIT + 1))
    assert oversized(package) == [("extender/core/large.py", LIMIT + 1)]


def test_no_module_of_the_package_is_over_the_limit() -> None:
    assert oversized() == []
