"""`make bench`: latency and throughput of filter, prioritize and bind over loopback HTTP, against one server.

Why it exists: DESIGN §8 budgets the per-request work, and the targets (3,000 filter requests/s on one core
at 1,000 node names, 1,000/s at 5,000, p99 under 1 ms at 1,000 names with one client) are numbers only a
measurement can answer. For each cluster size it generates a cluster (`devtools.clustergen`), starts the real
command (`extender serve --cluster FILE --insecure-http`) as a subprocess, and drives it the way
kube-scheduler does, with a realistic pod (`bench/pod.json`, captured from a real scheduler) and every node
name in `NodeNames`.

- Latency: one client, sequential requests on one keep-alive connection, after a warm-up; client-side p50/p99.
- Throughput: (a) requests/s achieved by several client processes, one keep-alive connection each, with
  pre-encoded requests over raw sockets (the cheapest client there is: it must not be the bottleneck on a
  2-core machine); (b) requests per second of *server* CPU, from the server's own CPU clock
  (/proc/<pid>/task/*/schedstat, nanoseconds), which does not depend on how many cores the client left over.
- Filter and prioritize: each connection asks about one pod (one UID) again and again, as kube-scheduler does
  when it retries a pod. A filter that passes one node counts the pod's GPUs there as assumed until its bind
  comes (`extender/core/assume.py`; a filter of the same pod releases them first), so a fresh pod per request,
  never bound, would fill the cluster with assumptions for their 5 s: the "~half fail" rows then found no node
  with room at all. What a filter of a new pod costs in a stream of pods that are bound is `make loadtest`'s.
- Bind: every bind is for a fresh pod UID, filtered first (so the server remembers the pod), then bound to
  a node that fits; only the bind is timed.
- HTTPS: production serves HTTPS with mutual TLS, so at the `--tls-sizes` (1,000 names) a second server over
  the same cluster file runs with `--tls-cert --tls-key --client-ca` (certificates from `extender.tools.certs`, made
  in the bench's temp dir), and `filter` (all pass) and `bind` are driven exactly as above, through TLS sockets
  that present the client certificate and verify the server against the CA. Connections stay keep-alive: one
  handshake per connection, made before the timing starts, as kube-scheduler's Go client reuses connections.

It reports numbers and never fails because a target is missed; it fails when any request errors or answers
other than 200. It never leaves a server running (killed in `finally`, and by the kernel if this process
dies), and it only ever talks to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import multiprocessing
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import orjson

from bench import record as recording
from devtools.clustergen import generate, write
from devtools.harness import HOST, HarnessError, ServedExtender, machine, percentile
from extender.core.cache import Cache
from extender.core.protocols.gpushare import Profile
from extender.tools.certs import CertificateFiles, write_certificates

HERE = Path(__file__).resolve().parent
POD_FIXTURE = HERE / "pod.json"
PROFILE = Profile()

EASY_DEMAND = 4
"""GiB asked by the filter and prioritize runs: at fill 0.3 every node has a GPU with that much free."""
BIND_DEMAND = 2
"""GiB per bound pod: small, so the bind runs do not fill the small clusters before their time is up."""
UID_MARK = "00000000-0000-4000-8000-bench0marker"
"""Placeholder in pre-encoded bodies, replaced by a fresh UID of the same length per request."""

TARGETS = (
    "Targets: 3,000 filter requests/s from one server process on one core at 1,000 names; 1,000/s at 5,000 names;\n"
    "p99 < 1 ms at 1,000 names with one client. The throughput targets are answered by 'req/s per server core'\n"
    "(requests per second of server CPU time: what one process on one core sustains); 'req/s achieved' is what\n"
    "this machine reached with the load generator sharing its cores with the server. p99 is answered by the\n"
    "'p99 ms' column of the one-client run."
)


class BenchError(Exception):
    """A request failed, answered other than 200, or the server would not start."""


# --- a minimal keep-alive HTTP/1.1 client -----------------------------------------------------------------


def encode_request(path: str, body: bytes, port: int) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True)
class ClientTLS:
    """What a client needs for mutual TLS: the CA to verify the server against, and its own certificate."""

    ca: str
    cert: str
    key: str

    @classmethod
    def of(cls, files: CertificateFiles) -> ClientTLS:
        return cls(str(files.ca_certificate), str(files.client_certificate), str(files.client_key))


@functools.cache
def client_context(tls: ClientTLS) -> ssl.SSLContext:
    """Verifies the server's certificate (and its IP address) against the CA; presents the client certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=tls.ca)
    context.load_cert_chain(tls.cert, tls.key)
    context.set_alpn_protocols(["http/1.1"])
    return context


