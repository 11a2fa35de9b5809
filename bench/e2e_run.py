"""One run of `make bench-e2e`: a fresh control plane (the e2e tier's etcd and kube-apiserver), the workload
created in it, optionally `extender serve` or the floor wired in, then kube-scheduler started and every bind
timed.

The floor (`bench/floor`, a do-nothing extender in Go that binds) is wired in as ours is, over the same mTLS
with the same verbs but preempt, so a floor run measures what kube-scheduler and the API server spend on any
extender that binds, on this machine: what ours costs beyond it is its own. The floor counts no GPU memory
(kube-scheduler's NodeResourcesFit does, as alone) and its annotations are fixed values, so its end check is the
alone one.

The order is the issue's: Node objects and pending pods first, the extender next (its first list finds them
all), then kube-scheduler, whose binds a watch on the pods timestamps as they arrive. CPU time is read from
/proc for each process just before kube-scheduler starts and one second after the last bind, so the window
holds the scheduling and nothing of the set-up. The control plane, the extender and their configuration come
from the e2e tier's own helpers and from the extender's commands (`extender certs`, `extender
scheduler-config`), so what is measured is what ships.

It never leaves a process behind: everything it starts is stopped in `finally`, and the work directory with
every process's log stays for a look after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bench.e2e_figures import (
    GPU_MEMORY,
    GPUS_PER_NODE,
    PROFILE,
    EndCheck,
    Pace,
    condition_time,
    cpu_ms_per_pod,
    cpu_seconds,
    end_check,
    pace,
)
from tests.e2e.controlplane import EXTENDER_NAMESPACE, ApiError, ControlPlane, ControlPlaneError, Process, free_port
from tests.e2e.controlplane import node_manifest as gpu_node
from tests.e2e.extender_process import ExtenderProcess, TLSFiles

ALONE = "alone"
"""kube-scheduler with no extender: NodeResourcesFit counts aliyun.com/gpu-mem against the node totals."""
WIRINGS: dict[str, tuple[str, ...]] = {"full": (), "filter-bind": ("--wiring", "filter-bind")}
"""How the extender can be wired in, by name: the extra `extender scheduler-config` flags that render it.
`full` is filter, prioritize, preempt and bind (the default); `filter-bind` leaves prioritize out, and
kube-scheduler's NodeResourcesFit scores the nodes by MostAllocated on the GPU memory resource."""
FLOORS: dict[str, str] = {"floor-full": "full", "floor-filter-bind": "filter-bind"}
"""The floor's wirings, by name, and the wiring of ours each mirrors: kube-scheduler gets that wiring's
configuration with the floor's verbs in our entry (`floor_config`), so a floor run and a run of ours differ by
the extender only: `floor-full` is filter, prioritize and bind, `floor-filter-bind` filter and bind."""
FLOOR_BUILD = Path(__file__).parent / "floor" / "build.sh"
"""Builds the floor when its source changed (Go's standard library only, no network) and prints its path."""
FLOOR_STARTUP = 10.0
"""Seconds for the floor to log that it serves: it starts in milliseconds."""
FLOOR_CONNECTION = re.compile(rb"\bconn \d+$", re.M)
"""The line the floor logs for each new connection."""

NAMESPACE = "default"
"""Where the pods go; a fresh control plane per run, so nothing else is in it."""
CLIENT_RATE = 5000
"""kube-scheduler's clientConnection.qps and burst, as scheduler_perf sets them: its API client never waits."""
CREATE_CONCURRENCY = 32
"""Create requests in flight while making the workload: it only has to be quick, it is not measured."""
SETTLE = 1.0
"""Seconds after the last bind before CPU is read again: the watchers catch up with the last binds."""
STALL_TIMEOUT = 60.0
"""Seconds without a new bind, with pods still pending, before a run is called failed: every pod fits."""
EXTENDER_SELF = "gpu-extender-bench"
"""The extender's own pod (`--pod-name`, as the Deployment sets it): the leader labels it."""
CPU_TICKS = os.sysconf("SC_CLK_TCK")


