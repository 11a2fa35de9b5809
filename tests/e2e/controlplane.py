"""A real Kubernetes control plane for the end-to-end tier: etcd, kube-apiserver and, on demand, kube-scheduler,
run as child processes on 127.0.0.1 from the binaries `tests/e2e/build.sh` caches.

Everything a run makes (certificates, tokens, kubeconfigs, etcd's data, configurations and every process's
log) stays in one work directory, and the logs stay there after teardown; when a process does not come up,
the error carries the tail of its log. No kubelet and no controller-manager run: nodes are API objects made
Ready by the tests, and the few objects a controller would have made (the `default` ServiceAccount) are made
here. Three users authenticate with static tokens: `admin` (system:masters), `scheduler`
(system:kube-scheduler, whose rights the default RBAC grants) and `extender` (gpu-extender, with exactly the
rights the extender needs, see `EXTENDER_RULES`).

This module talks to the API with aiohttp (and the standard library for start-up): it must never import
`extender`, so the tier checks the extender's own Kubernetes client against an independent one. Its refusals are
the device-plugin doubles' `ApiError` (devtools/deviceplugin/kube.py), so the tier's plugin double and the Allocate
procedure it shares with them raise and catch one class.

What the real v1.34.1 API server does that one might not expect (measured here):
- Creating a Node keeps the `status` sent (nodeStrategy.PrepareForCreate only drops disabled fields), so no
  write to `nodes/{name}/status` is needed; a Pod's status, in contrast, is reset on create.
- The `TaintNodesByCondition` admission plugin would add `node.kubernetes.io/not-ready:NoSchedule` to every
  new Node (and only the node lifecycle controller, not running here, would remove it): it is disabled.
- Without a kubelet, deleting a bound Pod gracefully leaves it Terminating forever: `delete` asks for
  gracePeriodSeconds 0.
- Debian's etcd 3.4.23 has no `--unsafe-no-fsync` (added in 3.5): the flag is passed only when etcd lists it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from devtools.deviceplugin.kube import ApiError
from devtools.harness import stop_process

MODULE = Path(__file__).parent / "k8s"
"""The Go module that pins the Kubernetes release (go.mod) and names the two commands built (tools.go)."""
BUILD_SCRIPT = Path(__file__).parent / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")

EXTENDER_USER = "gpu-extender"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
EXTENDER_NAMESPACE = "gpu-extender"
"""Where the extender keeps its leader-election Lease."""
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def manifest_rules(kind: str, name: str) -> list[dict[str, Any]]:
    """The rules of a ClusterRole or Role in `manifests/base/rbac.yaml`: the e2e tier grants the extender exactly
    what the manifests grant, read from the one place they are written."""
    for document in yaml.safe_load_all((MANIFESTS / "base" / "rbac.yaml").read_text()):
        if document and document.get("kind") == kind and document["metadata"]["name"] == name:
            return list(document["rules"])
    raise LookupError(f"no {kind} {name} in {MANIFESTS / 'rbac.yaml'}")


def hami_overlay_rules() -> list[dict[str, Any]]:
    """The rules `manifests/hami/` adds to the extender's ClusterRole (node patch, for the lock): the tier grants
    exactly what the overlay grants, read from the one place it is written."""
    kustomization = yaml.safe_load((MANIFESTS / "hami" / "kustomization.yaml").read_text())
    for patch in kustomization["patches"]:
        if patch.get("target") == {"kind": "ClusterRole", "name": "gpu-extender"}:
            return [
                op["value"] for op in yaml.safe_load(patch["patch"]) if op["op"] == "add" and op["path"] == "/rules/-"
            ]
    raise LookupError("manifests/hami/kustomization.yaml adds no rule to the ClusterRole gpu-extender")


EXTENDER_RULES: list[dict[str, Any]] = manifest_rules("ClusterRole", "gpu-extender")
"""Cluster-wide rights of the extender user; its namespaced rights are `LEASE_RULES`."""
UNHEALTHY_RULES: list[dict[str, Any]] = manifest_rules("Role", "gpu-extender-unhealthy-gpus")
"""The extender user's rights in kube-system (gpushare's lists of unhealthy GPUs)."""
LEASE_RULES: list[dict[str, Any]] = [
    *manifest_rules("Role", "gpu-extender-leader-election"),
    # Test-only: the failover test elects on a Lease of its own, beside the shared extender's "gpu-extender".
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["e2e-election"],
        "verbs": ["get", "update"],
    },
]

GPU_MEM = "aliyun.com/gpu-mem"
GPU_COUNT = "aliyun.com/gpu-count"

STARTUP_TIMEOUT = 60.0
LOG_TAIL_LINES = 40


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release required in tests/e2e/k8s/go.mod, e.g. "v1.34.1"."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\d+\.\d+\.\d+)\s*$", (MODULE / "go.mod").read_text(), re.M
    )
    if match is None:
        raise RuntimeError(f"no k8s.io/kubernetes requirement in {MODULE / 'go.mod'}")
    return match.group(1)


def binaries_dir() -> Path:
    """Where build.sh puts the binaries: ${GPU_EXTENDER_CACHE:-~/.cache/gpu-extender}/k8s-<version>."""
    cache = os.environ.get("GPU_EXTENDER_CACHE") or Path.home() / ".cache" / "gpu-extender"
    return Path(cache) / f"k8s-{kubernetes_version()}"


def go_toolchain() -> str | None:
    """The `go` build.sh would use (on PATH, else the usual /usr/local/go), or None."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


