"""kube-scheduler on the e2e control plane, wired to the extender as `extender scheduler-config` renders it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.e2e.controlplane import ControlPlane
from tests.e2e.extender_process import ExtenderProcess


def scheduler_config(extender: ExtenderProcess, scheduler_name: str, *flags: str) -> str:
    """What `extender scheduler-config` prints for this extender, under `scheduler_name` (and `flags`)."""
    tls = extender.tls
    command = [
        sys.executable, "-m", "extender", "scheduler-config", "--k8s-version", "1.34", "--url", extender.url,
        "--scheduler-ca-file", str(tls.ca),
        "--scheduler-cert-file", str(tls.client_cert), "--scheduler-key-file", str(tls.client_key),
        "--scheduler-name", scheduler_name, *flags,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@dataclass(slots=True)
class Scheduler:
    popen: subprocess.Popen[bytes]
    control_plane: ControlPlane

    def log(self) -> str:
        return self.control_plane.scheduler_log(self.popen)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


@contextmanager
def running_scheduler(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler_name: str, *flags: str
) -> Iterator[Scheduler]:
    """kube-scheduler calling the extender, stopped on exit."""
    popen = control_plane.start_scheduler(scheduler_config(extender, scheduler_name, *flags))
    try:
        yield Scheduler(popen, control_plane)
    finally:
        control_plane.stop_scheduler(popen)