class RunError(Exception):
    """A run could not finish: a process stopped, the API refused something, or binds stalled."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run measured."""

    wiring: str
    pace: Pace
    """From the watch's arrival times."""
    condition_pace: Pace
    """From the PodScheduled conditions (1 s resolution): a cross-check of `pace`."""
    cpu_ms_per_pod: dict[str, float]
    """etcd, kube-apiserver, kube-scheduler and (with the extender or the floor) extender; also `bench`, this
    process."""
    check: EndCheck
    setup_seconds: float
    """Starting the control plane and creating the workload (and the extender or the floor), not measured
    further."""
    scheduling_seconds: float
    """From kube-scheduler's start to the last bind."""
    window_seconds: float
    """From the first CPU sample to the second: what `cpu_ms_per_pod` was measured over."""
    verb_ms: dict[str, float] = field(default_factory=dict)
    """The extender's own mean time in the handler per verb (its latency histogram), for answered calls."""
    extender_counts: dict[str, int] = field(default_factory=dict)
    """Bind outcomes and verb calls that did not answer ok, from the extender's metrics."""
    connections: int | None = None
    """Connections kube-scheduler opened to the extender (its `extender_http_connections_accepted_total`) or to
    the floor (from the floor's log): each a TLS handshake."""


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return cpu_seconds(stat.read(), CPU_TICKS)


