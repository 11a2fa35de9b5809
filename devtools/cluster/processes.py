"""The one-node cluster's daemons: started detached (they outlive `make cluster`), one pid file and one log each,
stopped by `down` newest first.

A daemon runs in the node's network namespace (`network.in_node`) unless it is told otherwise, in a session of its
own, with its output in `logs/<name>.log`. Waiting for one to be up is polling a check (true when up) against a
deadline; if the daemon exits first, or the deadline passes, the error carries the tail of its log, so a cluster that
does not come up says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from devtools.cluster import network
from devtools.cluster.layout import USE_LOCK, Paths

LOG_TAIL_LINES = 40
STOP_GRACE = 10.0


class ClusterError(RuntimeError):
    """The cluster could not be brought up or down; the message says which part, and why."""


@contextlib.contextmanager
def cluster_lock(wait: float = 1800.0) -> Iterator[None]:
    """Hold `USE_LOCK` while the block runs; wait for it up to `wait` seconds, saying who waits."""
    USE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with USE_LOCK.open("a") as handle:
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ClusterError(f"the cluster is in use ({USE_LOCK} held) for over {wait:.0f} s") from None
                if not told:
                    print(f"cluster: in use by another run ({USE_LOCK}); waiting", flush=True)
                    told = True
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start(paths: Paths, name: str, argv: Sequence[str], *, in_node: bool = True) -> int:
    """Start `argv` detached as the daemon `name` and record its pid; returns the pid."""
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.pids.mkdir(parents=True, exist_ok=True)
    command = network.in_node(*argv) if in_node else list(argv)
    log = paths.logs / f"{name}.log"
    with log.open("ab") as output:
        output.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command)}\n".encode())
        output.flush()
        popen = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    # nsenter execs the command in place: the pid is the daemon's own.
    (paths.pids / f"{name}.pid").write_text(f"{popen.pid}\n")
    (paths.pids / f"{name}.order").write_text(f"{time.monotonic_ns()}\n")
    return popen.pid


def pid_of(paths: Paths, name: str) -> int | None:
    """The daemon's pid while it runs (the pid file's process, if it is alive and not a zombie)."""
    try:
        pid = int((paths.pids / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return pid


def running(paths: Paths) -> list[str]:
    """The daemons with a pid file, in the order they were started."""
    if not paths.pids.is_dir():
        return []
    names = [path.stem for path in paths.pids.glob("*.pid")]

    def started(name: str) -> int:
        try:
            return int((paths.pids / f"{name}.order").read_text())
        except (OSError, ValueError):
            return 0

    return sorted(names, key=started)


def start_and_wait(
    paths: Paths,
    name: str,
    argv: Sequence[str],
    check: Callable[[], bool],
    what: str,
    *,
    timeout: float = 90.0,
    in_node: bool = True,
) -> None:
    """`start` the daemon, then `wait_until` it is `what` (its check true)."""
    start(paths, name, argv, in_node=in_node)
    wait_until(paths, name, check, what, timeout)


def wait_until(paths: Paths, name: str, check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    """Poll `check()` until it is true; fail with the daemon's log if it exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    log = paths.logs / f"{name}.log"
    while True:
        if pid_of(paths, name) is None:
            raise ClusterError(f"{name} exited before {what}; last lines of {log}:\n{log_tail(log)}")
        if check():
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} not {what} after {timeout:.0f} s; last lines of {log}:\n{log_tail(log)}")
        time.sleep(0.25)


def stop(paths: Paths, name: str, grace: float = STOP_GRACE) -> None:
    """SIGTERM the daemon (and its session), SIGKILL what is left after `grace` seconds; forget its pid."""
    pid = pid_of(paths, name)
    if pid is not None:
        _signal_session(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pid_of(paths, name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_of(paths, name) is not None:
            _signal_session(pid, signal.SIGKILL)
            while pid_of(paths, name) is not None and time.monotonic() < deadline + 5:
                time.sleep(0.1)
    for suffix in (".pid", ".order"):
        (paths.pids / f"{name}{suffix}").unlink(missing_ok=True)


def _signal_session(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def https_ok(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> bool:
    """True when GET `url` answers 200 (a readiness or health endpoint)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=3, context=context) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def unverified() -> ssl.SSLContext:
    """For the health endpoints of components whose serving certificate is self-signed in memory."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
