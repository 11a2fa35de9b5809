"""A real `extender serve` as a subprocess, for the tools that measure it: `make bench` and `make loadtest`.

Both must measure the process as users run it, so both start the command itself, on a free loopback port,
wait for `/readyz`, read its CPU time and memory from /proc, and stop it on exit. This is that one piece.
The kernel also stops the server if the tool that started it dies (PR_SET_PDEATHSIG), so no run leaves a
server behind. It only ever listens on and talks to 127.0.0.1, and the service itself never imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


class HarnessError(Exception):
    """The server would not start, or died; the message carries the end of its log."""


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of the samples (0.0 for none): what bench/ and loadtest/ report."""
    ordered = sorted(samples)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def stop_process(popen: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM a process still running, and SIGKILL it if it has not exited within `grace` seconds."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def die_with_parent() -> None:
    """Run in a child before exec: the kernel sends it SIGTERM when its parent dies, so nothing outlives a tool."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, or "unknown CPU"."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine() -> str:
    """The CPU model, cores and Python, for the header of a report."""
    python = f"{platform.python_version()} ({platform.python_implementation()})"
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {python}"


class ServedExtender:
    """`extender serve --cluster FILE` on a free loopback port, plain HTTP unless `serve_args` say otherwise."""

    def __init__(
        self,
        cluster_file: Path,
        log_file: Path,
        serve_args: Sequence[str] = ("--insecure-http",),
        client_context: ssl.SSLContext | None = None,
    ) -> None:
        """`client_context`: how to reach an HTTPS server's /readyz (its CA, and a client certificate for mTLS)."""
        self.port = free_port()
        self.log_file = log_file
        self.client_context = client_context
        command = [
            sys.executable, "-m", "extender", "serve", "--cluster", str(cluster_file), *serve_args,
            "--host", HOST, "--port", str(self.port), "--log-level", "WARNING",
        ]  # fmt: skip
        self.started = time.perf_counter()
        with log_file.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    @property
    def url(self) -> str:
        return f"{'https' if self.client_context else 'http'}://{HOST}:{self.port}"

    def get(self, path: str, timeout: float = 120.0) -> tuple[int, bytes]:
        """One GET on a fresh connection: status and body (also of an error status)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout, context=self.client_context) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())

    def wait_ready(self, timeout: float = 180.0) -> float:
        """Seconds from the start of the process until /readyz answered 200."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise HarnessError(f"server exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if self.get("/readyz", timeout=2)[0] == 200:
                    return time.perf_counter() - self.started
            time.sleep(0.05)
        raise HarnessError(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """CPU time of every thread of the server so far: nanosecond schedstat, else the clock-tick stat."""
        total = 0
        with contextlib.suppress(OSError, ValueError, IndexError):
            for task in os.listdir(f"/proc/{self.process.pid}/task"):
                with open(f"/proc/{self.process.pid}/task/{task}/schedstat", "rb") as stat:
                    total += int(stat.read().split()[0])
        if total:
            return total / 1e9
        with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory(self) -> dict[str, int]:
        """Resident memory now (VmRSS) and at its peak (VmHWM), in KiB."""
        found = {}
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0])
        return found

    def log_tail(self, characters: int = 3000) -> str:
        return self.log_file.read_text(errors="replace")[-characters:]

    def stop(self) -> None:
        stop_process(self.process)


@contextlib.contextmanager
def served_extender(
    cluster_file: Path,
    log_file: Path,
    serve_args: Sequence[str] = ("--insecure-http",),
    client_context: ssl.SSLContext | None = None,
) -> Iterator[ServedExtender]:
    server = ServedExtender(cluster_file, log_file, serve_args, client_context)
    try:
        yield server
    finally:
        server.stop()