def pod_manifest(name: str, gpu_mem: int) -> dict[str, Any]:
    """A pending pod asking `gpu_mem` GiB of one GPU in its limits (the API copies them to its requests)."""
    container = {
        "name": "main",
        "image": "registry.example/none:latest",
        "resources": {"limits": {PROFILE.memory_resource: str(gpu_mem)}, "requests": {"cpu": "10m"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


def with_client_rate(config_yaml: str) -> str:
    """The scheduler configuration with clientConnection.qps and burst at `CLIENT_RATE`."""
    config = yaml.safe_load(config_yaml) or {}
    config.setdefault("clientConnection", {}).update(qps=CLIENT_RATE, burst=CLIENT_RATE)
    return yaml.safe_dump(config, sort_keys=False)


ALONE_CONFIG = yaml.safe_dump(
    {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "default-scheduler"}],
    }
)


def run_command(*args: str) -> str:
    """`python -m extender ARGS`, as a user runs it; its stdout."""
    done = subprocess.run([sys.executable, "-m", "extender", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RunError(f"extender {' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def make_certificates(directory: Path) -> TLSFiles:
    """`extender certs` for a loopback extender: the serving certificate names 127.0.0.1."""
    run_command("certs", "--out", str(directory), "--ip", "127.0.0.1")
    return TLSFiles(
        directory / "ca.crt",
        directory / "tls.crt",
        directory / "tls.key",
        directory / "client.crt",
        directory / "client.key",
    )


def scheduler_config(version: str, url: str, tls: TLSFiles, wiring: str) -> str:
    """What `extender scheduler-config` prints for this kube-scheduler version, extender URL and wiring; for a
    floor wiring, the configuration of the wiring it mirrors, with the floor's verbs."""
    rendered = run_command(
        "scheduler-config", "--k8s-version", version, "--url", url,
        "--scheduler-ca-file", str(tls.ca),
        "--scheduler-cert-file", str(tls.client_cert), "--scheduler-key-file", str(tls.client_key),
        *WIRINGS[FLOORS.get(wiring, wiring)],
    )  # fmt: skip
    return floor_config(rendered) if wiring in FLOORS else rendered


def floor_config(ours: str) -> str:
    """Our rendered configuration with the floor's verbs in its extender entries: no preempt (the floor has none,
    and no pod here is ever preempted), every managed resource counted by kube-scheduler whatever ours says
    (ignoredByScheduler false), since the floor counts nothing, and the second entry of the default scheduler's
    wiring (pods asking no GPU: `filter-cpu`) calling the floor's filter, which passes every node as ours does for
    a GPU pod there; the same pods are sent to it as to ours, as many times. The rest (filter, bind, prioritize
    and its weight when the wiring has it, TLS, timeout, nodeCacheCapable, ignorable) stays ours."""
    config = yaml.safe_load(ours)
    for entry in config["extenders"]:
        entry.pop("preemptVerb", None)
        entry["managedResources"] = [dict(item, ignoredByScheduler=False) for item in entry["managedResources"]]
        if entry.get("filterVerb") == "filter-cpu":
            entry["filterVerb"] = "filter"
    return yaml.safe_dump(config, sort_keys=False)


def build_floor() -> Path:
    """The floor's binary, built by `FLOOR_BUILD` when its source changed; a RunError with the script's last
    line when it cannot be (no Go toolchain, a compile error)."""
    done = subprocess.run(["bash", str(FLOOR_BUILD)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"{FLOOR_BUILD} exited with {done.returncode}"]
        raise RunError(lines[-1])
    return Path(done.stdout.strip())


def connections_opened(log: bytes) -> int:
    """How many connections the floor accepted, from its log: it writes "conn N" for each."""
    return len(FLOOR_CONNECTION.findall(log))


@dataclass(frozen=True, slots=True)
class Floor:
    """The floor's process, serving `url` with `extender certs`' files."""

    process: Process
    url: str
    tls: TLSFiles

    def connections(self) -> int:
        return connections_opened(self.process.log.read_bytes())


# ---- the API, as admin ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def admin_session(plane: ControlPlane) -> AsyncIterator[aiohttp.ClientSession]:
    """One session for the whole workload: `ControlPlane.api` opens one (and a TLS handshake) per call."""
    headers = {"Authorization": f"Bearer {plane.users['admin'].token}", "Accept": "application/json"}
    connector = aiohttp.TCPConnector(ssl=plane.ssl_context, limit=CREATE_CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
        yield session


async def create_all(plane: ControlPlane, path: str, bodies: list[dict[str, Any]]) -> None:
    async with admin_session(plane) as session:
        queue = iter(bodies)

        async def worker() -> None:
            for body in queue:
                async with session.post(
                    plane.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
                ) as answer:
                    if answer.status >= 300:
                        raise ApiError("POST", path, answer.status, await answer.read())

        await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))


async def create_workload(plane: ControlPlane, nodes: int, sizes: list[int]) -> None:
    await create_all(
        plane, "/api/v1/nodes", [gpu_node(f"bench-{n:05d}", GPUS_PER_NODE, GPU_MEMORY) for n in range(nodes)]
    )
    await create_all(
        plane,
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        [pod_manifest(f"gpu-{n:05d}-{size}g", size) for n, size in enumerate(sizes)],
    )


# ---- one run -------------------------------------------------------------------------------------------


class Run:
    """One control plane, one workload, one scheduler. Mutable: it owns processes until `stop()`."""

    def __init__(self, binaries: Path, workdir: Path, wiring: str, nodes: int, sizes: list[int]) -> None:
        self.wiring = wiring
        self.nodes = nodes
        self.sizes = sizes
        self.workdir = workdir
        self.plane = ControlPlane(binaries, workdir)
        self.extender: ExtenderProcess | None = None
        self.floor: Floor | None = None

    def measure(self) -> RunResult:
        binary = build_floor() if self.wiring in FLOORS else None  # before the clock: a cold build is not set-up
        started = time.perf_counter()
        try:
            self.plane.start()
            asyncio.run(create_workload(self.plane, self.nodes, self.sizes))
            if binary is not None:
                self._start_floor(binary)
            elif self.wiring != ALONE:
                self._start_extender()
            setup = time.perf_counter() - started
            return asyncio.run(self._schedule(setup))
        except (ControlPlaneError, ApiError, aiohttp.ClientError, OSError) as error:
            raise RunError(f"{self.wiring} run in {self.workdir}: {error}") from error
        finally:
            self.stop()

    def stop(self) -> None:
        if self.floor is not None:
            self.floor.process.stop()
        if self.extender is not None:
            self.extender.stop()
        self.plane.stop()

    def _start_extender(self) -> None:
        """`extender serve` with the Deployment's flags: leader election in its namespace, its own pod, the
        plain health port, JSON logs; mTLS on the verbs with `extender certs`' files. Kept in `self.extender`
        before it is waited for, so `stop()` stops it when it never becomes ready."""
        tls = make_certificates(self.workdir / "certs")
        own = {
            "metadata": {"name": EXTENDER_SELF, "namespace": EXTENDER_NAMESPACE},
            "spec": {"nodeName": "bench-00000", "containers": [{"name": "extender", "image": "registry.example/none"}]},
        }
        self.plane.request("POST", f"/api/v1/namespaces/{EXTENDER_NAMESPACE}/pods", own)
        flags = (
            "--lease-namespace", EXTENDER_NAMESPACE, "--pod-name", EXTENDER_SELF,
            "--health-port", str(free_port()), "--log-format", "json",
        )  # fmt: skip
        self.extender = ExtenderProcess("bench", self.workdir, self.plane.kubeconfig("extender"), tls, flags)
        self.extender.start()
        self.extender.wait_until(200, timeout=180)

    def _start_floor(self, binary: Path) -> None:
        """The floor on a free port with `extender certs`' files, binding as the extender's user (its token in a
        file, as a service account's is). Kept in `self.floor` before it is waited for, as the extender is."""
        tls = make_certificates(self.workdir / "certs")
        token = self.workdir / "floor-token"
        token.write_text(self.plane.users["extender"].token)
        port = free_port()
        argv = [
            str(binary), "-addr", f"127.0.0.1:{port}",
            "-tls-cert", str(tls.server_cert), "-tls-key", str(tls.server_key), "-client-ca", str(tls.ca),
            "-api", self.plane.url, "-api-ca", str(self.plane.ca_file), "-token-file", str(token),
        ]  # fmt: skip
        log = self.workdir / "floor.log"
        with log.open("ab") as output:
            popen = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.floor = Floor(Process("floor", popen, log), f"https://127.0.0.1:{port}", tls)
        deadline = time.monotonic() + FLOOR_STARTUP
        while b" serving " not in log.read_bytes():
            if popen.poll() is not None:
                raise self.floor.process.failure(f"exited with code {popen.returncode} before serving")
            if time.monotonic() > deadline:
                raise self.floor.process.failure(f"not serving after {FLOOR_STARTUP:.0f} s")
            time.sleep(0.05)

    def _processes(self) -> dict[str, int]:
        assert self.plane.etcd is not None and self.plane.apiserver is not None
        pids = {"etcd": self.plane.etcd.popen.pid, "kube-apiserver": self.plane.apiserver.popen.pid}
        if self.extender is not None and self.extender.popen is not None:
            pids["extender"] = self.extender.popen.pid
        if self.floor is not None:
            pids["extender"] = self.floor.process.popen.pid
        return pids

    def _cpu(self, pids: dict[str, int]) -> dict[str, float]:
        return {name: proc_cpu(pid) for name, pid in pids.items()} | {"bench": time.process_time()}

    async def _schedule(self, setup: float) -> RunResult:
        listed = await self.plane.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        binds: dict[str, float] = {}
        watcher = asyncio.create_task(self._watch_binds(listed["metadata"]["resourceVersion"], binds))
        config = self._scheduler_config()
        started = time.perf_counter()
        before = self._cpu(self._processes())
        starting = asyncio.create_task(asyncio.to_thread(self.plane.start_scheduler, with_client_rate(config)))
        try:
            await self._wait_for_binds(binds, watcher, starting)
            scheduler = await starting
            await asyncio.sleep(SETTLE)
            after = self._cpu(self._processes() | {"kube-scheduler": scheduler.pid})
            window = time.perf_counter() - started
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        pods = (await self.plane.list_pods(NAMESPACE))["items"]
        nodes = (await self.plane.api("GET", "/api/v1/nodes"))["items"]
        verb_ms, counts = await self._extender_figures()
        return RunResult(
            wiring=self.wiring,
            pace=pace(binds.values()),
            condition_pace=pace(time for time in map(condition_time, pods) if time is not None),
            cpu_ms_per_pod=cpu_ms_per_pod(before, after, len(binds)),
            # The floor's annotations are fixed values: its end check is the alone one.
            check=end_check(pods, nodes, with_extender=self.extender is not None),
            setup_seconds=setup,
            scheduling_seconds=max(binds.values(), default=started) - started,
            window_seconds=window,
            verb_ms=verb_ms,
            extender_counts=counts,
            connections=self.floor.connections() if self.floor is not None else counts.pop("connections", None),
        )

    def _scheduler_config(self) -> str:
        if self.floor is not None:
            return scheduler_config(self.plane.version, self.floor.url, self.floor.tls, self.wiring)
        if self.extender is not None:
            return scheduler_config(self.plane.version, self.extender.url, self.extender.tls, self.wiring)
        return ALONE_CONFIG

    async def _watch_binds(self, resource_version: str, binds: dict[str, float]) -> None:
        """Note when each pod is first seen bound (spec.nodeName set), on this process's monotonic clock, as the
        watch event arrives."""
        path = f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&resourceVersion={resource_version}"
        async with self.plane.watch(path, timeout=None) as events:
            async for event in events:
                arrived = time.perf_counter()
                pod = event["object"]
                if event["type"] == "ERROR":
                    raise RunError(f"the pod watch failed: {pod}")
                name = pod["metadata"]["name"]
                if pod["spec"].get("nodeName") and name not in binds:
                    binds[name] = arrived
        raise RunError("the API server closed the pod watch")

    async def _wait_for_binds(
        self, binds: dict[str, float], watcher: asyncio.Task[None], starting: asyncio.Task[Any]
    ) -> None:
        """Until every pod is bound; fails when the watch or a process stops, or no bind comes for a while."""
        seen, last_change = 0, time.monotonic()
        while len(binds) < len(self.sizes):
            await asyncio.sleep(0.1)
            if watcher.done():
                watcher.result()
            if starting.done():
                starting.result()
                self._check_alive()
            if len(binds) != seen:
                seen, last_change = len(binds), time.monotonic()
            elif time.monotonic() - last_change > STALL_TIMEOUT:
                raise RunError(
                    f"{len(self.sizes) - seen} of {len(self.sizes)} pods still pending, no bind for "
                    f"{STALL_TIMEOUT:.0f} s; logs in {self.workdir}"
                )

    def _check_alive(self) -> None:
        for process in self.plane.schedulers:
            if process.popen.poll() is not None:
                raise process.failure(f"exited with code {process.popen.returncode} while scheduling")
        if self.extender is not None and not self.extender.running():
            raise self.extender.failure("exited while scheduling")
        if self.floor is not None and self.floor.process.popen.poll() is not None:
            raise self.floor.process.failure(f"exited with code {self.floor.process.popen.returncode} while scheduling")

    async def _extender_figures(self) -> tuple[dict[str, float], dict[str, int]]:
        """Our extender's time in the handler per verb and its counts, from /metrics; none for alone or the floor."""
        if self.extender is None:
            return {}, {}
        text = await self.extender.metrics()
        sums: dict[str, float] = {}
        calls: dict[str, float] = {}
        counts: dict[str, int] = {}
        for kind, outcome, verb, value in re.findall(
            r'^extender_request_duration_seconds_(sum|count)\{outcome="(\w+)",verb="(\w+)"\} (\S+)$', text, re.M
        ):
            if outcome == "ok":
                (sums if kind == "sum" else calls)[verb] = float(value)
            elif kind == "count" and float(value):
                counts[f"{verb} {outcome}"] = int(float(value))
        accepted = re.search(r'^extender_http_connections_accepted_total\{listener="verbs"\} (\S+)$', text, re.M)
        if accepted is not None:
            counts["connections"] = int(float(accepted.group(1)))
        for outcome, value in re.findall(r'^extender_binds_total\{outcome="(\w+)"\} (\S+)$', text, re.M):
            if float(value):
                counts[f"bind {outcome}"] = int(float(value))
        verb_ms = {verb: sums.get(verb, 0.0) * 1000 / count for verb, count in calls.items() if count}
        return verb_ms, counts
