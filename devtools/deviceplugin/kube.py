"""The API server, as the device-plugin doubles reach it: a kubeconfig (bearer token, CA file) and aiohttp.

The doubles run on the node's host, not in a pod, so they are given a kubeconfig on the command line, as the
gpushare plugin's DaemonSet gives it kubelet's (`KUBECONFIG=/etc/kubernetes/kubelet.conf`). This reads the
kubeconfig's current context (server; `certificate-authority` file or `-data`; `token` or `tokenFile`; a client
certificate when there is one) and makes JSON calls that raise `ApiError`, built from the Status body, on a non-2xx
answer. It must never import `extender`: the doubles check the extender against an independent reading.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer of the API server, built from its Status body (the e2e tier's client raises it too)."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError:
            decoded = {}
        self.status = status
        self.status_body: Obj = decoded if isinstance(decoded, dict) else {}
        self.reason: str = str(self.status_body.get("reason", ""))
        self.message: str = str(self.status_body.get("message") or body.decode(errors="replace")[:500])
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")


@dataclass(frozen=True, slots=True)
class Kubeconfig:
    server: str
    token: str
    ssl_context: ssl.SSLContext


def _section(config: Obj, kind: str, name: str) -> Obj:
    for entry in config.get(f"{kind}s") or []:
        if entry.get("name") == name:
            return dict(entry.get(kind) or {})
    raise ValueError(f"kubeconfig: no {kind} {name!r}")


def load_kubeconfig(path: Path) -> Kubeconfig:
    """The current context's server, token and TLS trust; relative file names are read beside the kubeconfig."""
    config = yaml.safe_load(path.read_text()) or {}
    contexts = config.get("contexts") or []
    current = config.get("current-context") or (contexts[0]["name"] if contexts else "")
    context = _section(config, "context", current) if contexts else {}
    clusters, users = config.get("clusters") or [], config.get("users") or []
    cluster = _section(config, "cluster", context["cluster"]) if context else dict(clusters[0]["cluster"])
    user = _section(config, "user", context["user"]) if context else dict((users[0] if users else {}).get("user", {}))

    def local(name: str) -> Path:
        file = Path(name)
        return file if file.is_absolute() else path.parent / file

    ssl_context = ssl.create_default_context()
    if cluster.get("certificate-authority"):
        ssl_context.load_verify_locations(cafile=str(local(cluster["certificate-authority"])))
    elif cluster.get("certificate-authority-data"):
        ssl_context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    if user.get("client-certificate") and user.get("client-key"):
        ssl_context.load_cert_chain(str(local(user["client-certificate"])), str(local(user["client-key"])))
    token = str(user.get("token") or "")
    if not token and user.get("tokenFile"):
        token = local(user["tokenFile"]).read_text().strip()
    return Kubeconfig(str(cluster["server"]).rstrip("/"), token, ssl_context)


class KubeApi:
    """JSON calls to one API server. Open it with `async with KubeApi.session(config) as api`."""

    def __init__(self, config: Kubeconfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self._session = session

    @classmethod
    @asynccontextmanager
    async def session(cls, config: Kubeconfig) -> AsyncIterator[KubeApi]:
        connector = aiohttp.TCPConnector(ssl=config.ssl_context)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield cls(config, session)

    async def call(self, method: str, path: str, body: Obj | None = None, content_type: str | None = None) -> Obj:
        """`method` on `path`; a PATCH body is a JSON merge patch unless `content_type` says otherwise."""
        headers = {"Accept": "application/json"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        if body is not None:
            headers["Content-Type"] = content_type or (MERGE_PATCH if method == "PATCH" else "application/json")
        data = orjson.dumps(body) if body is not None else None
        async with self._session.request(method, self.config.server + path, data=data, headers=headers) as answer:
            raw = await answer.read()
            if answer.status >= 300:
                raise ApiError(method, path, answer.status, raw)
            return dict(orjson.loads(raw or b"{}"))
