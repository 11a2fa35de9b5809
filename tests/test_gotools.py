"""tests/gotools.py: a missing Go command is built by its script where Go is installed, the test fails when that
build fails, and it skips only where there is no Go. The build scripts here are stand-ins that write (or fail to
write) the binary, so no Go build runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import gotools
from tests.gotools import Tool


def tool_built_by(tmp_path: Path, script_body: str) -> Tool:
    script = tmp_path / "build.sh"
    script.write_text(script_body)
    return Tool(tmp_path / "tool", script, "stand-in tests")


@pytest.fixture
def go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gotools, "go_toolchain", lambda: "/usr/local/go/bin/go")


@pytest.mark.usefixtures("go")
def test_a_missing_tool_is_built_by_its_script_where_go_is(tmp_path: Path) -> None:
    tool = tool_built_by(tmp_path, f"printf '#!/bin/sh\\n' >{tmp_path}/tool && chmod +x {tmp_path}/tool\n")
    assert gotools.built(tool) == str(tool.binary)


@pytest.mark.usefixtures("go")
def test_a_failed_build_fails_the_test_with_its_output_and_is_tried_once(tmp_path: Path) -> None:
    tool = tool_built_by(tmp_path, f"echo tried >>{tmp_path}/tries; echo 'go: module not found' >&2; exit 1\n")
    for _ in range(2):
        with pytest.raises(pytest.fail.Exception, match=r"(?s)tool missing; .* exited 1:.*go: module not found"):
            gotools.built(tool)
    assert (tmp_path / "tries").read_text() == "tried\n"


@pytest.mark.usefixtures("go")
def test_a_build_that_succeeds_without_making_the_tool_fails_the_test(tmp_path: Path) -> None:
    tool = tool_built_by(tmp_path, "echo 'nothing to do'\n")
    with pytest.raises(pytest.fail.Exception, match="exited 0:\nnothing to do"):
        gotools.built(tool)


def test_without_go_the_test_skips_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gotools, "go_toolchain", lambda: None)
    tool = tool_built_by(tmp_path, f"echo tried >{tmp_path}/tries\n")
    with pytest.raises(pytest.skip.Exception, match="stand-in tests skipped: no Go toolchain to build tool"):
        gotools.built(tool)
    assert not (tmp_path / "tries").exists()


def test_a_tool_present_is_used_without_a_build(tmp_path: Path) -> None:
    tool = tool_built_by(tmp_path, f"echo tried >{tmp_path}/tries\n")
    tool.binary.write_text("#!/bin/sh\n")
    tool.binary.chmod(0o755)
    assert gotools.built(tool) == str(tool.binary)
    assert not (tmp_path / "tries").exists()
