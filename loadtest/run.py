"""`make loadtest`: a bounded, headless Locust run against a server it starts itself, and the checks after it.

Why it exists: the numbers that say the extender keeps up with kube-scheduler (requests/s, p50/p95/p99 per
verb, errors, pods placed, the server's CPU and memory) must come from one command anyone can run, and the
run must prove it left the cluster consistent. Steps:

1. Generate the cluster (`devtools.clustergen`: N nodes, GPUs and memory per GPU from the given choices, an
   initial fill) into a temporary directory, with the node names in a file for the Locust users.
2. Start `extender serve --cluster FILE --insecure-http` on 127.0.0.1 as a subprocess (it dies with this
   process: PR_SET_PDEATHSIG) and wait for /readyz.
3. Run Locust headless as a subprocess (`loadtest/locustfile.py`) for the duration, one user (a scheduling
   loop) per 100 pods/s of the target by default, `users x rate per user = target pods/s`, and read the
   results it writes (latencies at full resolution after the warm-up, outcomes, its own CPU).
4. Measure the server around the run: CPU from its own clock (/proc/<pid>/task/*/schedstat), resident memory
   (VmRSS, VmHWM), and the server-side latency histogram from /metrics.
5. Check the end state through `GET /inspect`: no GPU holds more than its capacity, each GPU's `used` is the
   sum of its pods, nothing is left `reserved` (with a cluster file a successful bind is observed at once),
   the pods holding memory are exactly the generated ones plus the binds that succeeded, each on the node it
   was bound to.

It exits non-zero when any request errored, a bind was still unanswered, or an end check failed; it never fails
on a latency (the smoke test in `make test` runs it, and must not flake). `--find-saturation` steps the rate up,
a fresh server per step, until the p99 of some verb passes the limit (50 ms), errors appear, or the target
pace is not reached, and reports the last rate that held and the first that did not.

It only ever talks to 127.0.0.1, every run is bounded in time (subprocess timeouts) and in count, and it
never leaves a server or a Locust process behind. It never imports Locust or gevent itself: their
monkey-patching stays in Locust's own process.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from bench import record as recording
from devtools.clustergen import generate, write
from devtools.harness import HOST, HarnessError, ServedExtender, die_with_parent, machine, served_extender
from loadtest.workload import DEFAULT_MIX, MEMORY_RESOURCE, NAMESPACE, PodMix, nodes_to_find

COUNT_RESOURCE = "aliyun.com/gpu-count"
ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
VERBS = ("filter", "prioritize", "bind")
SATURATION_STEPS = (100, 200, 300, 400, 500, 600, 800, 1000, 1200)
TARGET_RATE, TARGET_NAMES, TARGET_P99_MS = 300, 1000, 5.0
"""The issue's target: at a sustained 300 pods/s with 1,000 node names per call, zero errors and the p99 of every
verb under 5 ms (reported, never enforced)."""
STOP_TIMEOUT = 5
"""Seconds Locust lets a user finish the pod it is scheduling when the time is up."""


class LoadTestError(Exception):
    """The server or Locust would not start, or died, or answered what it should not have."""


# --- the server under test --------------------------------------------------------------------------------


def latency_buckets(server: ServedExtender) -> dict[str, dict[float, float]]:
    """Cumulative counts of the server's own latency histogram per verb (all outcomes), by upper bound."""
    status, body = server.get("/metrics")
    if status != 200:
        raise LoadTestError(f"/metrics answered {status}")
    buckets: dict[str, dict[float, float]] = {}
    for line in body.decode().splitlines():
        if not line.startswith("extender_request_duration_seconds_bucket{"):
            continue
        labels, _, value = line.rpartition(" ")
        fields = dict(part.split("=", 1) for part in labels[labels.index("{") + 1 : -1].split(","))
        verb, bound = fields["verb"].strip('"'), float(fields["le"].strip('"'))
        per_verb = buckets.setdefault(verb, {})
        per_verb[bound] = per_verb.get(bound, 0.0) + float(value)
    return buckets


