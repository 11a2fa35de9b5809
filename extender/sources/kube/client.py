"""Our Kubernetes API client: JSON requests and line-by-line watches over one aiohttp session, with credentials
that rotate (token files, exec plugins) and errors that are ours.

Why our own and not kubernetes_asyncio: its generated models decode a 5,000-pod list about 30 times slower than
orjson into dicts, and none of the Python clients does list/watch/relist-on-410 right by itself, so the informer
would wrap one anyway. What the extender needs from a client is this module; objects stay plain dicts.

Failures are never aiohttp's exceptions: an `ApiError` subclass built from the API's Status body (callers match
on the class and `reason`, never on message text), `ConnectionFailed` for the network and TLS, `WatchStalled`
for a silent watch. It retries nothing but a 401, once, with fresh credentials (tokens rotate, as lightkube and
client-go know); other retries, and relisting after 410, are the caller's policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import ssl
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from extender.sources.kube.config import ConfigError, ExecConfig, KubeConfig

TOKEN_FILE_MAX_AGE = 60.0
"""Seconds a token read from a file is used before the file is read again (client-go's figure)."""
EXEC_TIMEOUT = 30.0
"""Seconds an exec plugin may take to print its credential."""
EXEC_EXPIRY_MARGIN = 10.0
"""An exec credential is renewed this many seconds before its expirationTimestamp."""


class KubeError(Exception):
    """Talking to the API server failed; the message names the method, the path and why."""


class ApiError(KubeError):
    """The API server answered with an error status; built from its Status body when it sent one."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        method: str,
        path: str,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        self.retry_after = retry_after
        self.details: dict[str, Any] = details or {}


class Unauthorized(ApiError):
    """401: the credentials were refused (even after one refresh)."""


class Forbidden(ApiError):
    """403: authenticated, but RBAC does not allow it."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: reason Conflict (stale resourceVersion) or AlreadyExists."""


class Gone(ApiError):
    """410 Expired: the resourceVersion (or continue token) is older than the server keeps; relist."""


class Invalid(ApiError):
    """422: the object was refused by validation; `details.causes` says which fields."""


class Throttled(ApiError):
    """429: too many requests (API priority and fairness); wait `retry_after` seconds."""


class ServerError(ApiError):
    """5xx."""


_ERROR_CLASSES: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Throttled,
}


class ConnectionFailed(KubeError):
    """No answer: the network, TLS, a refused connection or a timeout (the message says which)."""


class WatchStalled(KubeError):
    """A watch stream sent no bytes for its `inactivity` seconds (on a quiet resource that is normal: the informer
    opens the watch again)."""


def pod_path(namespace: str, name: str) -> str:
    """The API path of one pod (its name and namespace quoted: they come from requests)."""
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def api_error(status: int, body: bytes, method: str, path: str, retry_after: str | None = None) -> ApiError:
    try:
        decoded = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        decoded = None
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    reason, message, details = phrase, body[:200].decode(errors="replace"), dict[str, Any]()
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        reason, message = str(decoded.get("reason") or phrase), str(decoded.get("message") or "")
        details = decoded["details"] if isinstance(decoded.get("details"), dict) else {}
    seconds: float | None = None
    with contextlib.suppress(TypeError, ValueError):
        seconds = float(retry_after if retry_after is not None else details.get("retryAfterSeconds", ""))
    kind = _ERROR_CLASSES.get(status) or (ServerError if status >= 500 else ApiError)
    return kind(status, reason, message, method=method, path=path, retry_after=seconds, details=details)


@dataclass(frozen=True, slots=True)
class _Credentials:
    token: str = ""
    cert: bytes = b""
    """PEM from an exec plugin (a static certificate is in the config)."""
    key: bytes = b""
    read_at: float = 0.0
    """Monotonic time a token file was read."""
    expires: float = math.inf
    """Unix time an exec credential expires."""