def missing_binaries(folder: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(folder / name, os.X_OK)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 30.0, what: str = "the condition", interval: float = 0.2
) -> Any:
    """Poll the coroutine function `check()` until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        assert time.monotonic() < deadline, f"not true after {timeout} s: {what}"
        await asyncio.sleep(interval)
    return found


def node_manifest(
    name: str,
    gpus: int = 2,
    gpu_mem: int = 16,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Ready, untainted Node with `gpus` GPUs of `gpu_mem` units each: capacity and allocatable hold
    gpu-count = gpus and gpu-mem = gpus * gpu_mem (the total, as the gpushare device plugin reports),
    plus 16 cpu, 64Gi memory and 110 pods. No GPU resources at all when `gpus` is 0."""
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    if gpus:
        capacity |= {GPU_COUNT: str(gpus), GPU_MEM: str(gpus * gpu_mem)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "e2e: no kubelet, Ready by fiat",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


class ControlPlaneError(RuntimeError):
    """A control-plane process did not start, or stopped; the message ends with the tail of its log."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...]
    token: str


@dataclass(slots=True)
class Process:
    """A running child process whose stdout and stderr go to `log`. Mutable: it gets stopped."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ControlPlaneError:
        return ControlPlaneError(f"{self.name} {what}; last lines of {self.log}:\n{self.tail()}")

    def stop(self) -> None:
        stop_process(self.popen)


def _spawn(name: str, argv: list[str], log: Path) -> Process:
    with log.open("ab") as output:
        popen = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Process(name, popen, log)


def _wait_until(process: Process, check: Callable[[], bool], what: str, timeout: float = STARTUP_TIMEOUT) -> None:
    """Poll `check()` (true when up) until `timeout`; fail early, with the log, when the process exits."""
    deadline = time.monotonic() + timeout
    while True:
        if process.popen.poll() is not None:
            raise process.failure(f"exited with code {process.popen.returncode} before {what}")
        if check():
            return
        if time.monotonic() > deadline:
            raise process.failure(f"not {what} after {timeout:.0f} s")
        time.sleep(0.2)


class ControlPlane:
    """etcd and kube-apiserver started by `start()` (and kube-scheduler by `start_scheduler()`), all stopped by
    `stop()`. Mutable: it owns processes. API calls: `api()` and the helpers below it (async, aiohttp)."""

    def __init__(self, binaries: Path, workdir: Path, apiserver_args: Sequence[str] = ()) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.apiserver_args = list(apiserver_args)
        """Extra kube-apiserver flags, after ours (a later flag wins), e.g. "--etcd-compaction-interval=5s"."""
        self.version = kubernetes_version()
        self.port = 0
        self.url = ""
        self.ca_file = workdir / "ca.pem"
        self.users = {
            "admin": User("admin", ("system:masters",), secrets.token_hex(16)),
            "scheduler": User("system:kube-scheduler", (), secrets.token_hex(16)),
            "extender": User(EXTENDER_USER, (), secrets.token_hex(16)),
        }
        self.etcd: Process | None = None
        self.apiserver: Process | None = None
        self.schedulers: list[Process] = []
        """The running kube-schedulers."""
        self._scheduler_logs: dict[int, Path] = {}
        self._numbers = itertools.count(1)
        self._ssl: ssl.SSLContext | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start etcd and kube-apiserver, wait for /readyz, and create what the tests and the extender need."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._bootstrap()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process, newest first, and wait for each; the work directory and logs stay."""
        for process in [*reversed(self.schedulers), self.apiserver, self.etcd]:
            if process is not None:
                process.stop()
        self.schedulers.clear()

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        etcd = str(self.binaries / "etcd")
        argv = [
            etcd,
            "--name=e2e",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
            "--log-level=warn",
        ]
        help_text = subprocess.run([etcd, "--help"], capture_output=True, text=True, check=False)
        if "--unsafe-no-fsync" in help_text.stdout + help_text.stderr:
            argv.append("--unsafe-no-fsync")
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.etcd = _spawn("etcd", argv, self.workdir / "etcd.log")
        _wait_until(self.etcd, lambda: self._get_ok(f"{self.etcd_url}/health", None), "healthy")

    def _start_apiserver(self) -> None:
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._write_credentials()
        argv = [
            str(self.binaries / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={self.workdir / 'apiserver.pem'}",
            f"--tls-private-key-file={self.workdir / 'apiserver-key.pem'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={self.workdir / 'service-account.pem'}",
            f"--service-account-signing-key-file={self.workdir / 'service-account.pem'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--disable-admission-plugins=TaintNodesByCondition",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
            *self.apiserver_args,
        ]
        self.apiserver = _spawn("kube-apiserver", argv, self.workdir / "kube-apiserver.log")
        _wait_until(
            self.apiserver, lambda: self._get_ok(f"{self.url}/readyz", "admin", self.ssl_context), "ready (/readyz)"
        )

    def _write_credentials(self) -> None:
        ca = trustme.CA()
        serving = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(self.ca_file))
        (self.workdir / "apiserver.pem").write_bytes(b"".join(blob.bytes() for blob in serving.cert_chain_pems))
        serving.private_key_pem.write_to_path(str(self.workdir / "apiserver-key.pem"))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.workdir / "service-account.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        rows = [f'{user.token},{user.name},{user.name},"{",".join(user.groups)}"' for user in self.users.values()]
        (self.workdir / "tokens.csv").write_text("\n".join(rows) + "\n")
        for key_name in self.users:
            self._write_kubeconfig(key_name)

    def _write_kubeconfig(self, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": self.users[user].token}}],
            "contexts": [{"name": user, "context": {"cluster": "e2e", "user": user}}],
            "current-context": user,
        }
        self.kubeconfig(user).write_text(yaml.safe_dump(config, sort_keys=False))

    def kubeconfig(self, user: str = "admin") -> Path:
        """The kubeconfig file of `user` ("admin", "scheduler" or "extender"): token and CA, no client cert."""
        return self.workdir / f"kubeconfig-{user}.yaml"

    def _bootstrap(self) -> None:
        """What a controller-manager or an operator would have created, through the API as admin."""
        self.request("POST", "/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": "default"}})
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": EXTENDER_NAMESPACE}})
        self.request(
            "POST", f"/api/v1/namespaces/{EXTENDER_NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}}
        )
        self.grant(
            EXTENDER_USER,
            EXTENDER_RULES,
            {
                EXTENDER_NAMESPACE: LEASE_RULES,
                "kube-system": UNHEALTHY_RULES,  # gpushare's unhealthy-gpu-<node> ConfigMaps
            },
        )

    def grant(
        self, name: str, cluster_rules: list[dict[str, Any]], namespaced: dict[str, list[dict[str, Any]]]
    ) -> list[str]:
        """Give the extender user `cluster_rules` cluster-wide and, in each namespace of `namespaced`, its rules:
        roles and bindings named `name`. Returns their paths, the bindings first (the order to delete them in)."""
        subject = [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": EXTENDER_USER}]
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
        self.request("POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": cluster_rules})
        self.request(
            "POST",
            f"{RBAC}/clusterrolebindings",
            {"metadata": {"name": name}, "roleRef": role_ref, "subjects": subject},
        )
        created = [f"{RBAC}/clusterrolebindings/{name}", f"{RBAC}/clusterroles/{name}"]
        for namespace, rules in namespaced.items():
            roles = f"{RBAC}/namespaces/{namespace}"
            self.request("POST", f"{roles}/roles", {"metadata": {"name": name}, "rules": rules})
            self.request(
                "POST",
                f"{roles}/rolebindings",
                {"metadata": {"name": name}, "roleRef": role_ref | {"kind": "Role"}, "subjects": subject},
            )
            created[:0] = [f"{roles}/rolebindings/{name}", f"{roles}/roles/{name}"]
        return created

    # ---- kube-scheduler --------------------------------------------------------------------------------

    def start_scheduler(self, config_yaml: str) -> subprocess.Popen[bytes]:
        """Run kube-scheduler with this KubeSchedulerConfiguration (its clientConnection.kubeconfig set to the
        scheduler user's, leader election off) and wait until its /readyz passes (informers synced)."""
        number = next(self._numbers)
        config = yaml.safe_load(config_yaml) or {}
        config.setdefault("clientConnection", {})["kubeconfig"] = str(self.kubeconfig("scheduler"))
        config.setdefault("leaderElection", {})["leaderElect"] = False
        config_file = self.workdir / f"kube-scheduler-{number}.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        argv = [
            str(self.binaries / "kube-scheduler"),
            f"--config={config_file}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "-v=2",
        ]
        process = _spawn(f"kube-scheduler #{number}", argv, self.workdir / f"kube-scheduler-{number}.log")
        self.schedulers.append(process)
        self._scheduler_logs[process.popen.pid] = process.log
        # Its serving certificate is self-signed in memory: nothing to verify it against.
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        try:
            _wait_until(
                process, lambda: self._get_ok(f"https://127.0.0.1:{port}/readyz", None, unverified), "ready (/readyz)"
            )
        except BaseException:
            self.stop_scheduler(process.popen)
            raise
        return process.popen

    def stop_scheduler(self, popen: subprocess.Popen[bytes] | None = None) -> None:
        """Stop this scheduler, or all of them; their logs stay."""
        for process in list(self.schedulers):
            if popen is None or process.popen is popen:
                process.stop()
                self.schedulers.remove(process)

    def scheduler_log(self, popen: subprocess.Popen[bytes]) -> str:
        """The log of this scheduler, running or stopped, for assertions and failure messages."""
        return self._scheduler_logs[popen.pid].read_text(errors="replace")

    # ---- HTTP ------------------------------------------------------------------------------------------

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """Verifies the API server's certificate against the CA made by `start()`."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    def _headers(self, user: str | None, body: Any, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if user is not None:
            headers["Authorization"] = f"Bearer {self.users[user].token}"
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        return headers

    def _get_ok(self, url: str, user: str | None, context: ssl.SSLContext | None = None) -> bool:
        request = urllib.request.Request(url, headers=self._headers(user, None, None))
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def namespace_now(self, name: str) -> None:
        """A namespace and its `default` ServiceAccount (which pods need and no controller-manager makes here),
        blocking, for module fixtures; kept if they exist (namespaces are never deleted: no controller finishes
        them)."""
        for path, body in (
            ("/api/v1/namespaces", {"metadata": {"name": name}}),
            (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}),
        ):
            try:
                self.request("POST", path, body)
            except ApiError as error:
                if error.status != 409:
                    raise

    def request(self, method: str, path: str, body: Any = None, user: str = "admin") -> dict[str, Any]:
        """A blocking API call (for fixtures, outside any event loop); raises `ApiError` on non-2xx."""
        data = orjson.dumps(body) if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=self._headers(user, body, None)
        )
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.ssl_context) as answer:
                return dict(orjson.loads(answer.read() or b"{}"))
        except urllib.error.HTTPError as error:
            raise ApiError(method, path, error.code, error.read()) from None

    @contextlib.asynccontextmanager
    async def _session(self, timeout: float | None = 30.0) -> AsyncIterator[aiohttp.ClientSession]:
        # A session per call: the fixture outlives each test's event loop, a session cannot.
        connector = aiohttp.TCPConnector(ssl=self.ssl_context)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            yield session

    async def api(
        self, method: str, path: str, body: Any = None, user: str = "admin", *, content_type: str | None = None
    ) -> dict[str, Any]:
        """Call the API as `user` ("admin", "scheduler", "extender") and return the decoded answer; raises
        `ApiError` (with the Status message) on non-2xx. PATCH bodies are JSON merge patches unless told."""
        if method == "PATCH" and content_type is None:
            content_type = "application/merge-patch+json"
        data = orjson.dumps(body) if body is not None else None
        async with (
            self._session() as session,
            session.request(
                method, self.url + path, data=data, headers=self._headers(user, body, content_type)
            ) as answer,
        ):
            raw = await answer.read()
            if answer.status >= 300:
                raise ApiError(method, path, answer.status, raw)
            return dict(orjson.loads(raw or b"{}"))

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, user: str = "admin", timeout: float | None = 30.0
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open a watch (`path` with its query, e.g. "/api/v1/pods?watch=1&resourceVersion=5") and yield its
        events, `{"type": ..., "object": ...}`, as they come; closed when the block ends, or after `timeout`
        seconds in all (None: never)."""

        async def events(answer: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
            async for line in answer.content:
                if line.strip():
                    yield orjson.loads(line)

        async with (
            self._session(timeout=timeout) as session,
            session.get(self.url + path, headers=self._headers(user, None, None)) as answer,
        ):
            if answer.status >= 300:
                raise ApiError("GET", path, answer.status, await answer.read())
            yield events(answer)

    # ---- objects ---------------------------------------------------------------------------------------

    async def create_node(
        self,
        name: str,
        gpus: int = 2,
        gpu_mem: int = 16,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Ready, untainted Node with `gpus` GPUs of `gpu_mem` units each (see `node_manifest`)."""
        return await self.api("POST", "/api/v1/nodes", node_manifest(name, gpus, gpu_mem, labels, annotations))

    def create_node_now(
        self,
        name: str,
        gpus: int = 2,
        gpu_mem: int = 16,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """`create_node`, blocking: for module- or session-scoped fixtures, outside any event loop."""
        return self.request("POST", "/api/v1/nodes", node_manifest(name, gpus, gpu_mem, labels, annotations))

    async def create_pod(
        self,
        name: str,
        gpu_mem: int | None = None,
        namespace: str = "default",
        scheduler_name: str = "default-scheduler",
        gpus: int | None = None,
        labels: Mapping[str, str] | None = None,
        priority_class: str | None = None,
    ) -> dict[str, Any]:
        """A Pod with one container asking `gpu_mem` units of aliyun.com/gpu-mem (and `gpus` of gpu-count) in
        its limits; a plain pod, asking only a little cpu, when both are None. `priority_class`: its
        priorityClassName (the Priority admission plugin turns it into spec.priority)."""
        limits: dict[str, str] = {}
        if gpu_mem is not None:
            limits[GPU_MEM] = str(gpu_mem)
        if gpus is not None:
            limits[GPU_COUNT] = str(gpus)
        container = {
            "name": "main",
            "image": "registry.example/none:latest",
            "resources": {"limits": limits, "requests": {"cpu": "10m"}},
        }
        spec: dict[str, Any] = {
            "schedulerName": scheduler_name,
            "containers": [container],
            "terminationGracePeriodSeconds": 0,
        }
        if priority_class is not None:
            spec["priorityClassName"] = priority_class
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": spec,
        }
        return await self.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    async def list_pods(self, namespace: str | None = None, user: str = "admin") -> dict[str, Any]:
        """The PodList (all namespaces unless one is given), with its metadata.resourceVersion."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return await self.api("GET", path, user=user)

    async def delete(self, path: str, user: str = "admin") -> dict[str, Any]:
        """Delete the object at `path` (e.g. "/api/v1/namespaces/default/pods/p1") at once: grace period 0,
        since no kubelet would ever confirm a graceful pod deletion."""
        return await self.api("DELETE", path, {"gracePeriodSeconds": 0}, user=user)