def server_p99_bound(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]], verb: str) -> float:
    """The smallest histogram bound (ms) under which 99% of the run's requests of `verb` were answered."""
    counts = {
        bound: after.get(verb, {}).get(bound, 0.0) - before.get(verb, {}).get(bound, 0.0)
        for bound in after.get(verb, {})
    }
    total = counts.get(math.inf, 0.0)
    if not total:
        return 0.0
    return next(bound for bound in sorted(counts) if counts[bound] >= 0.99 * total) * 1e3


# --- one run ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    nodes: int
    rate: float
    duration: int
    names: str = "adaptive"
    mix: str = DEFAULT_MIX
    gpus: tuple[int, ...] = (8,)
    memory: tuple[int, ...] = (16, 24, 40, 80)
    fill: float = 0.3
    seed: int = 1
    users: int = 0
    user_rate: float = 100.0
    http_timeout: float = 5.0
    max_attempts: int = 3
    warmup: float = 2.0
    server_flags: tuple[str, ...] = ()
    """More flags of `extender serve` (another policy measured the same way: `--placement=fill`)."""

    @property
    def user_count(self) -> int:
        return self.users or max(1, math.ceil(self.rate / self.user_rate))


@dataclass(slots=True)
class Cluster:
    file: Path
    names_file: Path
    nodes: int
    gpus: int
    pods: int
    free_memory: int
    """GiB of GPU memory not yet held by a pod."""


@dataclass(slots=True)
class Result:
    plan: Plan
    locust: dict[str, Any]
    server_cpu: float
    server_ready_seconds: float
    memory_before: dict[str, int]
    memory_after: dict[str, int]
    server_p99_ms: dict[str, float]
    server_log_errors: list[str]
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return float(self.locust["seconds"]) or 1e-9

    @property
    def requests(self) -> int:
        return sum(int(verb["requests"]) for verb in self.locust["verbs"].values())

    @property
    def errors(self) -> int:
        return int(self.locust["errors"]) + int(self.locust["binds_unfinished"])

    @property
    def attempts_per_second(self) -> float:
        return int(self.locust["outcomes"].get("attempts", 0)) / self.seconds

    @property
    def server_busy(self) -> float:
        """Server CPU seconds per second of load: the fraction of one core it used."""
        return self.server_cpu / self.seconds

    @property
    def client_busy(self) -> float:
        """Locust's CPU seconds per second of load."""
        return float(self.locust["client_cpu_seconds"]) / self.seconds

    @property
    def passed(self) -> bool:
        return self.errors == 0 and not self.server_log_errors and all(ok for _, ok, _ in self.checks)

    def p99(self, verb: str) -> float:
        return float(self.locust["verbs"].get(verb, {}).get("p99", 0.0))


def make_cluster(plan: Plan, workdir: Path) -> Cluster:
    objects = generate(plan.nodes, plan.gpus, plan.memory, plan.fill, plan.seed)
    cluster_file = workdir / f"cluster-{plan.nodes}.json"
    write(objects, cluster_file)
    nodes = [item for item in objects if item["kind"] == "Node"]
    names_file = workdir / f"names-{plan.nodes}.txt"
    names_file.write_text("\n".join(sorted(node["metadata"]["name"] for node in nodes)) + "\n")
    capacity = sum(int(node["status"]["capacity"][MEMORY_RESOURCE]) for node in nodes)
    used = sum(
        int(container["resources"]["limits"][MEMORY_RESOURCE])
        for item in objects
        if item["kind"] == "Pod"
        for container in item["spec"]["containers"]
    )
    gpus = sum(int(node["status"]["capacity"][COUNT_RESOURCE]) for node in nodes)
    return Cluster(cluster_file, names_file, len(nodes), gpus, len(objects) - len(nodes), capacity - used)


