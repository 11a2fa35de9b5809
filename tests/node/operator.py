"""The node tier's operator: runs the commands the README and the docs give, read from the pages themselves, in a
shell where `kubectl` is the cluster's and `extender` is this checkout's, as a user following the page would.

Reading the commands from the page (not retyping them here) is what keeps the two from drifting: a changed page
is what the next run walks. `commands(page, heading)` returns the `sh` blocks under a heading, in order; `run`
executes one in bash with `set -e -o pipefail` and fails with its output. Comment-only lines are kept (they are
comments to bash too); a line a page marks as an alternative is for the test to choose, by block.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from devtools.cluster.layout import REPOSITORY, Paths, cache_root


def _root_sudo() -> Path:
    """A folder with a `sudo` that runs its command: what sudo does for root, on a machine without sudo (the pages
    write `sudo` for the steps that need root; the tier runs as root)."""
    folder = Path(tempfile.gettempdir()) / "gpu-extender-root-sudo"
    folder.mkdir(exist_ok=True)
    sudo = folder / "sudo"
    sudo.write_text('#!/bin/sh\n# sudo as root: run the command (tests/node/operator.py)\nexec "$@"\n')
    sudo.chmod(0o755)
    return folder


HELM_BUILD = REPOSITORY / "tests" / "helm" / "build.sh"


def helm_dir() -> Path:
    """Where tests/helm/build.sh puts the helm it pins (its `version=` line)."""
    version = re.search(r"^version=(v[0-9.]+)$", HELM_BUILD.read_text(), re.M)
    assert version, f"{HELM_BUILD}: no version= line"
    return cache_root() / f"helm-{version.group(1)}"


FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\w*)\s*$")


def commands(page: Path, heading: str | None = None) -> list[str]:
    """The `sh` code blocks of a Markdown page (under the heading whose text starts with `heading`, down to the
    next heading of the same or a higher level), each dedented to the fence's indentation."""
    lines = page.read_text().splitlines()
    if heading is not None:
        lines = _section(lines, heading, page)
    blocks = commands_in("\n".join(lines))
    if not blocks:
        raise AssertionError(f"no sh block in {page}{f' under {heading!r}' if heading else ''}")
    return blocks


def commands_in(text: str) -> list[str]:
    """The `sh` code blocks of Markdown text, in order, each dedented to its fence's indentation."""
    lines = text.splitlines()
    blocks: list[str] = []
    inside: list[str] | None = None
    indent = ""
    for line in lines:
        fence = FENCE.match(line)
        if fence and inside is None and fence["lang"] in ("sh", "bash", "shell"):
            inside, indent = [], fence["indent"]
        elif fence and inside is not None:
            blocks.append("\n".join(inside) + "\n")
            inside = None
        elif inside is not None:
            inside.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
    return blocks


def _section(lines: list[str], heading: str, page: Path) -> list[str]:
    for number, line in enumerate(lines):
        match = re.match(r"^(#+)\s+(.*)$", line)
        if match and (match[2].startswith(heading) or re.sub(r"^\d+\.\s*", "", match[2]).startswith(heading)):
            level = len(match[1])
            rest = lines[number + 1 :]
            for end, later in enumerate(rest):
                other = re.match(r"^(#+)\s", later)
                if other and len(other[1]) <= level:
                    return rest[:end]
            return rest
    raise AssertionError(f"no heading {heading!r} in {page}")


@dataclass(frozen=True, slots=True)
class Operator:
    """Runs shell as the cluster's admin from the repository's root (where the pages' relative paths point)."""

    paths: Paths

    @property
    def env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        folders = [self.paths.binaries, helm_dir(), Path(venv_bin)]
        if shutil.which("sudo") is None and os.geteuid() == 0:
            folders.append(_root_sudo())
        tools = ":".join(str(folder) for folder in folders)
        return {
            **os.environ,
            "KUBECONFIG": str(self.paths.kubeconfig("admin")),
            "PATH": f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }

    def run(self, script: str, timeout: float = 180.0, check: bool = True) -> str:
        """`script` in bash (errexit, pipefail); its stdout, or an AssertionError with all it printed."""
        done = subprocess.run(
            ["bash", "-c", "set -e -o pipefail\n" + script],
            cwd=REPOSITORY,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            raise AssertionError(f"exit {done.returncode} from:\n{script}\n{output}")
        return done.stdout

    def kubectl(self, *arguments: str, input_text: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            ["kubectl", *arguments],
            cwd=REPOSITORY,
            env=self.env,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(arguments)}: exit {done.returncode}: {done.stderr or done.stdout}")
        return done.stdout

    def get(self, *arguments: str) -> Any:
        """`kubectl get ... -o json`, decoded."""
        return orjson.loads(self.kubectl("get", *arguments, "-o", "json"))

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 180.0, interval: float = 1.0) -> Any:
        """Poll `check()` until it returns something truthy (returned); fail saying what did not happen, with the
        cluster's recent events."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                events = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)
                raise AssertionError(f"not true after {timeout:.0f} s: {what}\nlast events:\n{events[-4000:]}")
            time.sleep(interval)

    def restart_scheduler(self, config: Path | None = None) -> None:
        """The cluster's default scheduler restarted with `config` (wiring (b)'s step 3: the static pod's edit), or
        as it was."""
        from devtools.cluster.node import start_scheduler

        start_scheduler(self.paths, config)

    def restart_kubelet(self) -> None:
        """kubelet stopped and started again, as `systemctl restart kubelet` does; returns once the Node is Ready."""
        from devtools.cluster.node import start_kubelet

        start_kubelet(self.paths)

    def device_plugin(self, protocol: str, refuse: Sequence[str] = ()) -> None:
        """Run the device-plugin double of `protocol` on the node in place of the one running (the Node then
        advertises that protocol's resource); it fails the Allocate of the pods in `refuse` on purpose."""
        from devtools.cluster.addons import start_device_plugin

        start_device_plugin(self.paths, protocol, refuse=refuse)

    def pod_phase(self, name: str, namespace: str = "default") -> str:
        pod = self.get("pod", name, "-n", namespace)
        return str(pod.get("status", {}).get("phase", ""))
