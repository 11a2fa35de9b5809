"""The Locust side of the load test: users that call the extender the way kube-scheduler does.

Why it exists: whether an extender is safe on the scheduling path depends on how it behaves at the cluster's
size and pace, under the scheduler's own call pattern. Each Locust user is a scheduling loop like
kube-scheduler's: one pod after the other, binds in the background. One loop is paced at `--user-rate` pods/s
(the runner gives each at most 100: a Python loop spends about 2 ms of its own per pod on a 2-core VM);
several loops make the target pace, `users x --user-rate` pods/s. More loops than kube-scheduler's one means
some pods are filtered concurrently, which is harsher on latency and bind conflicts than the real thing.
For each pod:

1. `POST /filter` with the pod (the one kube-scheduler really sent, under a fresh name and UID, asking a size
   drawn from `--mix`) and a window of node names: as many as the scheduler's adaptive
   `percentageOfNodesToScore` would look for (or `--names N`), starting where the previous pod's window ended.
2. `POST /prioritize` with the nodes that passed, when more than one did; the best score wins, ties at random.
3. `POST /bind` to the winner, in a greenlet of its own: binds overlap the next pods' filters, as they do in
   kube-scheduler. A bind refused because the pod "no longer fits" (another pod took the room between this
   one's filter and its bind) is a bind conflict: the pod is scheduled again, up to `--max-attempts` times,
   as the scheduler requeues it.

A request fails (and the run with it) on a connection error or timeout (`--http-timeout`, the scheduler's
`httpTimeout`), any status but 200, a body that is not the contract's, an `Error` in a filter reply, a filter
answering a name it was not asked, a prioritize reply that scores a node not asked, one twice, or out of 0..10
(a node left out scores 0, as kube-scheduler counts it; checked in full on one reply in `FULL_CHECK_EVERY`; the
others are only read for the best host), or a bind
`Error` other than a lost race. Every request is counted, and checked; latencies are kept at full resolution
(Locust's own table rounds to whole milliseconds) for the requests that start after `--warmup` seconds, when
connections are open and the server's per-node memos are filled, since the targets are about a sustained pace.
When the test stops, the pending binds are awaited and everything is written to `--results` for
`loadtest/run.py` to report and check.

It never talks to anything but `--host`, and only with the verbs and, unless `--node-names` lists them, a single
`GET /inspect` before the test starts, for the node names. Run it through `python -m loadtest.run`, which
starts the server and checks the end state; standalone, against a server already running,
`locust -f loadtest/locustfile.py --headless --host http://127.0.0.1:8080 -u 3 -r 3 -t 30s` works too.
"""

from __future__ import annotations

import collections
import gc
import logging
import random
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import orjson
from gevent.pool import Pool
from locust import FastHttpUser, constant_throughput, events, task
from locust.env import Environment

try:
    from loadtest import workload
except ImportError:  # `locust -f loadtest/locustfile.py` from another directory: the repo root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from loadtest import workload

log = logging.getLogger("loadtest")

JSON = {"Content-Type": "application/json"}
CONFLICT = "no longer fits"
"""What a bind's `Error` says when the room it was scored onto went to another pod first: a lost race, which
kube-scheduler answers by scheduling the pod again; any other bind `Error` is a failure of the run."""
MAX_ERROR_SAMPLES = 10
FULL_CHECK_EVERY = 20
"""One prioritize reply in this many is decoded and checked in full (only hosts asked, scores 0..10); the
others are read for the best host only (`workload.best_host_encoded`), which keeps the client's CPU down."""


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    group = parser.add_argument_group("extender load test")
    group.add_argument("--names", default="adaptive", help="Node names per filter: N, or 'adaptive' (the default).")
    group.add_argument("--mix", default=workload.DEFAULT_MIX, help="Pod sizes GiB:weight, comma-separated.")
    group.add_argument("--user-rate", type=float, default=100.0, help="Pods per second each user schedules.")
    group.add_argument("--max-attempts", type=int, default=3, help="Scheduling attempts per pod (bind conflicts).")
    group.add_argument("--http-timeout", type=float, default=5.0, help="Seconds: kube-scheduler's httpTimeout.")
    group.add_argument("--seed", type=int, default=1, help="Seed of pod sizes and tie breaks.")
    group.add_argument("--node-names", default="", help="File of node names, one per line (else: GET /inspect).")
    group.add_argument("--warmup", type=float, default=2.0, help="Seconds whose latencies are not kept (2).")
    group.add_argument("--results", default="", help="Write the results here as JSON when the test stops.")


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    uid: str
    size: int
    attempt: int = 1