def run_locust(plan: Plan, port: int, cluster: Cluster, workdir: Path, tag: str) -> dict[str, Any]:
    users = plan.user_count
    results, log_file = workdir / f"locust-{tag}.json", workdir / f"locust-{tag}.log"
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--host", f"http://{HOST}:{port}", "--users", str(users), "--spawn-rate", str(users * 10),
        "--run-time", f"{plan.duration}s", "--stop-timeout", str(STOP_TIMEOUT), "--loglevel", "WARNING",
        "--names", plan.names, "--mix", plan.mix, "--user-rate", repr(plan.rate / users),
        "--max-attempts", str(plan.max_attempts), "--http-timeout", repr(plan.http_timeout),
        "--seed", str(plan.seed), "--warmup", repr(plan.warmup), "--node-names", str(cluster.names_file),
        "--results", str(results),
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        try:
            process.wait(timeout=plan.duration + STOP_TIMEOUT + 90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise LoadTestError(f"locust did not finish in time:\n{log_file.read_text()[-3000:]}") from None
    if not results.exists():
        raise LoadTestError(f"locust exited with {process.returncode} and no results:\n{log_file.read_text()[-3000:]}")
    locust: dict[str, Any] = orjson.loads(results.read_bytes())
    locust["log"] = log_file.read_text(errors="replace")
    return locust


def end_checks(inspect: dict[str, Any], cluster: Cluster, placed: dict[str, str]) -> list[tuple[str, bool, str]]:
    """What /inspect says after the run, against what the run did."""
    over, mismatched, stuck = [], [], []
    holders: dict[str, str] = {}
    ours: dict[str, str] = {}
    for node in inspect["nodes"]:
        for device in node["devices"]:
            where = f"{node['name']} GPU {device['index']}"
            if device["used"] > device["capacity"]:
                over.append(f"{where}: {device['used']} > {device['capacity']}")
            if device["used"] != sum(pod["memory"] for pod in device["pods"]):
                mismatched.append(f"{where}: used {device['used']}, pods {sum(p['memory'] for p in device['pods'])}")
            for pod in device["pods"]:
                if pod["state"] != "observed":
                    stuck.append(f"{pod['pod']} on {where}: {pod['state']}")
                holders[pod["uid"]] = node["name"]
                if str(pod["pod"]).startswith(f"{NAMESPACE}/"):
                    ours[pod["uid"]] = node["name"]
    expected = cluster.pods + len(placed)
    wrong_node = [uid for uid, node in placed.items() if ours.get(uid) != node]
    extra = sorted(set(ours) - set(placed))
    return [
        ("no GPU over capacity", not over, f"{len(over)} over" if over else f"{cluster.gpus:,} GPUs within capacity"),
        ("each GPU's used = its pods", not mismatched, "; ".join(mismatched[:3]) or "all GPUs agree"),
        (
            "no reservation left",
            not stuck and inspect.get("reservations", 0) == 0,
            "; ".join(stuck[:3]) or f"all holders observed, {inspect.get('reservations', 0)} reservations",
        ),
        (
            "pods holding memory = initial + placed",
            len(holders) == expected,
            f"{len(holders):,} holding, {cluster.pods:,} initial + {len(placed):,} placed = {expected:,}",
        ),
        (
            "each placed pod on its node, nothing else of ours",
            not wrong_node and not extra,
            f"{len(wrong_node)} missing or elsewhere, {len(extra)} unexpected"
            if wrong_node or extra
            else f"{len(placed):,} placed pods where they were bound",
        ),
    ]


def run_once(plan: Plan, cluster: Cluster, workdir: Path, tag: str) -> Result:
    log_file = workdir / f"server-{tag}.log"
    with served_extender(cluster.file, log_file, ("--insecure-http", *plan.server_flags)) as server:
        ready = server.wait_ready()
        memory_before, buckets_before = server.memory(), latency_buckets(server)
        cpu_before = server.cpu_seconds()
        locust = run_locust(plan, server.port, cluster, workdir, tag)
        cpu = server.cpu_seconds() - cpu_before
        if server.process.poll() is not None:
            raise LoadTestError(f"server died during the run:\n{server.log_tail()}")
        memory_after, buckets_after = server.memory(), latency_buckets(server)
        status, body = server.get("/inspect")
        if status != 200:
            raise LoadTestError(f"/inspect answered {status}: {body[:300]!r}")
        inspect = orjson.loads(body)
    log_errors = [line for line in log_file.read_text(errors="replace").splitlines() if "ERROR" in line]
    result = Result(
        plan,
        locust,
        cpu,
        ready,
        memory_before,
        memory_after,
        {verb: server_p99_bound(buckets_before, buckets_after, verb) for verb in VERBS},
        log_errors,
    )
    result.checks = end_checks(inspect, cluster, locust["placed"])
    return result


# --- report -----------------------------------------------------------------------------------------------


def describe(plan: Plan, cluster: Cluster, names: int, steps: bool = False) -> str:
    pace = (
        f"{plan.duration} s per step, one Locust user per {plan.user_rate:g} pods/s"
        if steps
        else f"target {plan.rate:g} pods/s for {plan.duration} s, {plan.user_count} Locust users"
    )
    return (
        f"{cluster.nodes:,} nodes ({cluster.gpus:,} GPUs, {cluster.pods:,} pods at {plan.fill:.0%} fill), {pace}, "
        f"{names:,} node names per filter{' (adaptive, as kube-scheduler)' if plan.names == 'adaptive' else ''}, "
        f"pods {plan.mix} (GiB:weight)"
        + (f", extender serve {' '.join(plan.server_flags)}" if plan.server_flags else "")
    )


def report(result: Result, cluster: Cluster) -> str:
    locust, seconds = result.locust, result.seconds
    outcomes = locust["outcomes"]
    lines = [
        f"## extender load test: {describe(result.plan, cluster, int(locust['names_per_filter']))}",
        "",
        "| verb | requests | req/s | p50 ms | p95 ms | p99 ms | max ms | server p99 ≤ ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for verb in VERBS:
        stats = locust["verbs"].get(verb)
        if stats is None:
            continue
        lines.append(
            f"| {verb} | {stats['requests']:,} | {stats['requests'] / seconds:,.0f} | {stats['p50']:.2f} "
            f"| {stats['p95']:.2f} | {stats['p99']:.2f} | {stats['max']:.1f} | {result.server_p99_ms[verb]:g} "
            f"| {stats['errors']} |"
        )
    attempts = int(outcomes.get("attempts", 0))
    placed = int(outcomes.get("placed", 0))
    before, after = result.memory_before, result.memory_after
    lines += [
        "",
        f"- latencies: client-side (Locust), of the requests started after the first {result.plan.warmup:g} s; every "
        "request is counted and checked; 'server p99 ≤' is the bucket of the server's own histogram (time in the "
        "handler, without queueing) under which 99% of the run's requests fell",
        f"- scheduling: {attempts:,} attempts in {seconds:.1f} s ({attempts / seconds:,.0f}/s) for "
        f"{locust['pods']:,} pods; placed {placed:,}; rejected {outcomes.get('rejected', 0):,} (no node fits; "
        f"{outcomes.get('rejected_unresolvable', 0):,} of them fit nowhere ever); bind conflicts "
        f"{outcomes.get('bind_conflicts', 0):,} (retried; {outcomes.get('gave_up', 0)} gave up)",
        f"- server: CPU {result.server_busy:.0%} of one core, "
        f"{result.server_cpu / max(1, result.requests) * 1e6:,.0f} µs per request; "
        f"RSS {before.get('VmRSS', 0) / 1024:,.0f} MiB after loading, "
        f"{after.get('VmRSS', 0) / 1024:,.0f} MiB at the end (peak {after.get('VmHWM', 0) / 1024:,.0f}); "
        f"ready {result.server_ready_seconds:.1f} s after start",
        f"- client (Locust, one process): CPU {result.client_busy:.0%} of one core"
        + (
            f"; Locust warned of CPU above 90% ({locust['client_cpu_warnings']} times): the client limited the run"
            if locust["client_cpu_warnings"]
            else ""
        ),
    ]
    if int(outcomes.get("rejected", 0)) > 0.01 * max(1, attempts):
        lines.append("- note: over 1% of attempts found no node: the sampled nodes are filling up")
    if locust["binds_unfinished"]:
        lines.append(f"- ERROR: {locust['binds_unfinished']} binds still unanswered 30 s after the end")
    for sample in locust["error_samples"]:
        lines.append(f"- request error: {sample}")
    for line in result.server_log_errors[:5]:
        lines.append(f"- server logged: {line[:300]}")
    lines.append("")
    lines.append("End checks (GET /inspect):")
    for name, ok, detail in result.checks:
        lines.append(f"- {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if result.plan.rate >= TARGET_RATE and int(locust["names_per_filter"]) >= TARGET_NAMES:
        worst = max(VERBS, key=result.p99)
        verdict = "met" if result.p99(worst) < TARGET_P99_MS and result.errors == 0 else "missed"
        lines.append(
            f"\nTarget (≥ {TARGET_RATE} pods/s, {TARGET_NAMES:,} names: zero errors, p99 of every verb < "
            f"{TARGET_P99_MS:g} ms, client-side): {verdict} "
            f"(worst p99: {worst} {result.p99(worst):.2f} ms, {result.errors} errors)"
        )
    return "\n".join(lines)


def summary(result: Result) -> dict[str, Any]:
    locust = {key: value for key, value in result.locust.items() if key not in ("placed", "log")}
    return {
        "plan": asdict(result.plan),
        "locust": locust,
        "seconds": result.seconds,
        "errors": result.errors,
        "attempts_per_second": result.attempts_per_second,
        "server_cpu_seconds": result.server_cpu,
        "server_p99_ms": result.server_p99_ms,
        "memory_before_kib": result.memory_before,
        "memory_after_kib": result.memory_after,
        "server_log_errors": result.server_log_errors,
        "checks": [{"name": name, "ok": ok, "detail": detail} for name, ok, detail in result.checks],
        "passed": result.passed,
    }


# --- saturation -------------------------------------------------------------------------------------------


def held(result: Result, limit_ms: float) -> tuple[bool, str]:
    """Whether a step held the pace: no errors, every p99 within the limit, and the target rate reached."""
    slow = [f"{verb} p99 {result.p99(verb):.1f} ms" for verb in VERBS if result.p99(verb) > limit_ms]
    if result.errors:
        return False, f"{result.errors} errors"
    if slow:
        return False, ", ".join(slow)
    if result.attempts_per_second < 0.9 * result.plan.rate:
        return False, f"reached only {result.attempts_per_second:,.0f} pods/s"
    return True, "held"


def find_saturation(
    plan: Plan, steps: Sequence[int], limit_ms: float, cluster: Cluster, workdir: Path
) -> tuple[list[tuple[Result, bool, str]], bool]:
    rows: list[tuple[Result, bool, str]] = []
    consistent = True
    for rate in steps:
        result = run_once(replace(plan, rate=rate), cluster, workdir, f"step-{rate}")
        ok, reason = held(result, limit_ms)
        consistent = consistent and all(check_ok for _, check_ok, _ in result.checks)
        rows.append((result, ok, reason))
        worst = max(VERBS, key=result.p99)
        print(
            f"  {rate:>5} pods/s: achieved {result.attempts_per_second:,.0f}, worst p99 {worst} "
            f"{result.p99(worst):.2f} ms, {result.errors} errors, server CPU {result.server_busy:.0%}, "
            f"client CPU {result.client_busy:.0%}: {reason}",
            file=sys.stderr,
            flush=True,
        )
        if not ok:
            break
    return rows, consistent


def saturation_report(rows: list[tuple[Result, bool, str]], limit_ms: float, cluster: Cluster) -> str:
    first = rows[0][0]
    lines = [
        f"## extender saturation search: {describe(first.plan, cluster, int(first.locust['names_per_filter']), True)}",
        f"(a fresh server per step; a step holds with no errors, p99 of every verb ≤ {limit_ms:g} ms, and ≥ 90% of "
        "the target pace reached)",
        "",
        "| target pods/s | achieved | filter p99 ms | prioritize p99 ms | bind p99 ms | errors | server CPU "
        "| client CPU | Locust CPU warning | |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for result, _, reason in rows:
        warned = "yes" if result.locust["client_cpu_warnings"] else "no"
        lines.append(
            f"| {result.plan.rate:g} | {result.attempts_per_second:,.0f} | {result.p99('filter'):.2f} "
            f"| {result.p99('prioritize'):.2f} | {result.p99('bind'):.2f} | {result.errors} "
            f"| {result.server_busy:.0%} | {result.client_busy:.0%} | {warned} | {reason} |"
        )
    good = [result.plan.rate for result, ok, _ in rows if ok]
    bad = [result.plan.rate for result, ok, _ in rows if not ok]
    last = f"{good[-1]:g} pods/s" if good else "none of the steps"
    first_bad = f"{bad[0]:g} pods/s" if bad else "none up to the last step"
    lines += ["", f"Saturation: held at {last}; did not hold at {first_bad}."]
    if any(result.client_busy > 0.85 or result.locust["client_cpu_warnings"] for result, _, _ in rows):
        lines.append(
            f"Locust itself used over 85% of a core at some step, on a machine of {os.cpu_count()} cores: the client "
            "shared the limit, so this is a lower bound for the server."
        )
    failed = [(result.plan.rate, name, detail) for result, _, _ in rows for name, ok, detail in result.checks if not ok]
    lines.append(
        "End checks after every step: "
        + ("all passed" if not failed else "; ".join(f"{r:g}: {n}: {d}" for r, n, d in failed))
    )
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------------------


def _numbers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None


def _names(text: str) -> str:
    if text == "adaptive" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"--names takes a positive number or 'adaptive', not {text!r}")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtest.run", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000, help="Nodes in the generated cluster (1000).")
    parser.add_argument("--gpus", type=_numbers, default=(8,), help="GPUs per node, one of these per node (8).")
    parser.add_argument("--memory", type=_numbers, default=(16, 24, 40, 80), help="GiB per GPU, one per node.")
    parser.add_argument("--fill", type=float, default=0.3, help="Initial fill of every GPU (0.3).")
    parser.add_argument("--seed", type=int, default=1, help="Seed of the cluster and of the pods (1).")
    parser.add_argument("--pods-per-second", type=float, default=300, help="Target scheduling pace (300).")
    parser.add_argument("--duration", type=int, default=30, help="Seconds of load, per step when searching (30).")
    parser.add_argument("--names", type=_names, default="adaptive", help="Node names per filter: N or 'adaptive'.")
    parser.add_argument("--mix", default=DEFAULT_MIX, help=f"Pod sizes GiB:weight ({DEFAULT_MIX}).")
    parser.add_argument("--users", type=int, default=0, help="Locust users (default: one per --user-rate pods/s).")
    parser.add_argument("--user-rate", type=float, default=100.0, help="Pods/s per user when --users is not set (100).")
    parser.add_argument("--http-timeout", type=float, default=5.0, help="Request timeout, as kube-scheduler's (5 s).")
    parser.add_argument("--max-attempts", type=int, default=3, help="Scheduling attempts per pod on bind conflicts.")
    parser.add_argument("--warmup", type=float, default=2.0, help="First seconds left out of the latencies (2).")
    parser.add_argument("--find-saturation", action="store_true", help="Step the rate up until a step does not hold.")
    parser.add_argument("--steps", type=_numbers, default=SATURATION_STEPS, help="Rates (pods/s) of the search.")
    parser.add_argument("--p99-limit-ms", type=float, default=50.0, help="Saturation: the p99 a step may reach (50).")
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="A flag for `extender serve`, as --server-flag=--placement=fill (repeatable).",
    )
    parser.add_argument("--report", default="", help="Also write a JSON summary here.")
    parser.add_argument("--workdir", default="", help="Keep the cluster, logs and results here (default: a temp dir).")
    recording.add_option(parser)
    arguments = parser.parse_args(argv)
    PodMix.parse(arguments.mix)  # refuse a bad mix before starting anything
    if arguments.nodes < 1 or arguments.duration < 1 or arguments.pods_per_second <= 0:
        parser.error("--nodes, --duration and --pods-per-second must be positive")
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse(argv)
    recording.settings(arguments)
    plan = Plan(
        nodes=arguments.nodes,
        rate=arguments.pods_per_second,
        duration=arguments.duration,
        names=arguments.names,
        mix=arguments.mix,
        gpus=arguments.gpus,
        memory=arguments.memory,
        fill=arguments.fill,
        seed=arguments.seed,
        users=arguments.users,
        user_rate=arguments.user_rate,
        http_timeout=arguments.http_timeout,
        max_attempts=arguments.max_attempts,
        warmup=arguments.warmup,
        server_flags=tuple(arguments.server_flag),
    )
    print(f"machine: {machine()}", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        if arguments.workdir:
            workdir = Path(arguments.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="extender-loadtest-")))
        try:
            started = time.perf_counter()
            cluster = make_cluster(plan, workdir)
            names = nodes_to_find(cluster.nodes) if plan.names == "adaptive" else min(int(plan.names), cluster.nodes)
            rates = arguments.steps if arguments.find_saturation else (plan.rate,)
            asked = max(rates) * plan.duration * PodMix.parse(plan.mix).mean
            print(
                f"cluster: {cluster.nodes:,} nodes, {cluster.gpus:,} GPUs, {cluster.pods:,} pods, generated in "
                f"{time.perf_counter() - started:.1f} s; {names:,} names per filter; a run asks about {asked:,.0f} GiB "
                f"of the {cluster.free_memory:,} GiB free ({asked / max(1, cluster.free_memory):.0%})",
                file=sys.stderr,
                flush=True,
            )
            if arguments.find_saturation:
                rows, consistent = find_saturation(plan, arguments.steps, arguments.p99_limit_ms, cluster, workdir)
                print(saturation_report(rows, arguments.p99_limit_ms, cluster))
                recording.result("steps", [{**summary(r), "held": ok, "reason": why} for r, ok, why in rows])
                if arguments.report:
                    Path(arguments.report).write_bytes(
                        orjson.dumps({"steps": [{**summary(r), "held": ok, "reason": why} for r, ok, why in rows]})
                    )
                return 0 if consistent else 1
            result = run_once(plan, cluster, workdir, "run")
        except (LoadTestError, HarnessError) as error:
            print(f"loadtest failed: {error}", file=sys.stderr)
            return 1
        print(report(result, cluster))
        recording.result("run", summary(result))
        if arguments.report:
            Path(arguments.report).write_bytes(orjson.dumps(summary(result)))
        if not result.passed:
            kept = f"logs in {workdir}" if arguments.workdir else "rerun with --workdir DIR to keep the logs"
            print(f"\nloadtest FAILED ({kept}); the end of Locust's log:", file=sys.stderr)
            print(result.locust["log"][-2000:], file=sys.stderr)
        return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(recording.run(main, "loadtest.run"))
