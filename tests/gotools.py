"""The Go commands the chart and manifest tests run (helm, kubectl), built from source as the e2e tier's are.

Each is built by its script (tests/helm/build.sh, tests/e2e/build.sh: pinned versions, cached under
~/.cache/gpu-extender, one build at a time through tests/cache_dir.sh's lock) and `make test` builds them before
pytest runs. A test that finds its command missing builds it then, once a session, where Go is installed, and
fails when that build fails; it skips, saying so, only on a machine without Go, where nothing could build it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.cluster.layout import Paths, cache_root
from tests.e2e.controlplane import go_toolchain

ROOT = Path(__file__).resolve().parent.parent
HELM_SCRIPT = ROOT / "tests" / "helm" / "build.sh"
KUBE_SCRIPT = ROOT / "tests" / "e2e" / "build.sh"


@dataclass(frozen=True, slots=True)
class Tool:
    """A command a build script makes: where it lands and what needs it (for the skip's reason)."""

    binary: Path
    script: Path
    needed_by: str


_failed_builds: dict[Path, str] = {}
"""A build that failed this session, by binary, with why: tried once, not once per test."""


def built(tool: Tool) -> str:
    """The tool's binary: found, or built now by its script where Go is installed; skips only without Go."""
    if os.access(tool.binary, os.X_OK):
        return str(tool.binary)
    command = f"bash {tool.script.relative_to(ROOT) if tool.script.is_relative_to(ROOT) else tool.script}"
    if go_toolchain() is None:
        pytest.skip(f"{tool.needed_by} skipped: no Go toolchain to build {tool.binary.name} (see `{command}`)")
    if tool.binary not in _failed_builds:
        run = subprocess.run(["bash", str(tool.script)], capture_output=True, text=True, check=False)
        if run.returncode != 0 or not os.access(tool.binary, os.X_OK):
            output = (run.stdout + run.stderr).strip().splitlines()[-20:]
            _failed_builds[tool.binary] = f"`{command}` exited {run.returncode}:\n" + "\n".join(output)
    if tool.binary in _failed_builds:
        pytest.fail(f"{tool.needed_by}: {tool.binary} missing; {_failed_builds[tool.binary]}", pytrace=False)
    return str(tool.binary)


def helm_version() -> str:
    """The version tests/helm/build.sh pins (its `version=` line)."""
    found = re.search(r"^version=(v[0-9.]+)$", HELM_SCRIPT.read_text(), re.MULTILINE)
    assert found, f"{HELM_SCRIPT}: no version= line"
    return found.group(1)


def helm() -> str:
    """The pinned helm the chart tests lint and render with."""
    return built(Tool(cache_root() / f"helm-{helm_version()}" / "helm", HELM_SCRIPT, "chart tests"))


def kubectl() -> str:
    """The kubectl that `kubectl kustomize` builds manifests/ with: the one tests/e2e/build.sh pins and builds with
    the control plane; without Go, one on PATH rather than none."""
    pinned = Tool(Paths().binaries / "kubectl", KUBE_SCRIPT, "kustomize tests")
    on_path = shutil.which("kubectl")
    if not os.access(pinned.binary, os.X_OK) and go_toolchain() is None and on_path is not None:
        return on_path
    return built(pinned)