class Connection:
    """One keep-alive connection; `exchange` sends pre-encoded request bytes and returns (status, body).

    With `tls`, the raw socket is wrapped in TLS and the handshake (mutual: the client certificate is
    presented) happens here, once, so that the exchanges on the connection carry only the record-layer cost.
    """

    def __init__(self, port: int, tls: ClientTLS | None = None) -> None:
        sock = socket.create_connection((HOST, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = client_context(tls).wrap_socket(sock, server_hostname=HOST)
        self.sock = sock
        self.buffer = bytearray()

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        buffer = self.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            self._receive()
        head = bytes(buffer[:end]).lower()
        status = int(head[9:12])
        start = head.find(b"\r\ncontent-length:")
        if start < 0:
            raise BenchError(f"reply without Content-Length: {head[:200]!r}")
        stop = head.find(b"\r\n", start + 2)
        length = int(head[start + 17 : stop if stop >= 0 else None])
        total = end + 4 + length
        while len(buffer) < total:
            self._receive()
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        return status, body

    def _receive(self) -> None:
        chunk = self.sock.recv(1 << 18)
        if not chunk:
            raise BenchError("server closed the connection")
        self.buffer += chunk

    def get(self, path: str, port: int) -> tuple[int, bytes]:
        return self.exchange(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())

    def close(self) -> None:
        self.sock.close()


# --- the server under test --------------------------------------------------------------------------------


class Server(ServedExtender):
    """The served extender (`devtools.harness`), and how this bench's raw clients reach it: plain HTTP, or
    with `certificates` HTTPS with mutual TLS (`--tls-cert --tls-key --client-ca`)."""

    def __init__(self, cluster_file: Path, log_file: Path, certificates: CertificateFiles | None = None) -> None:
        self.tls = ClientTLS.of(certificates) if certificates is not None else None
        if certificates is None:
            transport = ["--insecure-http"]
        else:
            transport = [
                "--tls-cert", str(certificates.server_certificate), "--tls-key", str(certificates.server_key),
                "--client-ca", str(certificates.ca_certificate),
            ]  # fmt: skip
        context = client_context(self.tls) if self.tls is not None else None
        super().__init__(cluster_file, log_file, transport, context)

    def connect(self) -> Connection:
        return Connection(self.port, self.tls)


@contextlib.contextmanager
def running_server(
    cluster_file: Path, log_file: Path, certificates: CertificateFiles | None = None
) -> Iterator[Server]:
    server = Server(cluster_file, log_file, certificates)
    try:
        yield server
    finally:
        server.stop()


# --- request bodies ---------------------------------------------------------------------------------------


def pod_with(demand: int, uid: str) -> dict[str, Any]:
    """The captured pod, asking `demand` GiB in every container, under another UID and name."""
    pod: dict[str, Any] = orjson.loads(POD_FIXTURE.read_bytes())
    pod["metadata"]["uid"] = uid
    pod["metadata"]["name"] = f"bench-{uid}"
    for container in pod["spec"]["containers"]:
        for table in ("limits", "requests"):
            container["resources"].setdefault(table, {})[PROFILE.memory_resource] = str(demand)
    return pod


class Template:
    """A pre-encoded request whose pod UID (and name) is swapped per request without re-encoding."""

    def __init__(self, path: str, body: dict[str, Any], port: int) -> None:
        self.parts = encode_request(path, orjson.dumps(body), port).split(UID_MARK.encode())

    def render(self, uid: str) -> bytes:
        return uid.encode().join(self.parts)


def make_uid(run: int, worker: int, number: int) -> str:
    uid = f"{run:08x}-0000-4000-8000-{worker:04d}{number:08d}"
    assert len(uid) == len(UID_MARK)
    return uid


def args_body(demand: int, names: Sequence[str]) -> dict[str, Any]:
    return {"Pod": pod_with(demand, UID_MARK), "Nodes": None, "NodeNames": list(names)}


def filter_ok(status: int, body: bytes) -> bool:
    return status == 200 and body.endswith(b'"Error":""}')


def prioritize_ok(status: int, body: bytes) -> bool:
    return status == 200 and body.startswith(b"[")


def bind_ok(status: int, body: bytes) -> bool:
    return status == 200 and body == b'{"Error":""}'


CHECKS: dict[str, Callable[[int, bytes], bool]] = {"filter": filter_ok, "prioritize": prioritize_ok}


def half_failing_demand(objects: list[dict[str, Any]]) -> int:
    """The demand that about half of the nodes cannot take on any one GPU (so the reply carries reasons)."""
    cluster = Cache(PROFILE)
    cluster.replace([o for o in objects if o["kind"] == "Node"], [o for o in objects if o["kind"] == "Pod"])
    largest = sorted(state.largest_free for state in cluster.nodes.values())
    candidates = sorted(set(largest))
    return min(candidates, key=lambda demand: abs(sum(1 for free in largest if free >= demand) / len(largest) - 0.5))


# --- measurements -----------------------------------------------------------------------------------------


@dataclass
class Row:
    verb: str
    names: int
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    samples: int = 0
    achieved: float = 0.0
    per_core: float = 0.0
    sequential_cpu_us: float = 0.0
    server_busy: float = 0.0
    client_cpu_us: float = 0.0
    notes: list[str] = field(default_factory=list)


def sequential(
    server: Server,
    template: Template,
    check: Callable[[int, bytes], bool],
    run: int,
    warmup: int,
    limit: int,
    seconds: float,
) -> tuple[list[float], float]:
    """Latencies (s) of sequential requests on one connection, and the server's CPU seconds per request."""
    connection = server.connect()
    try:
        for _ in range(warmup):
            status, body = connection.exchange(template.render(make_uid(run, 999, 0)))
            if not check(status, body):
                raise BenchError(f"warm-up request answered {status}: {body[:300]!r}")
        latencies: list[float] = []
        cpu_before = server.cpu_seconds()
        deadline = time.perf_counter() + seconds
        for _ in range(limit):
            request = template.render(make_uid(run, 0, 0))
            started = time.perf_counter()
            status, body = connection.exchange(request)
            latencies.append(time.perf_counter() - started)
            if not check(status, body):
                raise BenchError(f"request answered {status}: {body[:300]!r}")
            if latencies[-1] + started > deadline:
                break
        cpu = server.cpu_seconds() - cpu_before
        return latencies, cpu / len(latencies)
    finally:
        connection.close()


def _repeat_worker(
    port: int,
    tls: ClientTLS | None,
    template: Template,
    verb: str,
    run: int,
    worker: int,
    seconds: float,
    ready: Barrier,
    go: Event,
    results: Any,
) -> None:
    check = CHECKS[verb]
    count, error = 0, ""
    try:
        connection = Connection(port, tls)
        ready.wait()
        go.wait()
        cpu, started = time.process_time(), time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            status, body = connection.exchange(template.render(make_uid(run, worker, 0)))
            if not check(status, body):
                error = f"{verb} answered {status}: {body[:300]!r}"
                break
            count += 1
        results.put((count, count, time.perf_counter() - started, time.process_time() - cpu, error))
    except Exception as failure:
        results.put((count, count, 0.0, 0.0, f"{verb} worker {worker}: {failure!r}"))


def _bind_worker(
    port: int,
    tls: ClientTLS | None,
    nodes: list[str],
    run: int,
    worker: int,
    seconds: float,
    ready: Barrier,
    go: Event,
    results: Any,
) -> None:
    binds = requests = 0
    error = ""
    try:
        connection = Connection(port, tls)
        filters = {node: Template("/filter", filter_template_body(node), port) for node in nodes}
        ready.wait()
        go.wait()
        cpu, started = time.process_time(), time.perf_counter()
        deadline = started + seconds
        position = 0
        full: set[str] = set()
        while time.perf_counter() < deadline and len(full) < len(nodes):
            node = nodes[position % len(nodes)]
            position += 1
            if node in full:
                continue
            uid = make_uid(run, worker, requests)
            status, body = connection.exchange(filters[node].render(uid))
            requests += 1
            if not filter_ok(status, body):
                error = f"filter answered {status}: {body[:300]!r}"
                break
            if b'"NodeNames":[]' in body:
                full.add(node)
                continue
            status, body = connection.exchange(bind_request(uid, node, port))
            requests += 1
            if not bind_ok(status, body):
                error = f"bind answered {status}: {body[:300]!r}"
                break
            binds += 1
        results.put((binds, requests, time.perf_counter() - started, time.process_time() - cpu, error))
    except Exception as failure:
        results.put((binds, requests, 0.0, 0.0, f"bind worker {worker}: {failure!r}"))


def filter_template_body(node: str) -> dict[str, Any]:
    return args_body(BIND_DEMAND, [node])


def bind_request(uid: str, node: str, port: int) -> bytes:
    body = {"PodName": f"bench-{uid}", "PodNamespace": "default", "PodUID": uid, "Node": node}
    return encode_request("/bind", orjson.dumps(body), port)


def concurrent(
    server: Server, clients: int, target: Callable[..., None], arguments: list[tuple[Any, ...]]
) -> dict[str, float]:
    """Run `clients` worker processes at once; returns achieved rates, server CPU and client CPU."""
    context = multiprocessing.get_context("fork")
    ready, go, results = context.Barrier(clients + 1), context.Event(), context.Queue()
    workers = [context.Process(target=target, args=(*extra, ready, go, results), daemon=True) for extra in arguments]
    for worker in workers:
        worker.start()
    try:
        ready.wait(timeout=60)
        cpu_before, wall_before = server.cpu_seconds(), time.perf_counter()
        go.set()
        outcomes = [results.get(timeout=120) for _ in workers]
        server_cpu, wall = server.cpu_seconds() - cpu_before, time.perf_counter() - wall_before
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    errors = [outcome[4] for outcome in outcomes if outcome[4]]
    if errors:
        raise BenchError("; ".join(errors))
    units = sum(outcome[0] for outcome in outcomes)
    requests = sum(outcome[1] for outcome in outcomes)
    elapsed = max(outcome[2] for outcome in outcomes)
    return {
        "units": units,
        "rate": units / elapsed,
        "requests": requests,
        "server_cpu": server_cpu,
        "server_busy": server_cpu / wall,
        "client_cpu_per_request": sum(outcome[3] for outcome in outcomes) / max(1, requests),
    }


# --- one cluster size -------------------------------------------------------------------------------------


@dataclass
class Plan:
    clients: int
    seconds: float
    latency_seconds: float
    latency_limit: int
    warmup: int
    tls_sizes: tuple[int, ...] = (1000,)


def bench_args_verb(server: Server, verb: str, label: str, demand: int, names: list[str], run: int, plan: Plan) -> Row:
    template = Template(f"/{verb}", args_body(demand, names), server.port)
    check = CHECKS[verb]
    row = Row(label, len(names))
    if verb == "filter":
        connection = server.connect()
        try:
            reply = orjson.loads(connection.exchange(template.render(make_uid(run, 998, 0)))[1])
        finally:
            connection.close()
        passed = len(reply["NodeNames"])
        failed, unresolvable = len(reply["FailedNodes"]), len(reply["FailedAndUnresolvableNodes"])
        row.notes.append(
            f"{label} at {len(names)}: demand {demand} GiB; {passed} pass, {failed} failed, {unresolvable} unresolvable"
        )
    latencies, cpu_per_request = sequential(
        server, template, check, run, plan.warmup, plan.latency_limit, plan.latency_seconds
    )
    row.p50_ms, row.p99_ms = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
    row.max_ms = max(latencies) * 1e3
    row.samples, row.sequential_cpu_us = len(latencies), cpu_per_request * 1e6
    result = concurrent(
        server,
        plan.clients,
        _repeat_worker,
        [
            (server.port, server.tls, template, verb, run + 1, worker, plan.seconds)
            for worker in range(1, plan.clients + 1)
        ],
    )
    row.achieved = result["rate"]
    row.per_core = result["requests"] / result["server_cpu"]
    row.server_busy, row.client_cpu_us = result["server_busy"], result["client_cpu_per_request"] * 1e6
    return row


def bench_bind(server: Server, names: list[str], run: int, plan: Plan, label: str = "bind") -> Row:
    row = Row(label, len(names))
    connection = server.connect()
    latencies: list[float] = []
    bind_cpu = 0.0
    filters: dict[str, Template] = {}
    try:
        deadline = time.perf_counter() + plan.latency_seconds
        full: set[str] = set()
        number = position = 0
        while len(latencies) < plan.latency_limit + plan.warmup and len(full) < len(names):
            node = names[position % len(names)]
            position += 1
            if node in full:
                continue
            uid = make_uid(run, 0, number)
            number += 1
            template = filters.get(node) or filters.setdefault(
                node, Template("/filter", filter_template_body(node), server.port)
            )
            status, body = connection.exchange(template.render(uid))
            if not filter_ok(status, body):
                raise BenchError(f"filter before bind answered {status}: {body[:300]!r}")
            if b'"NodeNames":[]' in body:
                full.add(node)
                continue
            request = bind_request(uid, node, server.port)
            cpu_before = server.cpu_seconds()
            started = time.perf_counter()
            status, body = connection.exchange(request)
            elapsed = time.perf_counter() - started
            cpu_after = server.cpu_seconds()
            if not bind_ok(status, body):
                raise BenchError(f"bind answered {status}: {body[:300]!r}")
            if number > plan.warmup:
                latencies.append(elapsed)
                bind_cpu += cpu_after - cpu_before
            if started > deadline and len(latencies) >= 100:
                break
    finally:
        connection.close()
    if not latencies:
        raise BenchError("no node had room for a bind")
    row.p50_ms, row.p99_ms = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
    row.max_ms = max(latencies) * 1e3
    row.samples, row.sequential_cpu_us = len(latencies), bind_cpu / len(latencies) * 1e6
    row.per_core = len(latencies) / bind_cpu if bind_cpu else 0.0
    shares = [names[worker :: plan.clients] for worker in range(plan.clients)]
    result = concurrent(
        server,
        plan.clients,
        _bind_worker,
        [
            (server.port, server.tls, shares[worker - 1], run + 1, worker, plan.seconds)
            for worker in range(1, plan.clients + 1)
        ],
    )
    row.achieved = result["rate"]
    row.server_busy, row.client_cpu_us = result["server_busy"], result["client_cpu_per_request"] * 1e6
    row.notes.append(
        f"{label} at {len(names)}: {result['units']:.0f} binds in the concurrent run, each after its own filter "
        f"(1 node name); 'req/s achieved' counts binds (filter+bind pairs), 'per server core' counts binds "
        f"alone, from the server's CPU clock read around each sequential bind"
    )
    return row


def bench_size(size: int, workdir: Path, plan: Plan, certificates: CertificateFiles | None = None) -> list[Row]:
    started = time.perf_counter()
    objects = generate(size, gpus_per_node=(8,), seed=1)
    cluster_file = workdir / f"cluster-{size}.json"
    write(objects, cluster_file)
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "Node"]
    pods = len(objects) - len(names)
    generated = time.perf_counter() - started
    with running_server(cluster_file, workdir / f"server-{size}.log") as server:
        hard = half_failing_demand(objects)  # computed while the server loads
        del objects
        ready_after = server.wait_ready()
        print(
            f"  {size} nodes, {pods} pods, {size * 8} GPUs: generated and written in {generated:.1f} s; "
            f"the server loaded it and was ready {ready_after:.1f} s after it started",
            file=sys.stderr,
            flush=True,
        )
        run = size * 10
        rows = [
            bench_args_verb(server, "filter", "filter", EASY_DEMAND, names, run + 1, plan),
            bench_args_verb(server, "filter", "filter, ~half fail", hard, names, run + 3, plan),
            bench_args_verb(server, "prioritize", "prioritize", EASY_DEMAND, names, run + 5, plan),
            bench_bind(server, names, run + 7, plan),
        ]
        if server.process.poll() is not None:
            raise BenchError(f"server died:\n{(workdir / f'server-{size}.log').read_text()[-3000:]}")
    if certificates is not None and size in plan.tls_sizes:
        log_file = workdir / f"server-{size}-tls.log"
        with running_server(cluster_file, log_file, certificates) as server:
            ready_after = server.wait_ready()
            print(
                f"  {size} nodes over HTTPS with mutual TLS: the server was ready {ready_after:.1f} s after it started",
                file=sys.stderr,
                flush=True,
            )
            rows += [
                bench_args_verb(server, "filter", "filter (HTTPS, mTLS)", EASY_DEMAND, names, run + 9, plan),
                bench_bind(server, names, run + 11, plan, "bind (HTTPS, mTLS)"),
            ]
            if server.process.poll() is not None:
                raise BenchError(f"server died:\n{log_file.read_text()[-3000:]}")
    return rows


# --- report -----------------------------------------------------------------------------------------------


def table(rows: list[Row], clients: int) -> str:
    lines = [
        f"| verb | node names | p50 ms | p99 ms | max ms | req/s achieved ({clients} conns) | req/s per server core "
        "| server CPU µs/req (1 client) | server busy | client CPU µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.verb} | {row.names:,} | {row.p50_ms:.3f} | {row.p99_ms:.3f} | {row.max_ms:.1f} "
            f"| {row.achieved:,.0f} | {row.per_core:,.0f} | {row.sequential_cpu_us:,.0f} | {row.server_busy:.0%} "
            f"| {row.client_cpu_us:,.0f} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> list[str]:
    def find(verb: str, names: int) -> Row | None:
        return next((row for row in rows if row.verb == verb and row.names == names), None)

    lines = []
    for names, goal in ((1000, 3000), (5000, 1000)):
        row = find("filter", names)
        if row is not None:
            met = "met" if row.per_core >= goal else "MISSED"
            lines.append(
                f"- filter at {names:,} names: {row.per_core:,.0f} req/s per server core (target {goal:,}): {met}"
            )
    row = find("filter", 1000)
    if row is not None:
        met = "met" if row.p99_ms < 1.0 else "MISSED"
        lines.append(f"- filter at 1,000 names, one client: p99 {row.p99_ms:.3f} ms (target < 1 ms): {met}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="Cluster sizes (node names per request).")
    parser.add_argument("--clients", type=int, default=3, help="Client processes (connections) for throughput.")
    parser.add_argument("--seconds", type=float, default=3.0, help="Duration of each throughput run.")
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="Longest sequential latency run.")
    parser.add_argument("--latency-requests", type=int, default=3000, help="Most requests in a latency run.")
    parser.add_argument("--warmup", type=int, default=50, help="Requests before each latency run.")
    parser.add_argument(
        "--tls-sizes", default="1000", help="Sizes also measured over HTTPS with mutual TLS (empty: none)."
    )
    recording.add_option(parser)
    arguments = parser.parse_args(argv)
    recording.settings(arguments)
    plan = Plan(
        arguments.clients,
        arguments.seconds,
        arguments.latency_seconds,
        arguments.latency_requests,
        arguments.warmup,
        tuple(int(size) for size in arguments.tls_sizes.split(",") if size.strip()),
    )
    sizes = [int(size) for size in arguments.sizes.split(",")]
    # The client's own garbage collector would add its pauses to the server's latency; nothing here makes
    # cycles worth collecting, so it stays off (the forked client processes inherit that).
    gc.disable()
    print(f"machine: {machine()}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="extender-bench-") as workdir:
            certificates = None
            if any(size in plan.tls_sizes for size in sizes):
                certificates = write_certificates(Path(workdir) / "tls", dns_names=(), ips=(HOST,))
            for size in sizes:
                rows += bench_size(size, Path(workdir), plan, certificates)
    except (BenchError, HarnessError) as error:
        print(f"bench failed: {error}", file=sys.stderr)
        return 1
    print(f"\n## extender bench ({time.perf_counter() - started:.0f} s)\n")
    print(
        f"Machine: {machine()}. Server: one process, plain HTTP on 127.0.0.1 (the HTTPS rows: a second server with "
        "mutual TLS), clusters of 8-GPU nodes at 30% fill.\n"
    )
    print(table(rows, plan.clients))
    recording.result("rows", rows)
    print()
    for row in rows:
        for note in row.notes:
            print(f"- {note}")
    print(
        f"- p50/p99: one client, one keep-alive connection, sequential, after {plan.warmup} warm-up requests "
        f"({', '.join(str(row.samples) for row in rows)} samples per row)"
    )
    print(
        "- server busy: server CPU seconds / wall seconds during the concurrent run (about 100% means the "
        "server, not the client, was the limit)"
    )
    if any(row.verb.endswith("(HTTPS, mTLS)") for row in rows):
        print(
            "- HTTPS, mTLS rows: a second server over the same cluster with --tls-cert/--tls-key/--client-ca; the "
            "client presents its certificate and verifies the server's against the CA. Connections are keep-alive "
            "(one TLS handshake per connection, before the timing starts), as kube-scheduler's Go client reuses "
            "its connections, so these rows measure TLS record cost, not handshakes"
        )
    print()
    print(TARGETS)
    print()
    print("\n".join(verdicts(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.bench"))
