"""`bench/cache_build.py` (run by `make bench`): a small run end to end, so the bench keeps working as the code
under it changes. It once waited forever: readiness came to wait for a list its page-serving API server did not
serve (ResourceQuotas), and the first list never completed. Run as `make bench` runs it, in a process of its own,
with a deadline: a hang fails here, with what it printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_small_run_fills_the_cache_and_reports_each_figure() -> None:
    command = [sys.executable, "-m", "bench.cache_build", "--nodes", "20", "--pods", "60", "--events", "50"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"bench.cache_build did not finish in 120 s; it printed: {expired.stdout!r}") from None
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "cluster: 20 nodes, 160 GPUs, 60 pods" in out, out
    assert "first list of nodes and pods into the cache:" in out
    assert "watch event, apply a decoded event: mean" in out
    assert out.count("/metrics scrape with --gpu-metrics") == 3, out
