"""The `extender` command as users run it: a real process, configured by flags and EXTENDER_* variables,
stopped by SIGTERM, picking up a rotated certificate; errors a user can fix end in one line naming the problem
and exit 2."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from cryptography import x509

from devtools.harness import free_port
from extender import cli
from extender.cli import main
from extender.tools.certs import issue_client, issue_server, make_ca
from tests.builders import make_node, make_pod
from tests.conftest import SecretVolume


def wait_ready(
    url: str, process: subprocess.Popen[bytes], seconds: float = 20.0, context: ssl.SSLContext | None = None
) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited early: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("server never became ready")


def one_node_cluster(tmp_path: Path) -> Path:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"kind": "List", "items": [make_node("n1")]}))
    return cluster


@contextlib.contextmanager
def serving(args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """`extender serve ARGS` as a process, killed if the test fails before `stop_gracefully`."""
    command = [sys.executable, "-m", "extender", "serve", *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def stop_gracefully(process: subprocess.Popen[bytes]) -> str:
    """SIGTERM; its log, once it has exited 0."""
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    log = stderr.decode()
    assert process.returncode == 0, log
    return log


def test_serve_answers_then_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    cluster = one_node_cluster(tmp_path)
    port = free_port()
    env = {**os.environ, "EXTENDER_PORT": str(port), "EXTENDER_INSECURE_HTTP": "true"}
    with serving(["--cluster", str(cluster), "--host", "127.0.0.1"], env) as process:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process)
        body = orjson.dumps({"Pod": make_pod("p", gpu_mem=4), "NodeNames": ["n1"]})
        request = urllib.request.Request(f"{url}/filter", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert orjson.loads(response.read())["NodeNames"] == ["n1"]
        log = stop_gracefully(process)
    assert "serving plain HTTP (--insecure-http)" in log
    assert "shutting down gracefully" in log
    assert "Traceback" not in log


def test_the_health_port_serves_probes_and_metrics_over_plain_http_and_nothing_else(tmp_path: Path) -> None:
    """What kubelet httpGet probes and Prometheus reach without a client certificate, while every verb stays
    behind mutual TLS on the main port."""
    cluster = one_node_cluster(tmp_path)
    ca = make_ca()
    server = issue_server(ca)
    for name, data in (
        ("tls.crt", server.certificate_pem),
        ("tls.key", server.key_pem),
        ("ca.crt", ca.certificate_pem),
    ):
        (tmp_path / name).write_bytes(data)
    port, health = free_port(), free_port()
    args = ["--cluster", str(cluster), "--host", "127.0.0.1", "--port", str(port), "--health-port", str(health)]
    args += ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")]
    args += ["--client-ca", str(tmp_path / "ca.crt")]
    env = {name: value for name, value in os.environ.items() if not name.startswith("EXTENDER_")}
    with serving(args, env) as process:
        plain = f"http://127.0.0.1:{health}"
        wait_ready(plain, process)
        for path, expected in (("/healthz", b'"ok"'), ("/synced", b'"synced"'), ("/metrics", b"extender_requests")):
            with urllib.request.urlopen(plain + path, timeout=5) as response:
                assert response.status == 200 and expected in response.read(), path
        body = orjson.dumps({"Pod": make_pod("p", gpu_mem=4), "NodeNames": ["n1"]})
        for method, path, data in (("POST", "/filter", body), ("POST", "/bind", body), ("GET", "/inspect", None)):
            request = urllib.request.Request(plain + path, data=data, method=method)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=5)
            assert refused.value.code == 404, path
        anonymous = ssl.create_default_context(cadata=ca.certificate_pem.decode())
        with pytest.raises(OSError):  # the main port still wants the scheduler's certificate
            urllib.request.urlopen(f"https://localhost:{port}/healthz", timeout=5, context=anonymous).read()
        log = stop_gracefully(process)
    assert f"serving /healthz, /readyz, /synced, /metrics over plain http on 127.0.0.1:{health}" in log


def test_a_health_port_already_taken_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cluster = one_node_cluster(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        health = taken.getsockname()[1]
        command = [sys.executable, "-m", "extender", "serve", "--cluster", str(cluster), "--host", "127.0.0.1"]
        command += ["--port", str(free_port()), "--health-port", str(health), "--insecure-http"]
        env = {name: value for name, value in os.environ.items() if not name.startswith("EXTENDER_")}
        result = subprocess.run(command, env=env, capture_output=True, timeout=30)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "extender serve:" in stderr and "address already in use" in stderr.lower()
    assert "Traceback" not in stderr


def _filter(connection: http.client.HTTPSConnection) -> int:
    """POST /filter on a kept-alive connection; the status."""
    body = orjson.dumps({"Pod": make_pod("p", gpu_mem=4), "NodeNames": ["n1"]})
    connection.request("POST", "/filter", body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    return response.status


def _served_serial(connection: http.client.HTTPSConnection) -> int:
    assert isinstance(connection.sock, ssl.SSLSocket)
    der = connection.sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_serve_picks_up_a_rotated_certificate_without_dropping_open_connections(tmp_path: Path) -> None:
    """As in a pod: the files are a mounted Secret, swapped by the kubelet while the extender serves."""
    cluster = one_node_cluster(tmp_path)
    ca = make_ca()
    first, second, scheduler = issue_server(ca), issue_server(ca), issue_client(ca)
    volume = SecretVolume(tmp_path / "tls")
    volume.publish({"tls.crt": first.certificate_pem, "tls.key": first.key_pem, "ca.crt": ca.certificate_pem})
    (tmp_path / "client.crt").write_bytes(scheduler.certificate_pem)
    (tmp_path / "client.key").write_bytes(scheduler.key_pem)
    client = ssl.create_default_context(cadata=ca.certificate_pem.decode())
    client.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    port = free_port()
    args = ["--cluster", str(cluster), "--host", "127.0.0.1"]
    args += ["--port", str(port), "--tls-reload-interval", "0.1", "--tls-cert", volume.path("tls.crt")]
    args += ["--tls-key", volume.path("tls.key"), "--client-ca", volume.path("ca.crt")]
    env = {name: value for name, value in os.environ.items() if not name.startswith("EXTENDER_")}
    with serving(args, env) as process:
        wait_ready(f"https://localhost:{port}", process, context=client)
        old = http.client.HTTPSConnection("localhost", port, context=client, timeout=5)
        assert _filter(old) == 200
        assert _served_serial(old) == first.certificate.serial_number

        volume.publish({"tls.crt": second.certificate_pem, "tls.key": second.key_pem, "ca.crt": ca.certificate_pem})
        deadline = time.monotonic() + 10
        while True:
            new = http.client.HTTPSConnection("localhost", port, context=client, timeout=5)
            assert _filter(new) == 200
            served = _served_serial(new)
            new.close()
            if served == second.certificate.serial_number or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert served == second.certificate.serial_number, "new connections never got the new certificate"
        assert _filter(old) == 200, "the connection opened before the swap was dropped"
        old.close()
        log = stop_gracefully(process)
    assert "TLS files reloaded: new handshakes get CN=localhost" in log
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
    cluster = one_node_cluster(tmp_path)
    assert main([str(cluster) if arg == "CLUSTER" else arg for arg in argv]) == 2
    error = capsys.readouterr().err
    last = error.strip().splitlines()[-1]
    assert last.startswith("extender serve: ")
    assert message in last
    assert "Traceback" not in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--days", "0"], "--days 0: must be between 1 and 36500"),
        (["--days", "-3"], "--days -3: must be between 1 and 36500"),
        (["--days", "a year"], "--days 'a year': not a whole number"),
        (["--ip", "10.0.0"], "--ip '10.0.0': not an IPv4 or IPv6 address"),
        (["--dns-name", "bad..name"], "--dns-name 'bad..name': not a DNS name"),
        (["--namespace", "Not_A_Namespace"], "--namespace 'Not_A_Namespace': not a Kubernetes namespace name"),
        (["--client-name", ""], "--client-name '': must be 1 to 64 characters"),
        (["--out", "UNWRITABLE/certs"], "cannot write certificates to UNWRITABLE/certs: Permission denied"),
        (["--out", "A_FILE"], "--out A_FILE: not a directory"),
        (["--out", "A_FILE/certs"], "cannot write certificates to A_FILE/certs: Not a directory"),
        (["--out", "EXISTING"], "EXISTING/ca.crt already exists: --force replaces it"),
        (["--secrets", "--out", "x"], "--secrets prints to stdout: drop --out"),
        (["--ca-cert", "EXISTING/ca.crt"], "--ca-cert and --ca-key go together"),
        (["--ca-cert", "EXISTING/tls.crt", "--ca-key", "EXISTING/tls.key"], "is not a CA certificate"),
        (["--ca-cert", "EXISTING/ca.crt", "--ca-key", "EXISTING/client.key"], "does not belong to the certificate"),
        (["--ca-cert", "EXISTING/none.crt", "--ca-key", "EXISTING/ca.key"], "none.crt: No such file or directory"),
        (["--ca-cert", "EXISTING/ca.crt", "--ca-key", "EXISTING/ca.key", "--days", "400"], "the CA is valid until"),
    ],
)
def test_certs_user_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0 and "UNWRITABLE/certs" in argv:
        unprivileged_certs_into_an_unwritable_directory()
        return
    unwritable = tmp_path / "unwritable"
    unwritable.mkdir(mode=0o500)
    (tmp_path / "a-file").write_text("")
    assert main(["certs", "--out", str(tmp_path / "existing"), "--keep-ca-key", "--days", "300"]) == 0
    capsys.readouterr()
    places = {"UNWRITABLE": str(unwritable), "A_FILE": str(tmp_path / "a-file"), "EXISTING": str(tmp_path / "existing")}

    def placed(text: str) -> str:
        for name, path in places.items():
            text = text.replace(name, path)
        return text

    assert main(["certs", *map(placed, argv)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith("extender certs: ")
    assert placed(message) in error


def unprivileged_certs_into_an_unwritable_directory() -> None:
    """Root writes anywhere, so as root the case runs as an unprivileged user (nobody, by util-linux's setpriv), in
    a directory it may enter but not write: the message a user without root sees."""
    assert shutil.which("setpriv"), "setpriv (util-linux) runs the case as nobody when the tests run as root"
    unwritable = Path(tempfile.mkdtemp(prefix="unwritable-"))  # under /tmp, which nobody may traverse
    unwritable.chmod(0o555)
    try:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "extender"]
        run = subprocess.run([*argv, "certs", "--out", f"{unwritable}/certs"], capture_output=True, text=True, cwd="/")
    finally:
        unwritable.rmdir()
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"extender certs: cannot write certificates to {unwritable}/certs: Permission denied\n"


def test_a_programming_error_keeps_its_traceback_instead_of_passing_for_a_user_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only `UserError` (and OSError) is printed as one line with exit 2: a ValueError from a bug propagates."""

    def buggy(arguments: object) -> int:
        raise ValueError("a bug")

    monkeypatch.setattr(cli, "_scheduler_config", buggy)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["scheduler-config", "--k8s-version", "1.31"])


@pytest.mark.parametrize("command", ["serve", "scheduler-config"])
def test_help_lists_every_setting_even_those_whose_help_says_percent(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse formats help text with %: a help saying "30 % compute" once crashed `--help`."""
    with pytest.raises(SystemExit) as stopped:
        main([command, "--help"])
    assert stopped.value.code == 0
    shown = capsys.readouterr().out
    assert "--protocol" in shown and "--hami-default-cores" in shown and "% compute" in shown
