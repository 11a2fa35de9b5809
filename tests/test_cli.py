"""The `extender` command as users run it: a real process, configured by flags and EXTENDER_* variables,
stopped by SIGTERM; errors a user can fix end in one line naming the problem and exit 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml

from extender.cli import main
from tests.builders import make_node, make_pod


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited early: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("server never became ready")


def test_serve_answers_then_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"kind": "List", "items": [make_node("n1")]}))
    port = free_port()
    env = {**os.environ, "EXTENDER_PORT": str(port), "EXTENDER_INSECURE_HTTP": "true"}
    process = subprocess.Popen(
        [sys.executable, "-m", "extender", "serve", "--cluster", str(cluster), "--host", "127.0.0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process)
        body = orjson.dumps({"Pod": make_pod("p", gpu_mem=4), "NodeNames": ["n1"]})
        request = urllib.request.Request(f"{url}/filter", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert orjson.loads(response.read())["NodeNames"] == ["n1"]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "serving plain HTTP (--insecure-http)" in log
    assert "shutting down gracefully" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--cluster", "c.yaml"], "HTTPS needs --tls-cert and --tls-key"),
        (["serve", "--insecure-http", "--port", "x"], "--port='x'"),
        (["serve", "--insecure-http"], "no Kubernetes API configuration found"),
        (["serve", "--insecure-http", "--kubeconfig", "/nonexistent/kc"], "kubeconfig /nonexistent/kc: no such file"),
        (["serve", "--insecure-http", "--cluster", "/nonexistent/c.yaml"], "cluster file /nonexistent/c.yaml"),
        (
            ["serve", "--tls-cert", "/nonexistent/s.crt", "--tls-key", "k", "--cluster", "CLUSTER"],
            "TLS certificate not found: /nonexistent/s.crt",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [name for name in os.environ if name.startswith("EXTENDER_")]:
        monkeypatch.delenv(name)
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"kind": "List", "items": [make_node("n1")]}))
    assert main([str(cluster) if arg == "CLUSTER" else arg for arg in argv]) == 2
    error = capsys.readouterr().err
    last = error.strip().splitlines()[-1]
    assert last.startswith("extender serve: ")
    assert message in last
    assert "Traceback" not in error