async def _run_exec(plugin: ExecConfig) -> _Credentials:
    info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": orjson.dumps(info).decode()}
    name = f"exec plugin {plugin.command}"
    try:
        process = await asyncio.create_subprocess_exec(
            plugin.command,
            *plugin.args,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:
        raise KubeError(f"{name}: cannot run it: {error.strerror or error}") from None
    try:
        async with asyncio.timeout(EXEC_TIMEOUT):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        raise KubeError(f"{name}: no credential after {EXEC_TIMEOUT:g} s") from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    said = (stderr.decode(errors="replace").strip().splitlines() or ["nothing on stderr"])[-1]
    if process.returncode != 0:
        raise KubeError(f"{name} exited with status {process.returncode}: {said}")
    try:
        answer = orjson.loads(stdout)
    except orjson.JSONDecodeError:
        answer = None
    status = answer.get("status") if isinstance(answer, dict) else None
    if not isinstance(status, dict):
        raise KubeError(f"{name}: did not print an ExecCredential with a status (stderr: {said})")
    token, cert, key = (status.get(field) or "" for field in ("token", "clientCertificateData", "clientKeyData"))
    if not all(isinstance(value, str) for value in (token, cert, key)) or not (token or (cert and key)):
        raise KubeError(f"{name}: its ExecCredential has neither a token nor a client certificate and key")
    expires, stamp = math.inf, status.get("expirationTimestamp")
    if stamp:
        try:
            expires = datetime.fromisoformat(stamp).timestamp()
        except (TypeError, ValueError):
            raise KubeError(f"{name}: expirationTimestamp {stamp!r} is not an RFC 3339 time") from None
    return _Credentials(token=token, cert=cert.encode(), key=key.encode(), expires=expires)


def _ssl_context(config: KubeConfig, cert: bytes, key: bytes) -> ssl.SSLContext:
    """The server's CA (the system's when none is given) and our client certificate, if any. PEM data is loaded
    through a private temporary directory removed at once: `load_cert_chain` reads only files."""
    if config.insecure_skip_tls_verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        ca = "certificate-authority-data" if config.ca_data else config.ca_file or "the system's CAs"
        try:
            context = ssl.create_default_context(
                cafile=None if config.ca_data else config.ca_file or None,
                cadata=config.ca_data.decode(errors="replace") if config.ca_data else None,
            )
        except (ssl.SSLError, OSError) as error:
            raise ConfigError(f"{config.source}: cannot use {ca}: {error}") from None
    cert, key = (cert, key) if cert else (config.client_cert_data, config.client_key_data)
    try:
        if cert:
            with tempfile.TemporaryDirectory(prefix="kube-client-") as folder:
                for name, data in (("cert.pem", cert), ("key.pem", key)):
                    with os.fdopen(os.open(Path(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                        f.write(data)
                context.load_cert_chain(Path(folder, "cert.pem"), Path(folder, "key.pem"))
        elif config.client_cert_file:
            context.load_cert_chain(config.client_cert_file, config.client_key_file or None)
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(f"{config.source}: cannot use the client certificate: {error}") from None
    return context


@dataclass(slots=True, eq=False)
class _Transport:
    """One aiohttp session and the client certificate it presents. Mutable: when the certificate changes it is
    retired, and closed once its last request (a watch, perhaps) ends."""

    session: aiohttp.ClientSession
    cert: bytes
    users: int = 0


class KubeClient:
    """The client of one API server. Mutable: its credentials and sessions change as they rotate. Its session is
    made inside the running loop at the first request; close it (or use `async with`)."""

    def __init__(self, config: KubeConfig, *, timeout: float = 10.0, user_agent: str = "gpu-extender") -> None:
        self.config = config
        self._timeout = timeout
        self._user_agent = user_agent
        self._credentials: _Credentials | None = None
        self._transport: _Transport | None = None
        self._retired: list[_Transport] = []
        self._lock = asyncio.Lock()
        self._closed = False

    def twin(self) -> KubeClient:
        """A client of the same server, with the same configuration and timeout, for use on another event loop
        (its session and credentials are its own)."""
        return KubeClient(self.config, timeout=self._timeout, user_agent=self._user_agent)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        transports, self._transport, self._retired = [*self._retired, self._transport], None, []
        for transport in transports:
            if transport is not None:
                await transport.session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """The decoded JSON of a 2xx answer (None when empty)."""
        data = None if body is None else orjson.dumps(body)
        async with self._open(method, path, params, data, content_type, timeout or self._timeout) as response:
            payload = await response.read()
        try:
            return orjson.loads(payload) if payload else None
        except orjson.JSONDecodeError:
            raise KubeError(f"{method} {path}: the answer is not JSON: {payload[:200]!r}") from None

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: Any) -> Any:
        return await self.request("PUT", path, body=body)

    async def merge_patch(self, path: str, body: Any) -> Any:
        return await self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    async def delete(self, path: str) -> Any:
        return await self.request("DELETE", path)

    async def watch(
        self, path: str, params: Mapping[str, str], *, inactivity: float
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Each event of `GET path?watch=1&params`, one JSON line of any length each, until the server ends the
        stream. Only connecting is bounded by the client's timeout; then `inactivity` seconds without a byte
        raise WatchStalled. Close the generator (or leave its loop) to release the connection."""
        async with self._open("GET", path, {"watch": "1", **params}, None, "", None) as response:
            pending = bytearray()
            while True:
                try:
                    async with asyncio.timeout(inactivity):
                        chunk = await response.content.readany()
                except TimeoutError:
                    raise WatchStalled(f"GET {path}: watch stalled: no bytes for {inactivity:g} s") from None
                if not chunk:
                    break
                pending += chunk
                if b"\n" in chunk:
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _event(line, path)
            if pending.strip():
                yield _event(pending, path)

    @contextlib.asynccontextmanager
    async def _open(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        data: bytes | None,
        content_type: str,
        total: float | None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request and yield its 2xx response; `total` None is a stream, bounded only until its headers.
        A 401 is retried once with fresh credentials when they can be refreshed; any other non-2xx raises its
        ApiError; aiohttp's errors, in here or in the caller's block, become ConnectionFailed."""
        stale: _Credentials | None = None
        url, limit = self.config.server + path, aiohttp.ClientTimeout(total=total)
        for attempt in (1, 2):
            credentials, transport = await self._acquire(stale)
            headers = {"Authorization": f"Bearer {credentials.token}"} if credentials.token else {}
            if data is not None:
                headers["Content-Type"] = content_type
            try:
                with self._translated(method, path, total or self._timeout):
                    async with asyncio.timeout(total or self._timeout):
                        response = await transport.session.request(
                            method, url, params=params, data=data, headers=headers, timeout=limit
                        )
                    try:
                        if not 200 <= response.status < 300:
                            body = await response.read()
                            if response.status == 401 and attempt == 1 and self._refreshable:
                                stale = credentials
                                continue
                            raise api_error(response.status, body, method, path, response.headers.get("Retry-After"))
                        yield response
                        return
                    finally:
                        response.release()
            finally:
                await self._release(transport)

    @contextlib.contextmanager
    def _translated(self, method: str, path: str, seconds: float) -> Iterator[None]:
        where, server = f"{method} {path}", self.config.server
        try:
            yield
        except TimeoutError:
            raise ConnectionFailed(f"{where}: timed out after {seconds:g} s") from None
        except aiohttp.ClientConnectorCertificateError as error:
            raise ConnectionFailed(f"{where}: TLS handshake with {server} failed: {error.certificate_error}") from None
        except aiohttp.ClientConnectorError as error:
            cause = error.os_error
            why = os.strerror(cause.errno) if cause.errno and not isinstance(cause, ssl.SSLError) else str(cause)
            raise ConnectionFailed(f"{where}: cannot connect to {server}: {why}") from None
        except aiohttp.ServerDisconnectedError:
            raise ConnectionFailed(f"{where}: {server} closed the connection") from None
        except aiohttp.ClientPayloadError as error:
            raise ConnectionFailed(f"{where}: the answer was cut short: {error}") from None
        except (aiohttp.ClientError, OSError) as error:
            raise ConnectionFailed(f"{where}: {type(error).__name__}: {error}") from None

    @property
    def _uses_exec(self) -> bool:
        config = self.config
        static = config.token or config.token_file or config.client_cert_file or config.client_cert_data
        return config.exec is not None and not static

    @property
    def _refreshable(self) -> bool:
        return bool(self.config.token_file) or self._uses_exec

    async def _acquire(self, stale: _Credentials | None) -> tuple[_Credentials, _Transport]:
        """The credentials to send and the session that presents their certificate. Credentials are fetched at
        first use, when due, and when `stale` (refused) ones are still current: a refusal seen by many requests
        at once refreshes them once. A session whose certificate changed is retired."""
        if self._closed:
            raise KubeError(f"{self.config.source}: the client is closed")
        async with self._lock:
            credentials = self._credentials
            if credentials is None or credentials is stale or self._due(credentials):
                credentials = self._credentials = await self._fetch()
            transport = self._transport
            if transport is None or transport.cert != credentials.cert:
                if transport is not None:
                    self._retired.append(transport)
                transport = self._transport = self._new_transport(credentials)
            transport.users += 1
        await self._close_idle()
        return credentials, transport

    def _due(self, credentials: _Credentials) -> bool:
        if self.config.token_file:
            return time.monotonic() - credentials.read_at >= TOKEN_FILE_MAX_AGE
        return time.time() >= credentials.expires - EXEC_EXPIRY_MARGIN

    async def _fetch(self) -> _Credentials:
        config = self.config
        if config.token_file:
            try:
                token = Path(config.token_file).read_text().strip()
            except OSError as error:
                raise KubeError(f"{config.source}: cannot read token file {config.token_file}: {error}") from None
            return _Credentials(token=token, read_at=time.monotonic())
        if config.exec is not None and self._uses_exec:
            return await _run_exec(config.exec)
        return _Credentials(token=config.token)

    def _new_transport(self, credentials: _Credentials) -> _Transport:
        secure = self.config.server.startswith("https:")
        context = _ssl_context(self.config, credentials.cert, credentials.key) if secure else None
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context or True),
            headers={"Accept": "application/json", "User-Agent": self._user_agent},
        )
        return _Transport(session, credentials.cert)

    async def _release(self, transport: _Transport) -> None:
        transport.users -= 1
        await self._close_idle()

    async def _close_idle(self) -> None:
        idle = [transport for transport in self._retired if transport.users == 0]
        self._retired = [transport for transport in self._retired if transport.users]
        for transport in idle:
            await transport.session.close()


def _event(line: bytes | bytearray, path: str) -> dict[str, Any]:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise KubeError(f"GET {path}: a watch event is not JSON ({error}): {bytes(line[:200])!r}") from None
    if not isinstance(event, dict) or "type" not in event:
        raise KubeError(f"GET {path}: a watch line is not an event: {bytes(line[:200])!r}")
    return event