@dataclass(slots=True)
class Run:
    """Everything the users share within this process: the workload and what happened. Mutable (greenlets
    are cooperative, so no locks)."""

    sample: workload.NodeSample
    mix: workload.PodMix
    bodies: workload.PodBodies
    rng: random.Random
    max_attempts: int
    binds: Pool = field(default_factory=Pool)
    retries: collections.deque[Pod] = field(default_factory=collections.deque)
    warmup: float = 0.0
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    """Per verb, in ms, of the requests that started after the warm-up."""
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    error_samples: list[str] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    placed: dict[str, str] = field(default_factory=dict)
    """Pod UID -> node, for every bind that succeeded."""
    pods: int = 0
    prioritized: int = 0
    started: float = 0.0
    cpu_started: float = 0.0
    cpu_peak: float = 0.0
    cpu_warnings: int = 0

    def new_pod(self) -> Pod:
        if self.retries:
            return self.retries.popleft()
        self.pods += 1
        # A UID from the OS, not from the seeded generator: the cluster generator draws its pods' UIDs from the
        # same seed, and a pod of ours sharing one would be "already bound" (it happened).
        return Pod(f"load-{self.pods:07d}", str(uuid.uuid4()), self.mix.draw(self.rng))


RUN: Run | None = None


def _node_names(host: str) -> list[str]:
    """The nodes the extender knows, from its /inspect: the list kube-scheduler would hold in its snapshot."""
    with urllib.request.urlopen(f"{host.rstrip('/')}/inspect", timeout=120) as response:
        nodes = orjson.loads(response.read())["nodes"]
    return sorted(node["name"] for node in nodes if node.get("known", True))


@events.test_start.add_listener
def _start(environment: Environment, **_: Any) -> None:
    global RUN
    options = environment.parsed_options
    assert options is not None and environment.host
    names = Path(options.node_names).read_text().split() if options.node_names else _node_names(environment.host)
    size = workload.nodes_to_find(len(names)) if options.names == "adaptive" else int(options.names)
    mix = workload.PodMix.parse(options.mix)
    RUN = Run(
        sample=workload.NodeSample(names, size),
        mix=mix,
        bodies=workload.PodBodies(mix.sizes),
        rng=random.Random(options.seed),
        max_attempts=options.max_attempts,
        warmup=options.warmup,
    )
    Scheduler.network_timeout = Scheduler.connection_timeout = options.http_timeout  # before users are made
    log.warning("%d nodes, %d names per filter, pods %s", len(names), RUN.sample.size, options.mix)
    # What Locust, gevent and the workload made so far lives until the end: out of the collector's way, so
    # its full collections (pauses a request in flight would be charged with) stay short.
    gc.collect()
    gc.freeze()
    RUN.started, RUN.cpu_started = time.perf_counter(), time.process_time()


@events.request.add_listener
def _request(name: str, response_time: float, exception: Exception | None = None, **_: Any) -> None:
    if RUN is None:
        return
    RUN.requests[name] += 1
    if time.perf_counter() - response_time / 1e3 - RUN.started >= RUN.warmup:
        RUN.latencies[name].append(response_time)
    if exception is not None:
        RUN.errors[name] += 1
        if len(RUN.error_samples) < MAX_ERROR_SAMPLES:
            RUN.error_samples.append(f"{name}: {exception}"[:500])


@events.usage_monitor.add_listener
def _usage(cpu_usage: float, **_: Any) -> None:
    if RUN is not None:
        RUN.cpu_peak = max(RUN.cpu_peak, cpu_usage)


@events.cpu_warning.add_listener
def _cpu_warning(**_: Any) -> None:
    if RUN is not None:
        RUN.cpu_warnings += 1


@events.test_stop.add_listener
def _stop(environment: Environment, **_: Any) -> None:
    if RUN is None:
        return
    pending = len(RUN.binds)
    RUN.binds.join(timeout=30)
    elapsed, cpu = time.perf_counter() - RUN.started, time.process_time() - RUN.cpu_started
    results = {
        "seconds": elapsed,
        "names_per_filter": RUN.sample.size,
        "nodes": len(RUN.sample.names),
        "pods": RUN.pods,
        "outcomes": dict(RUN.outcomes),
        "warmup_seconds": RUN.warmup,
        "verbs": {
            verb: {**workload.summarize(RUN.latencies[verb]), "requests": count, "errors": RUN.errors[verb]}
            for verb, count in RUN.requests.items()
        },
        "errors": sum(RUN.errors.values()),
        "error_samples": RUN.error_samples,
        "placed": RUN.placed,
        "binds_pending_at_stop": pending,
        "binds_unfinished": len(RUN.binds),
        "client_cpu_seconds": cpu,
        "client_cpu_peak_percent": RUN.cpu_peak,
        "client_cpu_warnings": RUN.cpu_warnings,
    }
    options = environment.parsed_options
    if options is not None and options.results:
        Path(options.results).write_bytes(orjson.dumps(results))


