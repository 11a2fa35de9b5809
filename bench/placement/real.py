"""The real mode of `make bench-placement`: the workload through a real kube-scheduler with `extender serve`
wired in as it ships, on the e2e tier's control plane. The figure of record.

One run: a fresh control plane (the cached etcd and kube-apiserver of `tests/e2e/build.sh`), the trace's nodes
created as Node objects (`trace.node_object`), `extender serve` started with the Deployment's flags (leader
election, its own pod, JSON logs, mTLS with `extender certs`' files) plus the run's own, kube-scheduler started
with the configuration `extender scheduler-config` renders (clientConnection qps and burst raised, as
scheduler_perf does, so its client never waits), and then the pods:

- **one at a time** (the paper's method): each pod is created, and the next one only once kube-scheduler has
  decided it: bound (a watch sees `spec.nodeName`), or refused (its `PodScheduled` condition turns False,
  Unschedulable), in which case it is deleted, as the paper's simulator drops a pod it cannot place, and the
  next pod waits for the deletion to be seen;
- **burst** (`burst=True`): every pod created pending before kube-scheduler starts; the run ends when every pod
  is bound or no bind has come for `BURST_QUIET` seconds, and the pods still pending then are the refused ones.
  What a saturated cluster places depends on how fast kube-scheduler goes through the pods it cannot place.

With a peer's binary (`peers.py`, `--peer`), the peer runs in place of `extender serve`, wired as its own docs
say; the rest of the run is the same.

In HAMi's protocol (`wire=hami.HAMI`: `--protocol hami`, or a HAMi peer) the nodes and pods are HAMi's, the
extender runs with `--protocol hami` and the node-patch right `manifests/hami/` adds, and the e2e tier's double
of HAMi's device plugin runs on every GPU node: it allocates each bound pod and releases the node lock its bind
took. One at a time, the next pod then waits for that allocation too.

A refusal that is not final (a node's lock named, or a scheduler error: the extender or peer not answering, a
bind that failed) is given `RETRY_GRACE` for kube-scheduler's retry, one at a time, as a cluster's pod would
only wait a moment (`_retry`); one still refused then counts as refused, its message among the reasons.

Outcomes come from the pod watch; the cluster at the end from the API's pods (their allocation annotations),
so the end check reads what a device plugin would. Nothing is left running: every process stops in `finally`,
and the work directory keeps every log.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from bench.e2e_run import EXTENDER_SELF, admin_session, create_all, make_certificates, run_command, with_client_rate
from bench.placement.outcome import Outcome, ReplayResult
from bench.placement.peers import Built, PeerProcess
from bench.placement.trace import GPUSHARE, NAMESPACE, Wire, Workload
from tests.e2e.controlplane import EXTENDER_NAMESPACE, ApiError, ControlPlane, free_port, hami_overlay_rules
from tests.e2e.deviceplugin import DevicePluginDouble
from tests.e2e.extender_process import ExtenderProcess

DECISION_TIMEOUT = 120.0
"""Seconds for kube-scheduler to bind or refuse one pod (one at a time) before the run is called failed."""
PLUGIN_DELAY = 0.01
"""Seconds from a binding to kubelet's first Allocate call, in a HAMi run (the e2e tests' 0.25 is a slow kubelet;
here the plugin only has to keep up, so that the node lock each bind takes is not what limits the pace)."""
SETTLE_TIMEOUT = 3600.0
"""Seconds a peer may take to settle after its start (hami-scheduler: its handshakes on every node)."""
RETRY_GRACE = 30.0
"""Seconds a pod whose refusal is not final is given to be decided when kube-scheduler tries it again: one
refused on a node's lock is tried again at the Node update that releases it, one that met a scheduler error
after kube-scheduler's back-off (1 s, doubled per try, at most 10 s), so that a few tries fit."""
LOCKED = re.compile(r"node is locked|node lock contention|has been locked")
"""A node's lock in a refusal: ours' filter reason, hami-scheduler's bind error."""
BURST_QUIET = 30.0
"""Seconds without a bind, with pods still pending, after which a burst is over."""
MEMORY_UNIT = "milli-GPU"
"""How the extender's messages name a unit of aliyun.com/gpu-mem here (1000 per GPU)."""
T = TypeVar("T")
_HISTOGRAM = re.compile(r"^0/\d+ nodes are available: (?P<body>.*?)\.?(?: preemption: .*)?$", re.S)


