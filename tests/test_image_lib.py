"""image/lib.sh, as the two scripts that source it (image/node-images.sh, image/cert-manager.sh) run it before they
build anything: the action they are given (`read_action`), and what they do for a user who is not root: say so and
what is skipped, exit 0 and make no cache (the node tier is skipped then, as `make node-build` expects)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parent.parent / "image"
SKIPPED = {"node-images.sh": "the node tier will be skipped", "cert-manager.sh": "nothing is built"}
"""Each script, and what it says is skipped without root."""


@pytest.mark.parametrize("script", ["lib.sh", *sorted(SKIPPED)])
def test_it_and_the_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(IMAGE / script)], check=True)


@pytest.mark.parametrize("script", sorted(SKIPPED))
def test_an_unknown_action_is_refused_with_the_usage(script: str) -> None:
    result = subprocess.run(["bash", str(IMAGE / script), "nonsense"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage" in result.stderr


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
@pytest.mark.parametrize(("script", "skipped"), sorted(SKIPPED.items()))
def test_without_root_it_says_what_is_skipped_and_makes_no_cache(script: str, skipped: str, tmp_path: Path) -> None:
    command = ["bash", str(IMAGE / script)]
    if os.geteuid() == 0:
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    environment = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GPU_EXTENDER_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{script.removesuffix('.sh')}: not root: " in result.stdout
    assert skipped in result.stdout
    assert not (tmp_path / "cache").exists()