class Scheduler(FastHttpUser):
    """A scheduling loop like kube-scheduler's: filter, prioritize, and a bind that overlaps the next pod."""

    def on_start(self) -> None:
        options = self.environment.parsed_options
        assert options is not None
        self.pace = constant_throughput(options.user_rate)
        # Users start together; without a random phase their pods would arrive in bursts of `users`.
        gevent.sleep(random.random() / options.user_rate)

    def wait_time(self) -> float:
        return self.pace(self)

    @task
    def schedule(self) -> None:
        run = RUN
        assert run is not None
        pod = run.new_pod()
        names = run.sample.next()
        body = workload.args_body(run.bodies.render(pod.size, pod.name, pod.uid), names)
        verdict = self._filter(body, names)
        if verdict is None:
            return
        run.outcomes["attempts"] += 1  # counted once answered: a user stopped mid-filter attempted nothing
        passed, anywhere_now = verdict
        if not passed:
            run.outcomes["rejected"] += 1
            if not anywhere_now:
                run.outcomes["rejected_unresolvable"] += 1
            return
        if len(passed) == 1:
            node = passed[0]
        else:
            if len(passed) != len(names):  # kube-scheduler asks prioritize about the nodes that passed
                body = workload.args_body(run.bodies.render(pod.size, pod.name, pod.uid), passed)
            node = self._prioritize(body, passed, run)
            if node is None:
                return
        run.binds.spawn(self._bind, pod, node)

    def _filter(self, body: bytes, names: list[str]) -> tuple[list[str], bool] | None:
        """The names that passed, and whether any node could take the pod at all (passed or failed only
        for now); None when the request failed."""
        with self.client.post("/filter", data=body, headers=JSON, name="filter", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:300]}")
                return None
            try:
                reply = orjson.loads(response.content or b"")
                passed, failed = reply["NodeNames"], reply["FailedNodes"]
                error = reply.get("Error") or ""
                unasked = () if passed == names else set(passed).difference(names)
            except (orjson.JSONDecodeError, KeyError, TypeError) as problem:
                response.failure(f"not an ExtenderFilterResult: {problem!r}: {(response.text or '')[:300]}")
                return None
            if error or unasked:
                response.failure(error or f"answered names it was not asked: {sorted(unasked)[:5]}")
                return None
            return passed, bool(passed or failed)

    def _prioritize(self, body: bytes, passed: list[str], run: Run) -> str | None:
        with self.client.post(
            "/prioritize", data=body, headers=JSON, name="prioritize", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:300]}")
                return None
            run.prioritized += 1
            if run.prioritized % FULL_CHECK_EVERY:
                best = workload.best_host_encoded(response.content or b"", passed, run.rng)
                if best is not None:
                    return best
            try:
                priorities = orjson.loads(response.content or b"")
                hosts = {entry["Host"] for entry in priorities}
                scores_valid = all(0 <= int(entry["Score"]) <= 10 for entry in priorities)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as problem:
                response.failure(f"not a HostPriorityList: {problem!r}: {(response.text or '')[:300]}")
                return None
            if not hosts <= set(passed) or len(hosts) != len(priorities) or not scores_valid:
                response.failure(f"scores for other hosts, twice or out of 0..10: {(response.text or '')[:300]}")
                return None
            return workload.best_host(priorities, passed, run.rng)

    def _bind(self, pod: Pod, node: str) -> None:
        run = RUN
        assert run is not None
        body = workload.binding_body(pod.name, pod.uid, node)
        with self.client.post("/bind", data=body, headers=JSON, name="bind", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:300]}")
                return
            try:
                error = orjson.loads(response.content or b"")["Error"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as problem:
                response.failure(f"not an ExtenderBindingResult: {problem!r}: {(response.text or '')[:300]}")
                return
            if not error:
                run.placed[pod.uid] = node
                run.outcomes["placed"] += 1
            elif CONFLICT in error:
                run.outcomes["bind_conflicts"] += 1
                if pod.attempt < run.max_attempts:
                    run.retries.append(Pod(pod.name, pod.uid, pod.size, pod.attempt + 1))
                else:
                    run.outcomes["gave_up"] += 1
            else:
                response.failure(f"bind Error: {error}")