class RealError(RuntimeError):
    """A run could not finish: a process stopped, the API refused something, or a decision never came."""


def unschedulable_reasons(message: str) -> dict[str, int]:
    """kube-scheduler's FitError message as {reason: nodes}: "0/3 nodes are available: 1 Insufficient cpu, 2
    needs 470 ... . preemption: ..." -> {"Insufficient cpu": 1, "needs 470 ...": 2}."""
    match = _HISTOGRAM.match(message.strip())
    if match is None:
        return {message.strip() or "unknown": 1}
    reasons: dict[str, int] = {}
    for part in re.split(r", (?=\d+ )", match.group("body")):
        count, _, reason = part.partition(" ")
        if count.isdigit():
            reasons[reason.strip()] = reasons.get(reason.strip(), 0) + int(count)
    return reasons


def refusal(pod: dict[str, Any]) -> tuple[str, bool] | None:
    """The message of the pod's PodScheduled=False condition (refused by the scheduler) and whether the refusal
    is final, else None. Not final: a scheduler error (reason SchedulerError: an extender that did not answer, a
    bind that failed), which kube-scheduler retries after its back-off, or a refusal naming a node's lock."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        reason = condition.get("reason")
        refused = condition.get("status") == "False" and reason in ("Unschedulable", "SchedulerError")
        if condition.get("type") == "PodScheduled" and refused:
            message = str(condition.get("message") or reason)
            return message, reason == "Unschedulable" and not LOCKED.search(message)
    return None


@dataclass(slots=True)
class Seen:
    """What the pod watch has shown of each pod, by name. Mutable."""

    bound: dict[str, str] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    retried: set[str] = field(default_factory=set)
    """The pods whose last refusal is not final (`refusal`)."""
    deleted: set[str] = field(default_factory=set)
    bind_times: list[float] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class RealReplay:
    """One control plane, one extender, one kube-scheduler, one workload. Mutable: owns processes until `stop`."""

    def __init__(
        self,
        binaries: Path,
        workdir: Path,
        workload: Workload,
        extender_flags: Sequence[str] = (),
        config_flags: Sequence[str] = (),
        scheduler_name: str = "gpu-scheduler",
        burst: bool = False,
        progress: Callable[[str], None] | None = None,
        peer: Built | None = None,
        wire: Wire = GPUSHARE,
    ) -> None:
        self.workload = workload
        self.wire = wire
        """The device protocol the nodes and pods speak (`trace.GPUSHARE`, or `hami.HAMI`: then the extender
        runs with `--protocol hami`, and a double of HAMi's device plugin allocates on every node)."""
        self.workdir = workdir
        self.extender_flags = list(extender_flags)
        self.config_flags = list(config_flags)
        self.scheduler_name = scheduler_name
        self.burst = burst
        self.progress = progress or (lambda _: None)
        self.plane = ControlPlane(binaries, workdir)
        self.extender: ExtenderProcess | None = None
        self.peer_built = peer
        """A peer (`peers.py`), run in place of `extender serve` (which then is not started)."""
        self.peer: PeerProcess | None = None
        self.config = ""
        """The scheduler configuration the run used."""

    def run(self) -> ReplayResult:
        return self._run(self._replay)

    def _run(self, replay: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """The control plane, the nodes and the extender started, `replay` run, everything stopped."""
        try:
            self.plane.start()
            nodes = [self.wire.node_object(node) for node in self.workload.nodes]
            asyncio.run(create_all(self.plane, "/api/v1/nodes", nodes))
            self._start_extender()
            return asyncio.run(replay())
        finally:
            self.stop()

    def stop(self) -> None:
        if self.extender is not None:
            self.extender.stop()
        if self.peer is not None:
            self.peer.stop()
        self.plane.stop()

    def _start_extender(self) -> None:
        if self.peer_built is not None:
            self.peer = self.peer_built.process(self.workdir, self.plane.kubeconfig("admin"))
            self.peer.start()
            self._until_settled(self.peer)
            return
        tls = make_certificates(self.workdir / "certs")
        own = {
            "metadata": {"name": EXTENDER_SELF, "namespace": EXTENDER_NAMESPACE},
            "spec": {"nodeName": self.workload.nodes[0].name, "containers": [{"name": "extender", "image": "none"}]},
        }
        self.plane.request("POST", f"/api/v1/namespaces/{EXTENDER_NAMESPACE}/pods", own)
        if self.wire is not GPUSHARE:  # what manifests/hami/ adds: the node lock is a patch of the Node
            self.plane.grant("hami-extender", hami_overlay_rules(), {})
        flags = (
            "--lease-namespace", EXTENDER_NAMESPACE, "--pod-name", EXTENDER_SELF,
            "--health-port", str(free_port()), "--log-format", "json", *self._protocol_flags(serve=True),
            *self.extender_flags,
        )  # fmt: skip
        self.extender = ExtenderProcess("placement", self.workdir, self.plane.kubeconfig("extender"), tls, flags)
        self.extender.start()
        self.extender.wait_until(200, timeout=300)

    def _until_settled(self, peer: PeerProcess) -> None:
        """Wait until the peer has done what it does once at its start (`PeerProcess.settled`), at most
        `SETTLE_TIMEOUT`, saying what it is doing every minute."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        said = 0.0
        while doing := peer.settled(self.plane.request("GET", "/api/v1/nodes")["items"]):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RealError(f"{peer.name} still not settled after {SETTLE_TIMEOUT:.0f} s: {doing}")
            if time.monotonic() - said >= 60:
                self.progress(f"waiting for {peer.name} to settle: {doing}")
                said = time.monotonic()
            time.sleep(2.0)

    def _render_config(self) -> str:
        if self.peer is not None:
            return with_client_rate(self.peer.config(self.scheduler_name))
        assert self.extender is not None
        tls = self.extender.tls
        rendered = run_command(
            "scheduler-config", "--k8s-version", self.plane.version, "--url", self.extender.url,
            "--scheduler-ca-file", str(tls.ca),
            "--scheduler-cert-file", str(tls.client_cert), "--scheduler-key-file", str(tls.client_key),
            *self._protocol_flags(serve=False), *self.config_flags,
        )  # fmt: skip
        return with_client_rate(rendered)

    def _protocol_flags(self, serve: bool) -> tuple[str, ...]:
        if self.wire is GPUSHARE:
            return ("--memory-unit", MEMORY_UNIT) if serve else ()
        return ("--protocol", self.wire.name)

    @contextlib.asynccontextmanager
    async def _device_plugin(self) -> AsyncIterator[DevicePluginDouble | None]:
        """HAMi's device plugin on every GPU node (tests/e2e/deviceplugin.py: it allocates a bound pod and
        releases the node lock its bind took, as the real plugin's Allocate does), for a HAMi run; else none."""
        if self.wire is GPUSHARE:
            yield None
            return
        gpu_nodes = [node.name for node in self.workload.nodes if node.gpus]
        async with DevicePluginDouble(self.plane, gpu_nodes, delay=PLUGIN_DELAY).running() as plugin:
            yield plugin

    @staticmethod
    def _plugin_problems(plugin: DevicePluginDouble | None) -> list[str]:
        if plugin is None:
            return []
        refused = [f"HAMi's device plugin refused {refusal.pod}: {refusal.reason}" for refusal in plugin.refused]
        return [*plugin.violations, *refused]

    async def _replay(self) -> ReplayResult:
        self.config = self._render_config()
        listed = await self.plane.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        seen = Seen()
        watcher = asyncio.create_task(self._watch(listed["metadata"]["resourceVersion"], seen))
        started = time.perf_counter()
        try:
            async with self._device_plugin() as plugin:
                if self.burst:
                    outcomes, started = await self._burst(seen, watcher)
                else:
                    await asyncio.to_thread(self.plane.start_scheduler, self.config)
                    started = time.perf_counter()
                    outcomes = await self._one_at_a_time(seen, watcher, plugin)
                seconds = time.perf_counter() - started
                await self._allocated(plugin, seen, watcher)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        pods = (await self.plane.list_pods(NAMESPACE))["items"]
        mode = "burst" if self.burst else "real"
        result = ReplayResult.from_api(mode, self.workload, outcomes, pods, seconds, self.wire)
        result.problems += self._plugin_problems(plugin)
        result.verb_seconds = await self._verb_seconds()
        decided = len(outcomes)
        if seen.bind_times and self.burst:
            span = max(seen.bind_times) - min(seen.bind_times)
            result.extra["pods_per_second"] = len(seen.bind_times) / span if span > 0 else 0.0
        elif seconds > 0:
            result.extra["pods_per_second"] = decided / seconds
        result.extra["config"] = self.config
        if self.peer is not None:
            result.extra["peer_crashes"] = list(self.peer.crashes)
            result.extra["peer_exited_at"] = self.peer.exited_at(time.perf_counter() - started)
        return result

    async def _one_at_a_time(
        self, seen: Seen, watcher: asyncio.Task[None], plugin: DevicePluginDouble | None
    ) -> list[Outcome]:
        """Each pod created once the one before is decided, and, in a HAMi run, allocated by the plugin: its bind
        holds the node's lock until then, and a pod that arrived meanwhile would find the node locked (refused by
        our filter, or its bind refused by hami-scheduler's) and be dropped, where in a cluster it would only
        wait a moment."""
        outcomes: list[Outcome] = []
        async with admin_session(self.plane) as session:
            for index, pod in enumerate(self.workload.pods):
                body = self.wire.pod_object(pod, self.scheduler_name)
                name = body["metadata"]["name"]
                await self._post(session, f"/api/v1/namespaces/{NAMESPACE}/pods", body)
                decided = lambda n=name: n in seen.bound or n in seen.refused  # noqa: E731
                await self._until(seen, watcher, decided, f"pod {name}: a decision")
                if name not in seen.bound and name in seen.retried:
                    await self._retry(seen, watcher, name)
                if name in seen.bound:
                    outcomes.append(Outcome(pod, seen.bound[name]))
                    if plugin is not None and pod.gpus:
                        await self._admitted(plugin, seen, watcher, name)
                else:
                    outcomes.append(Outcome(pod, "", unschedulable_reasons(seen.refused[name])))
                    await self._delete(session, name)
                    gone = lambda n=name: n in seen.deleted  # noqa: E731
                    await self._until(seen, watcher, gone, f"pod {name}: its deletion")
                if index % 500 == 0:
                    bound = sum(1 for outcome in outcomes if outcome.node)
                    self.progress(f"{index:,} of {len(self.workload.pods):,} pods decided, {bound:,} bound")
        return outcomes

    async def _burst(self, seen: Seen, watcher: asyncio.Task[None]) -> tuple[list[Outcome], float]:
        bodies = [self.wire.pod_object(pod, self.scheduler_name) for pod in self.workload.pods]
        await create_all(self.plane, f"/api/v1/namespaces/{NAMESPACE}/pods", bodies)
        await asyncio.to_thread(self.plane.start_scheduler, self.config)
        started = time.perf_counter()
        last, count = time.monotonic(), 0
        while len(seen.bound) < len(bodies):
            await asyncio.sleep(0.5)
            if watcher.done():
                watcher.result()
                raise RealError("the pod watch ended")
            self._check_alive()
            if len(seen.bound) != count:
                last, count = time.monotonic(), len(seen.bound)
                self.progress(f"{count:,} of {len(bodies):,} pods bound")
            elif time.monotonic() - last > BURST_QUIET:
                break
        pods = {pod["metadata"]["name"]: pod for pod in (await self.plane.list_pods(NAMESPACE))["items"]}
        outcomes = []
        for trace_pod, body in zip(self.workload.pods, bodies, strict=True):
            name = body["metadata"]["name"]
            node = seen.bound.get(name, "")
            message = (refusal(pods.get(name, {})) or ("pending: not yet tried again when the burst ended",))[0]
            outcomes.append(Outcome(trace_pod, node, {} if node else unschedulable_reasons(message)))
        return outcomes, started

    async def _retry(self, seen: Seen, watcher: asyncio.Task[None], name: str) -> None:
        """A refusal that is not final (a node's lock named, HAMi's, held until its plugin has allocated the pod
        before; or a scheduler error) is followed by kube-scheduler's retry. Wait `RETRY_GRACE` seconds for a
        try that binds the pod or refuses it for good; without one, the last refusal stands."""
        refusal = seen.refused.pop(name)

        def decided() -> bool:
            return name in seen.bound or (name in seen.refused and name not in seen.retried)

        if not await self._until(seen, watcher, decided, f"pod {name}", RETRY_GRACE, poll=0.05, must=False):
            seen.refused.setdefault(name, refusal)

    async def _admitted(self, plugin: DevicePluginDouble, seen: Seen, watcher: asyncio.Task[None], name: str) -> None:
        """Wait for the plugin double to have allocated the pod bound (and released its node's lock); a failure of
        the double on it ends the run at once, saying what failed."""
        uid, before = seen.uids[name], len(plugin.violations)
        failing = f"the double failed on {NAMESPACE}/{name} "  # its `_kubelet`: an API call failed it
        failed = lambda: [finding for finding in plugin.violations[before:] if finding.startswith(failing)]  # noqa: E731
        what = f"pod {name}: its allocation by HAMi's device plugin double (its lock released)"
        await self._plugin_wait(plugin, seen, watcher, lambda: plugin.admitted(uid) or bool(failed()), what, 0.005)
        if failed():
            raise RealError(f"{what}: {failed()[0]}; logs in {self.workdir}")

    async def _allocated(self, plugin: DevicePluginDouble | None, seen: Seen, watcher: asyncio.Task[None]) -> None:
        """Wait for the plugin to have allocated every pod bound (its allocation is what the end check reads), but
        for the pods deleted since: one refused, and so deleted, may have been bound all the same by
        kube-scheduler's retry in between (its refusal on the nodes sampled is not final when it sampled some),
        and the double allocates no pod that is gone."""
        if plugin is None:
            return
        asking = {pod.name.lower() for pod in self.workload.pods if pod.gpus}
        bound = sum(1 for name in seen.bound if name in asking and name not in seen.deleted)
        what = "HAMi's device plugin double allocating every pod bound"
        await self._plugin_wait(plugin, seen, watcher, lambda: len(plugin.allocations) >= bound, what, 0.2)

    async def _plugin_wait(
        self, plugin: DevicePluginDouble, seen: Seen, watcher: asyncio.Task[None], done: Callable[[], bool], what: str,
        poll: float,
    ) -> None:  # fmt: skip
        """`_until` for the plugin double, whose failures are in its records, not in the processes' logs: a wait
        that runs out says the last of them."""
        try:
            await self._until(seen, watcher, done, what, poll=poll)
        except RealError as error:
            if plugin.violations:
                raise RealError(f"{error}; the double's last findings: {'; '.join(plugin.violations[-3:])}") from None
            raise

    async def _post(self, session: Any, path: str, body: dict[str, Any]) -> None:
        async with session.post(
            self.plane.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        ) as answer:
            if answer.status >= 300:
                raise ApiError("POST", path, answer.status, await answer.read())

    async def _delete(self, session: Any, name: str) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
        async with session.delete(
            self.plane.url + path,
            data=orjson.dumps({"gracePeriodSeconds": 0}),
            headers={"Content-Type": "application/json"},
        ) as answer:
            if answer.status >= 300 and answer.status != 404:
                raise ApiError("DELETE", path, answer.status, await answer.read())

    async def _until(
        self,
        seen: Seen,
        watcher: asyncio.Task[None],
        done: Callable[[], bool],
        what: str,
        timeout: float = DECISION_TIMEOUT,
        poll: float = 1.0,
        must: bool = True,
    ) -> bool:
        """Wait until `done()`, looked at on every pod event and at least every `poll` seconds (what is not a pod
        event, as a Node update, is polled), the processes and the watch checked meanwhile. After `timeout`: a
        RealError naming `what` when it `must` come, else False."""
        deadline = time.monotonic() + timeout
        while not done():
            if watcher.done():
                watcher.result()
                raise RealError("the pod watch ended")
            self._check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                if not must:
                    return False
                raise RealError(f"{what}: not within {timeout:.0f} s; logs in {self.workdir}")
            seen.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(seen.changed.wait(), min(left, poll))
        return True

    def _check_alive(self) -> None:
        for process in self.plane.schedulers:
            if process.popen.poll() is not None:
                raise RealError(f"kube-scheduler exited with code {process.popen.returncode}; logs in {self.workdir}")
        if self.extender is not None and not self.extender.running():
            raise RealError(f"the extender exited; logs in {self.workdir}")
        if self.peer is not None:
            self.peer.revive()  # as kubelet restarts its container

    async def _pod_events(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The pod watch of the workload's namespace from `resource_version`: (event type, pod), until it fails
        (a RealError). The API server ends a watch after its request timeout (30 to 60 minutes: a slow peer's
        run lasts longer): it is opened again from the last version seen, as an informer does, with bookmarks so
        that version stays recent when nothing changes; a watch that ends at once, three times running, fails."""
        quick = 0
        while True:
            path = (
                f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&allowWatchBookmarks=true"
                f"&resourceVersion={resource_version}"
            )
            opened = time.monotonic()
            async with self.plane.watch(path, timeout=None) as events:
                async for event in events:
                    if event["type"] == "ERROR":
                        raise RealError(f"the pod watch failed: {event['object']}")
                    resource_version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        yield event["type"], event["object"]
            quick = quick + 1 if time.monotonic() - opened < 1.0 else 0
            if quick >= 3:
                raise RealError("the API server closed the pod watch three times at once")

    async def _watch(self, resource_version: str, seen: Seen) -> None:
        async for kind, pod in self._pod_events(resource_version):
            name = pod["metadata"]["name"]
            if kind == "DELETED":
                seen.deleted.add(name)
            elif (pod.get("spec") or {}).get("nodeName"):
                if name not in seen.bound:
                    seen.uids[name] = pod["metadata"]["uid"]
                    seen.bound[name] = pod["spec"]["nodeName"]
                    seen.bind_times.append(time.perf_counter())
            else:
                found = self._refusal(pod)
                if found is not None:
                    seen.refused[name] = found[0]
                    (seen.retried.discard if found[1] else seen.retried.add)(name)
            seen.changed.set()

    def _refusal(self, pod: dict[str, Any]) -> tuple[str, bool] | None:
        """The pod's refusal and whether it is final (`refusal`); a replay whose pods wait for others in other
        ways says so here."""
        return refusal(pod)

    async def _verb_seconds(self) -> dict[str, float]:
        """Seconds in the extender's handlers per verb, from its latency histograms."""
        if self.extender is None:
            return {}
        text = await self.extender.metrics()
        seconds: dict[str, float] = {}
        for verb, value in re.findall(
            r'^extender_request_duration_seconds_sum\{outcome="ok",verb="(\w+)"\} (\S+)$', text, re.M
        ):
            seconds[verb] = seconds.get(verb, 0.0) + float(value)
        return seconds
